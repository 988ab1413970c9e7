"""What the benchmark sends: request classes with open-loop Poisson arrivals. Pure.

* ``seed``: the source article's test: four fixed prompts, ``max_tokens`` drawn from
  {64, 128, 256}; one class per ``max_tokens`` (``short``, ``medium``, ``long``).
* ``mixed``: short chat requests (a short prompt, 64 tokens out) and long ones
  (a ~2,000-token prompt, 512 out) at a given share of the total rate.
* ``overhead``: the shape of vLLM's ``bench serve`` random dataset as issue 12
  measured the gateway with: 100 prompts of 64 tokens, 32 out, 4 req/s (Poisson),
  all one class: what tailguard adds to a request over the engine alone.
* ``overload``: the mixed load on one timeline of three windows, ``reference``
  (the usual load), ``burst`` (short requests at ``factor`` times the short
  lane's capacity, measured in the same run) and ``recovery`` (the usual load
  again): what admission refuses, and what the accepted requests get. The
  burst's extra short requests come from a stream of their own, so the usual
  short arrivals are the same as without the burst.
* ``burst``: short requests at a steady rate (evenly spaced), and a burst of long
  prompts that all land at one instant: the pathology where one prefill burst
  blocks every short request's first token.
* ``shift``: the mixed load whose mix moves, on one timeline of windows of equal
  length, each with its own long share of the same total rate: by default
  short-heavy, long-heavy, short-heavy again (what lanes that follow the load must
  follow; a static partition is sized for one mix only). The report gives each
  window's figures (`split_shift`).
* ``batch``: the mixed load twice, without and then with a Batch API batch of short
  completion lines running beside it (``batch_load``): what offline work on the batch lane
  costs the interactive tail, and how much of the idle capacity it fills.
* ``azure-conv``, ``azure-code``, ``azure-mix``: the Azure LLM inference traces
  2023 (``azure_trace``), their lengths scaled and arrivals stretched to the host,
  classes by the lanes file's own rule.
* ``chat``, ``shared-doc``: requests that share prefixes (conversations resent turn after
  turn, questions over a few documents), in ``sessions``.
* a JSONL trace: one request per line, ``{"prompt", "max_tokens", "class"?,
  "arrival_s"?, "ignore_eos"?}``; without ``arrival_s`` the lines are sent in
  order (cycling) at Poisson arrivals of the given rate.

Every class has its own random stream, so the short requests of a run are the
same, at the same instants, with and without long traffic and in every topology:
the comparisons are paired.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tailguard.plan.synthetic import SEED_PROMPTS, class_stream, long_prompt, poisson_arrivals

SHORT, MEDIUM, LONG = "short", "medium", "long"

SEED_MAX_TOKENS = {SHORT: 64, MEDIUM: 128, LONG: 256}


@dataclass(frozen=True)
class BenchRequest:
    cls: str
    prompt: str
    max_tokens: int
    arrival_s: float  # offset from the start of the phase
    ignore_eos: bool = True  # fixed output lengths, as benchmarks need
    prompt_tokens: int | None = None  # the prompt's length in the served tokenizer, when built for one
    #: chat: its session and turn (tailguard/bench/sessions.py); shared-doc: its document
    session: int | None = None
    turn: int = 0


@dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[BenchRequest, ...]  # sorted by arrival
    short_class: str | None = SHORT  # the class whose tail latency the product protects
    long_class: str | None = LONG  # the class that hurts it
    params: dict[str, Any] = field(default_factory=dict)
    #: chat: the sessions its requests are the turns of (tailguard/bench/sessions.py), sent
    #: turn after turn as the answers arrive instead of at the requests' arrival times
    sessions: tuple[Any, ...] = ()

    @property
    def classes(self) -> list[str]:
        """Class names, the short one first, the long one last, others by first arrival."""
        seen = list(dict.fromkeys(r.cls for r in self.requests))
        head = [c for c in (self.short_class,) if c in seen]
        tail = [c for c in (self.long_class,) if c in seen and c not in head]
        return head + [c for c in seen if c not in head + tail] + tail

    def only(self, classes: Iterable[str]) -> Workload:
        keep = set(classes)
        return replace(self, requests=tuple(r for r in self.requests if r.cls in keep))

    def counts(self) -> dict[str, int]:
        return {c: sum(1 for r in self.requests if r.cls == c) for c in self.classes}


def finish(name: str, requests: list[BenchRequest], max_requests: int | None,
           **kw: Any) -> Workload:
    """The workload of `requests` sorted by arrival, the first `max_requests` of them."""
    requests.sort(key=lambda r: (r.arrival_s, r.cls))
    if max_requests is not None:
        requests = requests[:max_requests]
    return Workload(name=name, requests=tuple(requests), **kw)


def seed_workload(rate: float, duration_s: float, seed: int = 0,
                  max_requests: int | None = None) -> Workload:
    """The article's four prompts at `rate` req/s in total, max_tokens uniform in {64,128,256}."""
    requests = []
    for cls, max_tokens in SEED_MAX_TOKENS.items():
        rng = class_stream(seed, cls)
        for t in poisson_arrivals(rate / len(SEED_MAX_TOKENS), duration_s, rng):
            requests.append(BenchRequest(cls, rng.choice(SEED_PROMPTS), max_tokens, t))
    return finish("seed", requests, max_requests,
                   params={"rate": rate, "duration_s": duration_s, "seed": seed,
                           "max_tokens": dict(SEED_MAX_TOKENS)})


