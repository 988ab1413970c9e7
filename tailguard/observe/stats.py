"""`tailguard stats`: the article's troubleshooting list, from Redis alone.

Average, then P50/P95/P99, then the distribution of prompt and output lengths,
then what the slowest requests have in common. Each finished request is added
to per-minute, per-lane histograms (tailguard.observe.sketch) kept in Redis for
`retention_s`; a time window's figures are those minutes merged. Memory is
bounded: a few dozen counters per metric per lane per minute, plus the K
slowest requests of each minute. A request of an API key (keys mode) is added to
its key's minute as well, with the output tokens the key was served per lane and
its refusals by code: `tailguard stats --by key`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import redis

from tailguard import settings
from tailguard.jobs.finished import FinishedRequest
from tailguard.observe.sketch import Histogram, bucket_of
from tailguard.redis import keys, lua

#: metric -> (FinishedRequest attribute, histogram unit)
METRICS: dict[str, tuple[str, float]] = {
    "e2e_s": ("e2e_s", 1e-3),
    "ttft_s": ("ttft_s", 1e-3),
    "queued_s": ("queued_s", 1e-3),
    "engine_s": ("engine_s", 1e-3),
    "tpot_s": ("tpot_s", 1e-4),
    "prompt_tokens": ("prompt_tokens", 1.0),
    "output_tokens": ("completion_tokens", 1.0),
}
SLOW_PER_MINUTE = 20

class StatsStore:
    def __init__(self, client: redis.Redis, *,
                 retention_s: int = settings.STATS_RETENTION_S.default) -> None:
        self.client = client
        self.retention_s = retention_s
        self._record = lua.Script(client, "record_stats")

    def record(self, r: FinishedRequest) -> None:
        """Add one finished request to its minute's histograms (a FinishedConsumer sink)."""
        minute = int(r.finished_at // 60)
        lane = r.lane or "unknown"
        metrics: dict[str, list[Any]] = {}
        for name, (attr, unit) in METRICS.items():
            value = getattr(r, attr)
            if value is not None:
                metrics[name] = [repr(float(value)), bucket_of(float(value), unit)]
        args: dict[str, Any] = {"ttl_s": self.retention_s, "status": r.status, "metrics": metrics}
        if r.api_key is not None:
            args["key"] = {"name": r.api_key, "lane": lane, "tokens": r.completion_tokens or 0}
        if r.e2e_s is not None:
            member = json.dumps({"id": r.id, "lane": lane, "status": r.status,
                                 "prompt_tokens": r.prompt_tokens, "output_tokens": r.completion_tokens,
                                 "queued_s": r.queued_s, "ttft_s": r.ttft_s, "e2e_s": r.e2e_s,
                                 "worker": r.worker}, separators=(",", ":"))
            args["slow"] = {"member": member, "score": r.e2e_s, "keep": SLOW_PER_MINUTE}
        name = r.api_key or ""  # unused without a key: the script reads KEYS[3:] only with one
        self._record([keys.stats_key(minute, lane), keys.slow_key(minute),
                      keys.key_stats_key(minute, name), keys.key_stats_names_key(minute)], **args)

    def record_refused(self, lane: str | None, code: str, at: float | None = None,
                       key: str | None = None) -> None:
        """Count one request refused in the minute of `at` (the Redis clock as admission read
        the lane's load; read here when not given): for its lane when refused at a lane's
        admission, and for its API key's name when it has one. One round trip: a refusal is
        what a burst makes many of, on the front end's core."""
        if at is None:
            secs, _micros = self.client.time()
            at = float(secs)
        minute = int(at) // 60
        pipe = self.client.pipeline(transaction=False)
        hashes = ([keys.stats_key(minute, lane)] if lane is not None else []) + (
            [keys.key_stats_key(minute, key)] if key is not None else [])
        for h in hashes:
            pipe.hincrby(h, f"refused:{code}", 1)
            pipe.expire(h, self.retention_s)
        if key is not None:
            pipe.sadd(keys.key_stats_names_key(minute), key)
            pipe.expire(keys.key_stats_names_key(minute), self.retention_s)
        if hashes:
            pipe.execute()

    def window(self, lanes: list[str], start: float, end: float, *, top: int = 10) -> Window:
        """Merge the minutes overlapping [start, end] (Redis-clock seconds)."""
        minutes = range(int(start // 60), int(end // 60) + 1)
        pipe = self.client.pipeline(transaction=False)
        for m in minutes:
            for lane in lanes:
                pipe.hgetall(keys.stats_key(m, lane))
        for m in minutes:
            pipe.zrevrange(keys.slow_key(m), 0, top - 1)
        replies = pipe.execute()
        per_lane = {lane: LaneStats(lane) for lane in lanes}
        i = 0
        for _m in minutes:
            for lane in lanes:
                per_lane[lane].add_minute(replies[i])
                i += 1
        slow = [json.loads(x) for reply in replies[i:] for x in reply]
        slow.sort(key=lambda s: s["e2e_s"], reverse=True)
        return Window(start=start, end=end, lanes=per_lane, slowest=slow[:top])

    def keys_window(self, start: float, end: float) -> dict[str, KeyStats]:
        """Each API key's figures over the minutes overlapping [start, end], by name."""
        minutes = range(int(start // 60), int(end // 60) + 1)
        pipe = self.client.pipeline(transaction=False)
        for m in minutes:
            pipe.smembers(keys.key_stats_names_key(m))
        names = [sorted(n.decode() if isinstance(n, bytes) else n for n in reply)
                 for reply in pipe.execute()]
        for m, ns in zip(minutes, names):
            for n in ns:
                pipe.hgetall(keys.key_stats_key(m, n))
        replies = iter(pipe.execute())
        out: dict[str, KeyStats] = {}
        for ns in names:
            for n in ns:
                out.setdefault(n, KeyStats(n)).add_minute(next(replies))
        return dict(sorted(out.items()))


@dataclass
class LaneStats:
    lane: str
    count: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)  # by code, at admission
    metrics: dict[str, Histogram] = field(default_factory=lambda: {
        name: Histogram(unit=unit) for name, (_attr, unit) in METRICS.items()})

    def add_minute(self, raw: dict) -> None:
        """Merge one minute's hash (as stored by StatsStore.record)."""
        if not raw:
            return
        fields = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                  for k, v in raw.items()}
        self.count += int(fields.get("n", 0))
        minute: dict[str, Histogram] = {name: Histogram(unit=h.unit) for name, h in self.metrics.items()}
        for k, v in fields.items():
            if k.startswith("status:"):
                self.statuses[k[7:]] = self.statuses.get(k[7:], 0) + int(v)
                continue
            if k.startswith("refused:"):
                self.refused[k[8:]] = self.refused.get(k[8:], 0) + int(v)
                continue
            name, _, part = k.partition(":")
            h = minute.get(name)
            if h is None:
                continue
            if part.startswith("b"):
                h.buckets[int(part[1:])] = int(v)
            elif part == "n":
                h.count = int(v)
            elif part == "sum":
                h.total = float(v)
            elif part == "max":
                h.max = float(v)
            elif part == "min":
                h.min = float(v)
        for name, h in minute.items():
            self.metrics[name].merge(h)


@dataclass
class KeyStats(LaneStats):
    """One API key's figures (`lane` holds its name), with the output tokens it was served on
    each lane."""

    served: dict[str, int] = field(default_factory=dict)

    def add_minute(self, raw: dict) -> None:
        super().add_minute(raw)
        for k, v in (raw or {}).items():
            k = k.decode() if isinstance(k, bytes) else k
            if k.startswith("served:"):
                self.served[k[7:]] = self.served.get(k[7:], 0) + int(v)

    def shares(self, lanes: dict[str, LaneStats]) -> dict[str, float | None]:
        """Of each lane's output tokens in the window, the share this key was served."""
        out: dict[str, float | None] = {}
        for lane, tokens in self.served.items():
            total = lanes[lane].metrics["output_tokens"].total if lane in lanes else 0
            out[lane] = tokens / total if total else None
        return out

    def to_dict(self, lanes: dict[str, LaneStats]) -> dict[str, Any]:
        return {"count": self.count, "statuses": self.statuses, "refused": self.refused,
                "served_output_tokens": self.served, "share_of_lane": self.shares(lanes),
                **{name: h.summary() for name, h in self.metrics.items()}}


def render_keys(by_key: dict[str, KeyStats], lanes: dict[str, LaneStats]) -> str:
    """`tailguard stats --by key`: per API key, its requests, latency, refusals by code and
    share of each lane's service (output tokens) in the window."""
    if not by_key:
        return ("tailguard stats --by key: no request of an API key in the window (in open mode "
                "requests have no key: TAILGUARD_API_AUTH=keys)")
    out = [f"tailguard stats --by key: {len(by_key)} keys, "
           f"{sum(s.count for s in by_key.values())} finished requests in the window", "",
           f"{'key':<16}{'n':>6}{'ok':>6}{'fail':>5} | e2e p50 / p99     | ttft p99 | "
           "refused | share of each lane's output tokens"]
    for name, s in by_key.items():
        e2e = s.metrics["e2e_s"]
        refused = ", ".join(f"{c} {n}" for c, n in sorted(s.refused.items())) or "-"
        shares = ", ".join(f"{lane} {_pct(v)}" for lane, v in sorted(s.shares(lanes).items())) or "-"
        out.append(f"{name:<16}{s.count:>6}{s.statuses.get('succeeded', 0):>6}"
                   f"{s.statuses.get('failed', 0):>5} | {_fmt(e2e.percentile(50))} / "
                   f"{_fmt(e2e.percentile(99))} | {_fmt(s.metrics['ttft_s'].percentile(99)):>8} | "
                   f"{refused} | {shares}")
    return "\n".join(out)


@dataclass
class Window:
    start: float
    end: float
    lanes: dict[str, LaneStats]
    slowest: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": {"start": self.start, "end": self.end},
            "lanes": {lane: {"count": s.count, "statuses": s.statuses, "refused": s.refused,
                             **{name: h.summary() for name, h in s.metrics.items()}}
                      for lane, s in self.lanes.items()},
            "slowest": self.slowest,
            "slowest_vs_all": self.what_sets_slowest_apart(),
        }

    def what_sets_slowest_apart(self) -> dict[str, Any] | None:
        """Mean lengths, queue share and lane mix of the slowest requests against everyone's."""
        if not self.slowest:
            return None

        def mean(values: list[float | None]) -> float | None:
            vs = [v for v in values if v is not None]
            return sum(vs) / len(vs) if vs else None

        everyone = Histogram(1.0), Histogram(1.0), Histogram(1e-3), Histogram(1e-3)
        for s in self.lanes.values():
            everyone[0].merge(s.metrics["prompt_tokens"])
            everyone[1].merge(s.metrics["output_tokens"])
            everyone[2].merge(s.metrics["queued_s"])
            everyone[3].merge(s.metrics["e2e_s"])
        slow_queue = sum(x["queued_s"] or 0 for x in self.slowest)
        slow_e2e = sum(x["e2e_s"] or 0 for x in self.slowest)
        lanes: dict[str, int] = {}
        for x in self.slowest:
            lanes[x["lane"]] = lanes.get(x["lane"], 0) + 1
        total = sum(s.count for s in self.lanes.values())
        return {
            "n": len(self.slowest),
            "prompt_tokens_mean": {"slowest": mean([x["prompt_tokens"] for x in self.slowest]),
                                   "all": everyone[0].mean},
            "output_tokens_mean": {"slowest": mean([x["output_tokens"] for x in self.slowest]),
                                   "all": everyone[1].mean},
            "queue_share_of_latency": {
                "slowest": slow_queue / slow_e2e if slow_e2e else None,
                "all": everyone[2].total / everyone[3].total if everyone[3].total else None},
            "lanes": {"slowest": lanes,
                      "all": {lane: s.count for lane, s in self.lanes.items() if s.count}},
            "all_count": total,
        }

    def render(self) -> str:
        """The terminal report."""
        out = [f"tailguard stats: {len(self.lanes)} lanes, "
               f"{sum(s.count for s in self.lanes.values())} finished requests in the window"]
        out.append("")
        head = f"{'lane':<8}{'n':>6}{'ok':>6}{'fail':>5}{'exp':>5}{'cncl':>5} | "
        out.append(head + "e2e s: " + "  ".join(f"{c:>7}" for c in ("avg", "p50", "p95", "p99", "max"))
                   + " | ttft p99 | queue p99")
        for lane, s in self.lanes.items():
            st = s.statuses
            e2e = s.metrics["e2e_s"].summary()
            out.append(
                f"{lane:<8}{s.count:>6}{st.get('succeeded', 0):>6}{st.get('failed', 0):>5}"
                f"{st.get('expired', 0):>5}{st.get('cancelled', 0):>5} | "
                + "       " + "  ".join(_fmt(e2e[c]) for c in ("avg", "p50", "p95", "p99", "max"))
                + f" | {_fmt(s.metrics['ttft_s'].percentile(99)):>8} | "
                  f"{_fmt(s.metrics['queued_s'].percentile(99)):>9}")
        refused = {lane: s.refused for lane, s in self.lanes.items() if s.refused}
        if refused:
            out += ["", "refused at admission (not queued): "
                    + "; ".join(f"{lane} " + ", ".join(f"{code} {n}" for code, n in sorted(r.items()))
                                for lane, r in refused.items())]
        out += ["", "lengths (tokens): prompt p50/p95/p99/max | output p50/p95/p99/max"]
        for lane, s in self.lanes.items():
            p, o = s.metrics["prompt_tokens"], s.metrics["output_tokens"]
            out.append(f"{lane:<8} " + "/".join(_tok(p.percentile(q)) for q in (50, 95, 99))
                       + f"/{_tok(p.max if p.count else None)} | "
                       + "/".join(_tok(o.percentile(q)) for q in (50, 95, 99))
                       + f"/{_tok(o.max if o.count else None)}")
        if self.slowest:
            out += ["", f"slowest {len(self.slowest)}: id lane prompt->output queue+engine=e2e"]
            for x in self.slowest:
                engine = (x["e2e_s"] or 0) - (x["queued_s"] or 0)
                out.append(f"  {x['id'][:12]} {x['lane']:<7} {x['prompt_tokens'] or 0:>6}->"
                           f"{x['output_tokens'] or 0:<6} {_fmt(x['queued_s'])}+{_fmt(engine)}="
                           f"{_fmt(x['e2e_s'])} {x['status']}")
            apart = self.what_sets_slowest_apart()
            share = apart["queue_share_of_latency"]
            out += ["", "what sets the slowest apart (slowest vs all):",
                    f"  prompt tokens mean  {_num(apart['prompt_tokens_mean']['slowest'])} vs "
                    f"{_num(apart['prompt_tokens_mean']['all'])}",
                    f"  output tokens mean  {_num(apart['output_tokens_mean']['slowest'])} vs "
                    f"{_num(apart['output_tokens_mean']['all'])}",
                    f"  queue wait share    {_pct(share['slowest'])} vs {_pct(share['all'])} of latency",
                    f"  lanes               {apart['lanes']['slowest']} vs {apart['lanes']['all']}"]
        return "\n".join(out)


def _fmt(x: float | None) -> str:
    return f"{x:7.3f}" if x is not None else "      -"


def _tok(x: float | None) -> str:
    return "-" if x is None else str(int(math.ceil(x)))


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def parse_window(text: str) -> float:
    """'15m', '2h', '90s', '1d' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if not text or text[-1] not in units or not text[:-1].replace(".", "", 1).isdigit():
        raise ValueError(f"window must look like 90s, 15m, 2h or 1d, got {text!r}")
    return float(text[:-1]) * units[text[-1]]
