"""What each engine ran during a phase, read from its own vLLM series, and the refusals made
while one of them had a free slot.

Every engine of a topology serves vLLM's Prometheus series: a tailguard worker on its
metrics port (tailguard/observe/vllm_series.py), a plain vLLM server on its own port. An
`EngineWatch` scrapes each one every `INTERVAL_S` during a phase and keeps
``vllm:num_requests_running`` + ``vllm:num_requests_waiting`` (each summed over the engine's
series: the requests it holds) with the wall-clock time of the scrape, and
``vllm:request_success_total`` at the phase's start and end: how the requests split between
the engines (a router's replicas, tailguard's workers). The prefix cache's counters,
``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits`` (tokens looked up and found), are
read at the same two moments: their deltas over every engine of the
topology are its hit rate over the phase (`prefix_cache`), the warm-up before it left out.

`free_slot_evidence` then names, per class, the requests refused (429 or 503) at a moment
when an engine that may serve the class held fewer requests than its batch slots
(``max_num_seqs``, or the cut limit of an engine that shares the front end's cores:
`TopologySpec.engine_slots`) at every scrape from its last one at or before the refusal through
the first one two engine steps later (``vllm:iteration_tokens_total``'s count). vLLM sets its
gauges once per step, at the step's end, and a request handed to it during a step enters the
scheduler at the next one: a step with a long prompt's prefill lasts a second or more on a
CPU, so a job the worker had already taken shows up in the gauges up to two steps later. A
slot full at any of those scrapes went to a job taken before the refusal. (Without the step
count, from a server that lacks it: the scrape before and the first after.) The
engines' own figures, not admission's: what the issue holds tailguard to ("a short request is
never refused while an engine that may serve it has a free slot"). A scrape every
`INTERVAL_S` sees a slot that frees and fills again between two scrapes only by chance.
Only the scraping does I/O.
"""

from __future__ import annotations

import bisect
import threading
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tailguard.bench.loadgen import Sample

RUNNING = "vllm:num_requests_running"
#: requests the engine holds but has not scheduled yet: they take a slot as well
WAITING = "vllm:num_requests_waiting"
SUCCESS = "vllm:request_success"  # a counter: its samples are vllm:request_success_total
#: vLLM's prefix cache counters (vllm/v1/metrics/loggers.py), in tokens
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"
#: a histogram observed once per engine step (tokens it computed): its count is the steps done
STEPS = "vllm:iteration_tokens_total"
#: the families read; each summed over its series (a histogram: its count)
READ = (RUNNING, WAITING, SUCCESS, PREFIX_QUERIES, PREFIX_HITS, STEPS)
#: how many engine steps after the scrape before a refusal its gauges surely count every
#: request the engine was handed before it (the step in flight, then the next one)
STEPS_TO_SEE = 2
#: Seconds between two scrapes of every engine: fine enough against a request's lifetime
#: here (a short one takes 0.5-4 s), cheap for the engines (a scrape is a few ms of CPU).
INTERVAL_S = 0.25