def mixed_workload(rate: float, long_share: float, duration_s: float, seed: int = 0, *,
                   short_tokens: int = 64, long_prompt_tokens: int = 2000, long_tokens: int = 512,
                   count_tokens: Callable[[str], int] | None = None,
                   max_requests: int | None = None) -> Workload:
    """Short chat requests and long ones; `long_share` of `rate` (req/s in total) is long."""
    if not 0 <= long_share <= 1:
        raise ValueError("long_share must be within [0, 1]")
    requests = []
    rng = class_stream(seed, SHORT)
    for t in poisson_arrivals(rate * (1 - long_share), duration_s, rng):
        requests.append(BenchRequest(SHORT, rng.choice(SEED_PROMPTS), short_tokens, t))
    rng = class_stream(seed, LONG)
    for t in poisson_arrivals(rate * long_share, duration_s, rng):
        requests.append(BenchRequest(LONG, long_prompt(long_prompt_tokens, rng, count_tokens),
                                     long_tokens, t))
    return finish("mixed", requests, max_requests,
                   params={"rate": rate, "long_share": long_share, "duration_s": duration_s,
                           "seed": seed, "short_rate": rate * (1 - long_share),
                           "long_rate": rate * long_share, "short_tokens": short_tokens,
                           "long_prompt_tokens": long_prompt_tokens, "long_tokens": long_tokens})


BATCH = "batch"
#: The batch workload's second phase: the same interactive requests with the batch beside them.
WITH_BATCH = "with_batch"


def batch_workload(rate: float, long_share: float, duration_s: float, seed: int = 0, *,
                   lines: int, line_tokens: int, **mixed: Any) -> Workload:
    """The mixed load (`mixed_workload`'s arguments), to be sent twice: alone, then beside a
    batch of at least `lines` completion lines of `line_tokens` output tokens each."""
    if lines < 1 or line_tokens < 1:
        raise ValueError("batch: --batch-lines and --batch-tokens must be >= 1")
    wl = mixed_workload(rate, long_share, duration_s, seed, **mixed)
    return replace(wl, name=BATCH, params={
        **wl.params, "batch_lines": lines, "batch_line_tokens": line_tokens,
        "described": f"batch: the mixed load ({rate:g} req/s, {long_share:.0%} long) for "
                     f"{duration_s:g} s without, then with, a batch of >= {lines} lines of "
                     f"{line_tokens} output tokens"})


BURST = "burst"


def burst_workload(rate: float, duration_s: float, *, burst_size: int,
                   burst_at_s: float | None = None, seed: int = 0, short_tokens: int = 64,
                   long_prompt_tokens: int = 2000, long_tokens: int = 512,
                   count_tokens: Callable[[str], int] | None = None,
                   max_requests: int | None = None) -> Workload:
    """Short requests every 1/`rate` s for `duration_s`, and `burst_size` long requests that
    all arrive at `burst_at_s` (default: a third of the way in), each with a prompt of its
    own (no shared prefix: their prefill is all real work)."""
    if rate <= 0 or duration_s <= 0 or burst_size < 0:
        raise ValueError("burst: --rate and --duration must be > 0 and --burst-size >= 0")
    at = duration_s / 3 if burst_at_s is None else burst_at_s
    if not 0 <= at < duration_s:
        raise ValueError(f"burst: --burst-at {at:g} s must be within the {duration_s:g} s of arrivals")
    rng = class_stream(seed, SHORT)
    requests = [BenchRequest(SHORT, rng.choice(SEED_PROMPTS), short_tokens, (i + 0.5) / rate)
                for i in range(round(rate * duration_s))]
    rng = class_stream(seed, LONG)
    requests += [BenchRequest(LONG, long_prompt(long_prompt_tokens, rng, count_tokens),
                              long_tokens, at) for _ in range(burst_size)]
    return finish(BURST, requests, max_requests,
                   params={"rate": rate, "duration_s": duration_s, "seed": seed,
                           "short_rate": rate, "short_tokens": short_tokens,
                           "burst_size": burst_size, "burst_at_s": at,
                           "long_prompt_tokens": long_prompt_tokens, "long_tokens": long_tokens,
                           "described": f"burst: short requests ({short_tokens} tokens out) every "
                                        f"{1 / rate:.3g} s for {duration_s:g} s; {burst_size} long "
                                        f"ones (~{long_prompt_tokens}-token prompts, "
                                        f"{long_tokens} out) all at {at:g} s"})


