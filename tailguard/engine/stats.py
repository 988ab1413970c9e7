"""What an engine host observed: plain counters, read without touching the engine loop.

A Prometheus scrape or ``celery inspect engine_stats`` takes a snapshot under a
lock; the loop keeps every number current as requests start and end, so no
reader ever waits on the loop (which may be busy, or wedged).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Literal


@dataclass
class HostStats:
    """One snapshot of an engine host's counters."""

    in_flight: int = 0  # requests inside the engine now
    peak_in_flight: int = 0  # the most at once
    decoding: int = 0  # requests that have produced tokens and are not done
    peak_decoding: int = 0  # the most at once; >= 2 means the engine really batched them
    completed: int = 0
    aborted: int = 0  # ended by deadline, cancel or shutdown
    failed: int = 0
    # vLLM's own count (AsyncLLM.get_num_unfinished_requests()), as of the last request
    # that ended: 0 when idle proves aborted requests were released.
    engine_unfinished: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class HostCounters:
    """The live counters behind HostStats; every method is thread-safe and non-blocking."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._s = HostStats()

    def snapshot(self) -> HostStats:
        with self._lock:
            return dataclasses.replace(self._s)

    def entered(self) -> None:
        with self._lock:
            self._s.in_flight += 1
            self._s.peak_in_flight = max(self._s.peak_in_flight, self._s.in_flight)

    def first_token(self) -> None:
        with self._lock:
            self._s.decoding += 1
            self._s.peak_decoding = max(self._s.peak_decoding, self._s.decoding)

    def left(self, *, decoded: bool, outcome: Literal["completed", "aborted", "failed"],
             engine_unfinished: int) -> None:
        """A request that entered has ended."""
        with self._lock:
            self._s.in_flight -= 1
            if decoded:
                self._s.decoding -= 1
            setattr(self._s, outcome, getattr(self._s, outcome) + 1)
            self._s.engine_unfinished = engine_unfinished

    def rejected(self) -> None:
        """A request failed before it entered the engine (bad sampling, prompt refused)."""
        with self._lock:
            self._s.failed += 1