def parse_series(text: str) -> dict[str, float]:
    """The families of `READ` (each summed over its series) from one /metrics page; a
    name missing from the page is missing from the answer."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in READ:
            names = ((family.name + "_count",) if family.type == "histogram"
                     else (family.name, family.name + "_total"))
            out[family.name] = sum(s.value for s in family.samples if s.name in names)
    return out


def held(figures: Mapping[str, float]) -> float:
    """The requests an engine holds: running, and waiting to be scheduled (a request waits
    there for its prefill's turn: its slot is taken all the same)."""
    return figures[RUNNING] + figures.get(WAITING, 0.0)


def scrape(url: str, timeout_s: float = 2.0) -> dict[str, float] | None:
    """One engine's figures (`parse_series`), or None when it did not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return parse_series(resp.read().decode())
    except (OSError, ValueError):
        return None


class EngineWatch:
    """Scrapes each engine's /metrics URL (by engine name) from `start` until `stop`."""

    def __init__(self, urls: Mapping[str, str], interval_s: float = INTERVAL_S) -> None:
        self.urls = dict(urls)
        self.interval_s = interval_s
        #: per engine, (wall time, running + waiting[, steps done]) at each scrape
        self.series: dict[str, list[tuple[float, ...]]] = {name: [] for name in self.urls}
        self.first: dict[str, dict[str, float] | None] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-watch", daemon=True)

    def start(self) -> EngineWatch:
        self.first = {name: scrape(url) for name, url in self.urls.items()}
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, url in self.urls.items():
                got = scrape(url)
                if got is not None and RUNNING in got:
                    point = (round(time.time(), 3), held(got))
                    self.series[name].append(point + ((got[STEPS],) if STEPS in got else ()))
            self._stop.wait(self.interval_s)

    def stop(self) -> dict[str, Any]:
        """{"series": {engine: [[wall time, running + waiting, steps done], ...]}, "served":
        {engine: requests that succeeded meanwhile, None when unread}, "prefix_cache": {engine:
        {"queries", "hits"} meanwhile, None when unread}}."""
        self._stop.set()
        self._thread.join()
        last = {name: scrape(url) for name, url in self.urls.items()}
        served = {}
        for name in self.urls:
            d = delta(self.first.get(name), last[name], SUCCESS)
            served[name] = None if d is None else round(d)
        return {"series": {name: [list(p) for p in points] for name, points in self.series.items()},
                "served": served,
                "prefix_cache": {name: prefix_delta(self.first.get(name), last[name])
                                 for name in self.urls}}


def delta(first: Mapping[str, float] | None, last: Mapping[str, float] | None,
          name: str) -> float | None:
    """How much counter `name` grew between two scrapes (None: either unread or without it)."""
    if first is None or last is None or name not in first or name not in last:
        return None
    return last[name] - first[name]


def prefix_delta(first: Mapping[str, float] | None,
                 last: Mapping[str, float] | None) -> dict[str, float] | None:
    """One engine's prefix-cache tokens queried and hit between two scrapes, or None."""
    queries, hits = delta(first, last, PREFIX_QUERIES), delta(first, last, PREFIX_HITS)
    if queries is None or hits is None:
        return None
    return {"queries": queries, "hits": hits}


def prefix_hit_rate(per_engine: Mapping[str, Mapping[str, float] | None]) -> dict[str, Any]:
    """A topology's prefix cache over a phase: every engine's tokens queried and hit summed,
    and hits / queries (None when no engine was read or none was queried). Engines left
    unread are named in `unread`: a rate over the others only."""
    read = {e: d for e, d in per_engine.items() if d is not None}
    queries = sum(d["queries"] for d in read.values())
    hits = sum(d["hits"] for d in read.values())
    return {"queries": queries, "hits": hits,
            "hit_rate": hits / queries if read and queries > 0 else None,
            "unread": sorted(e for e, d in per_engine.items() if d is None)}


def running_at(series: list[tuple[float, float]] | list[list[float]], t: float) -> float | None:
    """An engine's running requests at wall time `t`: its last scrape at or before `t` (None
    before its first). `series` is in time order."""
    i = bisect.bisect_right([p[0] for p in series], t)
    return series[i - 1][1] if i else None


def free_engine_at(t: float, engines: Iterable[str], series: Mapping[str, Any],
                   slots: Mapping[str, int]) -> dict[str, Any] | None:
    """The first of `engines` that ran fewer than its `slots` at `t`, by its scrapes: at every one
    from the last before `t` through the first `STEPS_TO_SEE` engine steps after that one (the
    gauges then count what the engine was handed before `t`), or, from scrapes without a step
    count, at the last one before `t` and the first after it. A slot full at any of them was
    most likely taken by a job already queued when the request was refused (the engines cannot
    show their queue): not a free slot. With the scrapes that show it:
    {"engine", "slots", "scrapes": [[wall time, running + waiting, steps], ...]}; None."""
    for name in engines:
        one = series.get(name) or []
        i = bisect.bisect_right([p[0] for p in one], t)
        if i == 0:
            continue  # before its first scrape: not known free
        window = _seen_through(one, i - 1)
        if all(p[1] < slots[name] for p in window):
            return {"engine": name, "slots": slots[name], "scrapes": [list(p) for p in window]}
    return None


def _seen_through(series: Sequence[Sequence[float]], i: int) -> Sequence[Sequence[float]]:
    """The scrapes from `series[i]` through the first `STEPS_TO_SEE` steps after it (to the last
    one where the engine never got that far); without step counts, it and the next one."""
    if len(series[i]) < 3:
        return series[i:i + 2]
    for j in range(i + 1, len(series)):
        if len(series[j]) < 3 or series[j][2] >= series[i][2] + STEPS_TO_SEE:
            return series[i:j + 1]
    return series[i:]


def free_slot_evidence(samples: Iterable[Sample], series: Mapping[str, Any],
                       slots: Mapping[str, int],
                       class_engines: Mapping[str, Iterable[str]] | None = None
                       ) -> dict[str, list[dict[str, Any]]]:
    """Per class, the requests with a refusal (any of their attempts', `Sample.refused_at`) at a
    moment when an engine that may serve the class had a free slot: each one's first such
    refusal, when ("refused_at", wall time) and where (`free_engine_at`). `class_engines`: the
    engines that may serve each class (None, or a class missing: every engine)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        found = out.setdefault(s.cls, [])
        engines = list((class_engines or {}).get(s.cls, slots))
        for t in s.refused_at or []:
            free = free_engine_at(t, engines, series, slots)
            if free is not None:
                found.append({"refused_at": t, **free})
                break
    return out