#: vLLM `bench serve --dataset-name random` as issue 12 ran it: input/output tokens, rate, prompts.
OVERHEAD_SHAPE = {"input_tokens": 64, "output_tokens": 32, "rate": 4.0, "prompts": 100}


def overhead_workload(seed: int = 0, count_tokens: Callable[[str], int] | None = None, *,
                      input_tokens: int = OVERHEAD_SHAPE["input_tokens"],
                      output_tokens: int = OVERHEAD_SHAPE["output_tokens"],
                      rate: float = OVERHEAD_SHAPE["rate"],
                      prompts: int = OVERHEAD_SHAPE["prompts"]) -> Workload:
    """`prompts` random prompts of `input_tokens` at Poisson `rate`, each `output_tokens` out.
    vLLM's random dataset draws token ids; ours are random words of the same length, each
    prompt a fresh draw, so neither gets help from the prefix cache."""
    rng = class_stream(seed, "overhead")
    times = poisson_arrivals(rate, float("inf"), rng, max_count=prompts)
    requests = [BenchRequest(SHORT, long_prompt(input_tokens, rng, count_tokens), output_tokens, t)
                for t in times]
    return finish("overhead", requests, None, long_class=None,
                   params={"rate": rate, "duration_s": times[-1] if times else 0.0, "seed": seed,
                           "input_tokens": input_tokens, "output_tokens": output_tokens,
                           "prompts": prompts})


OVERLOAD = "overload"
#: The overload timeline's windows, in order.
WINDOWS = ("reference", "burst", "recovery")


def overload_workload(rate: float, long_share: float, *, reference_s: float, burst_s: float,
                      recovery_s: float, factor: float = 3.0, seed: int = 0,
                      **mixed: Any) -> Workload:
    """The mixed load (`mixed_workload`'s keywords) over the whole timeline, without the burst's
    extra requests yet: they depend on a capacity measured once the system is up (`add_burst`)."""
    if min(reference_s, burst_s, recovery_s) <= 0 or factor <= 0:
        raise ValueError("the overload windows and factor must be > 0")
    base = mixed_workload(rate, long_share, reference_s + burst_s + recovery_s, seed, **mixed)
    return replace(base, name=OVERLOAD, params={
        **base.params, "factor": factor, "reference_s": reference_s, "burst_s": burst_s,
        "recovery_s": recovery_s, "burst_start_s": reference_s,
        "burst_end_s": reference_s + burst_s})


def add_burst(workload: Workload, capacity_rps: float) -> Workload:
    """`workload` plus short requests in the burst window, so that the short class arrives at
    `factor` x `capacity_rps` there (the usual short arrivals stay as they are)."""
    p = workload.params
    extra = max(0.0, p["factor"] * capacity_rps - p["short_rate"])
    rng = class_stream(p["seed"], "burst")
    burst = [BenchRequest(SHORT, rng.choice(SEED_PROMPTS), p["short_tokens"],
                          p["burst_start_s"] + t)
             for t in poisson_arrivals(extra, p["burst_s"], rng)]
    return finish(workload.name, list(workload.requests) + burst, None,
                   short_class=workload.short_class, long_class=workload.long_class,
                   params={**p, "capacity_rps": capacity_rps,
                           "burst_short_rate": p["short_rate"] + extra})


TENANTS = "tenants"
#: the tenants workload's two API keys' classes: A sends its usual short load, B floods
TENANT_A, TENANT_B = "tenant-a", "tenant-b"
#: its phases: A alone, then A beside B's flood in fair order by key, then the same in arrival
#: order (an API with fair share off, on the same workers)
A_ALONE, FAIR, ARRIVAL_ORDER = "a_alone", "fair", "arrival_order"


