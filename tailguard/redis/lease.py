"""A lease in Redis: one key that one process at a time holds, so that every process may run a
loop (the batch feeder, the redelivery passes) and only one does its work.
A holder renews it every period; one that dies loses it when it lapses, one that stops gives it
up at once."""

from __future__ import annotations

import redis

from tailguard.redis import lua


class Lease:
    """The lease at `key`: held by an owner name for a time to live."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.redis, self.key = client, key
        self._hold = lua.Script(client, "hold_lease")
        self._release = lua.Script(client, "release_lease")

    def hold(self, owner: str, ttl_s: float) -> bool:
        """Take or renew it for `ttl_s`; whether `owner` holds it now."""
        return bool(self._hold([self.key], owner=owner, ttl_ms=max(1, int(ttl_s * 1000))))

    def release(self, owner: str) -> bool:
        """Give it up if `owner` holds it; whether it did."""
        return bool(self._release([self.key], owner=owner))

    def holder(self) -> str | None:
        held = self.redis.get(self.key)
        return held.decode() if isinstance(held, bytes) else held
