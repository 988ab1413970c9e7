"""What each engine ran during a phase, read from its own vLLM series, and the refusals made
while one of them had a free slot.

Every engine of a topology serves vLLM's Prometheus series: a tailguard worker on its
metrics port (tailguard/observe/vllm_series.py), a plain vLLM server on its own port. An
`EngineWatch` scrapes each one every `INTERVAL_S` during a phase and keeps
``vllm:num_requests_running`` (summed over the engine's series) with the wall-clock time
of the scrape, and ``vllm:request_success_total`` at the phase's start and end: how the
requests split between the engines (a router's replicas, tailguard's workers).

`free_slot_refusals` then counts, per class, the requests refused (429 or 503) at a moment
when an engine that may serve the class ran fewer requests than its batch slots
(``max_num_seqs``): the engine's last scrape at or before the refusal. The engines' own
figures, not admission's: what the issue holds tailguard to ("a short request is never
refused while an engine that may serve it has a free slot"). A scrape every
`INTERVAL_S` sees a slot that frees and fills again between two scrapes only by chance.
Only the scraping does I/O.
"""

from __future__ import annotations

import bisect
import threading
import time
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tailguard.bench.loadgen import Sample

RUNNING = "vllm:num_requests_running"
SUCCESS = "vllm:request_success"  # a counter: its samples are vllm:request_success_total
#: Seconds between two scrapes of every engine: fine enough against a request's lifetime
#: here (a short one takes 0.5-4 s), cheap for the engines (a scrape is a few ms of CPU).
INTERVAL_S = 0.25


def parse_series(text: str) -> dict[str, float]:
    """`RUNNING` and `SUCCESS` (each summed over its series) from one /metrics page; a
    name missing from the page is missing from the answer."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (RUNNING, SUCCESS):
            values = [s.value for s in family.samples
                      if s.name in (family.name, family.name + "_total")]
            out[family.name] = sum(values)
    return out


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
        self.series: dict[str, list[tuple[float, float]]] = {name: [] for name in self.urls}
        self.first: dict[str, float | None] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-watch", daemon=True)

    def start(self) -> EngineWatch:
        self.first = {name: _success(url) for name, url in self.urls.items()}
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, url in self.urls.items():
                got = scrape(url)
                if got is not None and RUNNING in got:
                    self.series[name].append((round(time.time(), 3), got[RUNNING]))
            self._stop.wait(self.interval_s)

    def stop(self) -> dict[str, Any]:
        """{"series": {engine: [[wall time, running], ...]}, "served": {engine: requests
        that succeeded meanwhile, None when unread}}."""
        self._stop.set()
        self._thread.join()
        last = {name: _success(url) for name, url in self.urls.items()}
        served = {name: None if self.first.get(name) is None or last[name] is None
                  else round(last[name] - self.first[name])  # type: ignore[operator]
                  for name in self.urls}
        return {"series": {name: [list(p) for p in points] for name, points in self.series.items()},
                "served": served}


def _success(url: str) -> float | None:
    got = scrape(url)
    return None if got is None else got.get(SUCCESS)


def running_at(series: list[tuple[float, float]] | list[list[float]], t: float) -> float | None:
    """An engine's running requests at wall time `t`: its last scrape at or before `t` (None
    before its first). `series` is in time order."""
    i = bisect.bisect_right([p[0] for p in series], t)
    return series[i - 1][1] if i else None


def free_slot_at(t: float, engines: Iterable[str], series: Mapping[str, Any],
                 slots: Mapping[str, int]) -> bool:
    """Whether one of `engines` ran fewer than its `slots` at `t`, by its scrapes."""
    for name in engines:
        running = running_at(series.get(name) or [], t)
        if running is not None and running < slots[name]:
            return True
    return False


def free_slot_refusals(samples: Iterable[Sample], series: Mapping[str, Any],
                       slots: Mapping[str, int],
                       class_engines: Mapping[str, Iterable[str]] | None = None) -> dict[str, int]:
    """Per class, the requests with a refusal (any of their attempts', `Sample.refused_at`)
    at a moment when an engine that may serve the class had a free slot. `class_engines`:
    the engines that may serve each class (None, or a class missing: every engine)."""
    out: dict[str, int] = {}
    for s in samples:
        if not s.refused_at:
            out.setdefault(s.cls, 0)
            continue
        engines = list((class_engines or {}).get(s.cls, slots))
        hit = any(free_slot_at(t, engines, series, slots) for t in s.refused_at)
        out[s.cls] = out.get(s.cls, 0) + int(hit)
    return out