def tenants_workload(rate: float, duration_s: float, seed: int = 0, *, factor: float = 3.0,
                     short_tokens: int = 64, max_requests: int | None = None) -> Workload:
    """Key A's short requests at `rate` for `duration_s`; key B's flood (`factor` x the short
    lane's capacity) is added once that is measured (`add_flood`)."""
    if rate <= 0 or factor <= 0:
        raise ValueError("tenants: --rate and --overload-factor must be > 0")
    rng = class_stream(seed, TENANT_A)
    requests = [BenchRequest(TENANT_A, rng.choice(SEED_PROMPTS), short_tokens, t)
                for t in poisson_arrivals(rate, duration_s, rng)]
    return finish(TENANTS, requests, max_requests, short_class=TENANT_A, long_class=None,
                   params={"rate": rate, "duration_s": duration_s, "seed": seed,
                           "factor": factor, "short_tokens": short_tokens,
                           "described": f"tenants: key A's short requests at {rate:g} req/s for "
                                        f"{duration_s:g} s, alone, then beside key B's at "
                                        f"{factor:g}x the short lane's capacity, in fair order "
                                        f"and in arrival order"})


def add_flood(workload: Workload, capacity_rps: float) -> Workload:
    """`workload` (A's requests) plus key B's short requests at `factor` x `capacity_rps`."""
    p = workload.params
    rng = class_stream(p["seed"], TENANT_B)
    flood = [BenchRequest(TENANT_B, rng.choice(SEED_PROMPTS), p["short_tokens"], t)
             for t in poisson_arrivals(p["factor"] * capacity_rps, p["duration_s"], rng)]
    return finish(workload.name, list(workload.requests) + flood, None,
                   short_class=TENANT_A, long_class=None,
                   params={**p, "capacity_rps": capacity_rps,
                           "flood_rate": p["factor"] * capacity_rps})


SHIFT = "shift"
#: shift's long share of --rate in each window: short-heavy, long-heavy, short-heavy again.
#: On 2 cores and the small demo model (--rate 2.5): 0.125 long/s in the short-heavy windows,
#: 0.625 in the long-heavy one, beside the mixed workload's 0.5.
SHIFT_LONG_SHARES = (0.05, 0.25, 0.05)
#: shift's seconds of arrivals per window: long enough for a lane move (seconds) and the
#: tail it leaves to show within the window.
SHIFT_WINDOW_S = 60.0


def shift_window_names(long_shares: tuple[float, ...]) -> list[str]:
    """`1-short-heavy`, `2-long-heavy`, ...: long-heavy when the share is in the upper half
    of the shares' range."""
    low, high = min(long_shares), max(long_shares)
    return [f"{i + 1}-{'long' if high > low and share >= (low + high) / 2 else 'short'}-heavy"
            for i, share in enumerate(long_shares)]


def shift_workload(rate: float, long_shares: tuple[float, ...] = SHIFT_LONG_SHARES,
                   window_s: float = SHIFT_WINDOW_S, seed: int = 0, *, short_tokens: int = 64,
                   long_prompt_tokens: int = 2000, long_tokens: int = 512,
                   count_tokens: Callable[[str], int] | None = None,
                   max_requests: int | None = None) -> Workload:
    """Short and long requests at `rate` in total over consecutive windows of `window_s`, the
    i-th with `long_shares[i]` of it long. Each window and class draws from a stream of its own."""
    if rate <= 0 or window_s <= 0 or not long_shares:
        raise ValueError("shift: --rate and --shift-window must be > 0, with at least one share")
    if not all(0 <= share <= 1 for share in long_shares):
        raise ValueError("shift: each long share must be within [0, 1]")
    requests: list[BenchRequest] = []
    windows = []
    for i, (name, share) in enumerate(zip(shift_window_names(long_shares), long_shares)):
        start = i * window_s
        rng = class_stream(seed, f"{SHIFT}/{i}/{SHORT}")
        requests += [BenchRequest(SHORT, rng.choice(SEED_PROMPTS), short_tokens, start + t)
                     for t in poisson_arrivals(rate * (1 - share), window_s, rng)]
        rng = class_stream(seed, f"{SHIFT}/{i}/{LONG}")
        requests += [BenchRequest(LONG, long_prompt(long_prompt_tokens, rng, count_tokens),
                                  long_tokens, start + t)
                     for t in poisson_arrivals(rate * share, window_s, rng)]
        windows.append({"name": name, "start_s": start, "end_s": start + window_s,
                        "long_share": share, "short_rate": rate * (1 - share),
                        "long_rate": rate * share})
    mix = ", ".join(f"{w['name']} {w['short_rate']:.3g} short/s + {w['long_rate']:.3g} long/s"
                    for w in windows)
    return finish(SHIFT, requests, max_requests, params={
        "rate": rate, "long_shares": list(long_shares), "window_s": window_s,
        "duration_s": window_s * len(long_shares), "seed": seed, "windows": windows,
        "short_tokens": short_tokens, "long_prompt_tokens": long_prompt_tokens,
        "long_tokens": long_tokens,
        "described": f"shift: {window_s:g} s windows: {mix}"})


