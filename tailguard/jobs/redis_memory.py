"""Whether Redis has room for new jobs: its memory against a high-water mark.

Redis runs with maxmemory and noeviction (tailguard/host/redis_server.py): past maxmemory
every write that may grow it fails, a worker's heartbeat and a running job's text among
them, and a system whose lanes look dead and whose running jobs fail is worse than one
that only turns new work away. So submissions are refused (503 ``storage_full``) once
INFO's ``used_memory`` passes ``high_water`` x ``maxmemory``, and what was accepted runs
to its end in the room left above the mark. Finished jobs' records and text expire
(TAILGUARD_RECORD_TTL_S, TAILGUARD_OUTPUT_TTL_S), so memory falls back under the mark by
itself and submissions resume; docs/reliability.md ("Bounded storage") sizes the defaults.

Each process reads the figure at most once per ``refresh_s`` and its threads share it:
between two reads a process admits at most ``refresh_s`` worth of its submissions, a few
hundred KB at the rates the sizing assumes, well inside the room above the mark.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from tailguard import settings
from tailguard.errors import StorageFull

#: How stale the memory figure a submission is judged by may be, in seconds.
REFRESH_S = 1.0

_MIB = 1 << 20


@dataclass(frozen=True)
class Memory:
    """Redis's memory as INFO reports it, and the mark submissions stop at (0: none)."""

    used_bytes: int
    max_bytes: int  # maxmemory; 0: none set
    high_water_bytes: int

    @property
    def full(self) -> bool:
        return 0 < self.high_water_bytes <= self.used_bytes

    def to_dict(self) -> dict[str, int | bool]:
        return {"used_bytes": self.used_bytes, "max_bytes": self.max_bytes,
                "high_water_bytes": self.high_water_bytes, "full": self.full}


def high_water_bytes(max_bytes: int, share: float) -> int:
    """The mark for a Redis of `max_bytes` maxmemory: none without maxmemory or with share 0."""
    return int(max_bytes * share) if max_bytes > 0 and share > 0 else 0


class StorageWatch:
    """The memory of one Redis, read at most once per `refresh_s`; share between threads."""

    def __init__(self, client: redis.Redis, high_water: float = settings.REDIS_HIGH_WATER.default,
                 *, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.high_water = high_water
        self.refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: Memory | None = None
        self._read_at = 0.0

    def read(self) -> Memory:
        """Redis's memory now (one INFO memory)."""
        info = self.client.info("memory")
        max_bytes = int(info.get("maxmemory", 0))
        return Memory(int(info["used_memory"]), max_bytes, high_water_bytes(max_bytes, self.high_water))

    def memory(self) -> Memory:
        """The latest figure, read again once it is `refresh_s` old."""
        with self._lock:
            now = self._clock()
            if self._last is None or now - self._read_at >= self.refresh_s:
                self._last, self._read_at = self.read(), now
            return self._last

    def check(self) -> None:
        """StorageFull (503, Retry-After) while Redis is past its high-water mark."""
        if self.high_water <= 0:
            return
        memory = self.memory()
        if memory.full:
            raise StorageFull(
                f"Redis holds {memory.used_bytes / _MIB:.0f} MiB, past its high-water mark of "
                f"{memory.high_water_bytes / _MIB:.0f} MiB ({self.high_water:.0%} of maxmemory): "
                "no new job until finished ones expire; the jobs already accepted go on")
