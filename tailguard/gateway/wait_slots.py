"""How many waits each API key holds open in this API process: long-polls (?wait=), SSE streams
and OpenAI calls, each of which holds an API thread (and a Redis connection) while it waits.

Counted in the process, not in Redis: what is scarce is this process's threads, and a count
in Redis would outlive a process that died holding it. The API runs one gunicorn process; with
several, each grants a key this many.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tailguard.errors import TooManyWaits


class WaitSlots:
    """At most `per_key` waits open at once per key (0: no limit). Thread-safe."""

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, key: str, name: str) -> Callable[[], None]:
        """Hold one of `key`'s slots (`name`: what the 429 calls the key); returns the release,
        which is safe to call more than once. TooManyWaits when all are held."""
        with self._lock:
            held = self._held.get(key, 0)
            if self.per_key and held >= self.per_key:
                raise TooManyWaits(f"key {name!r} already holds {held} long-polls, streams and "
                                   f"waiting calls open (at most {self.per_key} at once)",
                                   retry_after_s=1)
            self._held[key] = held + 1
        released = threading.Event()

        def release() -> None:
            with self._lock:
                if released.is_set():
                    return
                released.set()
                left = self._held[key] - 1
                if left:
                    self._held[key] = left
                else:
                    del self._held[key]

        return release

    def held(self, key: str) -> int:
        with self._lock:
            return self._held.get(key, 0)