def split_shift(items: Iterable[Any], params: dict[str, Any]) -> dict[str, list[Any]]:
    """Requests or samples (anything with `arrival_s`) by shift window."""
    windows = params["windows"]
    out: dict[str, list[Any]] = {w["name"]: [] for w in windows}
    for item in items:
        w = next((w for w in windows if item.arrival_s < w["end_s"]), windows[-1])
        out[w["name"]].append(item)
    return out


def window_of(arrival_s: float, params: dict[str, Any]) -> str:
    """Which overload window a request that arrives at `arrival_s` belongs to."""
    if arrival_s < params["burst_start_s"]:
        return WINDOWS[0]
    return WINDOWS[1] if arrival_s < params["burst_end_s"] else WINDOWS[2]


def split_windows(items: Iterable[Any], params: dict[str, Any]) -> dict[str, list[Any]]:
    """Requests or samples (anything with `arrival_s`) by overload window."""
    out: dict[str, list[Any]] = {w: [] for w in WINDOWS}
    for item in items:
        out[window_of(item.arrival_s, params)].append(item)
    return out


def parse_jsonl(lines: Iterable[str], where: str = "workload") -> list[dict[str, Any]]:
    """Validated trace records; a bad line raises ValueError naming it."""
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{where}:{n}: not JSON: {exc}") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{where}:{n}: expected an object")
        unknown = set(rec) - {"prompt", "max_tokens", "class", "arrival_s", "ignore_eos"}
        if unknown:
            raise ValueError(f"{where}:{n}: unknown field(s) {sorted(unknown)}")
        if not isinstance(rec.get("prompt"), str) or not rec["prompt"]:
            raise ValueError(f"{where}:{n}: prompt must be a non-empty string")
        mt = rec.get("max_tokens")
        if not isinstance(mt, int) or isinstance(mt, bool) or mt <= 0:
            raise ValueError(f"{where}:{n}: max_tokens must be a positive integer")
        arr = rec.get("arrival_s")
        if arr is not None and (not isinstance(arr, (int, float)) or isinstance(arr, bool) or arr < 0):
            raise ValueError(f"{where}:{n}: arrival_s must be a number >= 0")
        if not isinstance(rec.get("class", SHORT), str):
            raise ValueError(f"{where}:{n}: class must be a string")
        records.append(rec)
    if not records:
        raise ValueError(f"{where}: no requests")
    timed = sum(1 for r in records if "arrival_s" in r)
    if timed not in (0, len(records)):
        raise ValueError(f"{where}: give arrival_s on every line or on none ({timed} of "
                         f"{len(records)} have it)")
    return records


def jsonl_workload(path: str | Path, rate: float, duration_s: float | None, seed: int = 0,
                   max_requests: int | None = None) -> Workload:
    """A user's trace. With arrival_s: replayed as timed (cut at duration_s if given);
    without: the lines in order, cycling, at Poisson arrivals of `rate` for duration_s."""
    path = Path(path)
    records = parse_jsonl(path.read_text().splitlines(), str(path))

    def req(rec: dict[str, Any], t: float) -> BenchRequest:
        return BenchRequest(rec.get("class", SHORT), rec["prompt"], rec["max_tokens"], t,
                            bool(rec.get("ignore_eos", True)))

    if "arrival_s" in records[0]:
        start = min(r["arrival_s"] for r in records)
        requests = [req(r, r["arrival_s"] - start) for r in records
                    if duration_s is None or r["arrival_s"] - start < duration_s]
    else:
        if duration_s is None:
            duration_s = len(records) / rate if rate > 0 else 0
        times = poisson_arrivals(rate, duration_s, class_stream(seed, "jsonl"))
        requests = [req(records[i % len(records)], t) for i, t in enumerate(times)]
    classes = {r.cls for r in requests}
    return finish(path.stem, requests, max_requests,
                   short_class=SHORT if SHORT in classes else None,
                   long_class=LONG if LONG in classes else None,
                   params={"file": str(path), "rate": rate, "duration_s": duration_s, "seed": seed})
