"""Whether Redis itself stalled during a phase: its latency monitor and slow log.

Every request's path goes through Redis (admission, the job record, the queue, the token
stream), so a Redis that blocks for a second (a fork, a slow script, a big command) delays
every client at once, from the API and from the workers alike, which is what a front-end
stall looks like. Redis records such events itself: its latency monitor (events over
``latency-monitor-threshold``, which tailguard's Redis config sets, tailguard/host/redis_server.py)
and its slow log (commands over ``slowlog-log-slower-than``, 10 ms by default). The bench
clears both before a phase and keeps what they hold after it.
"""

from __future__ import annotations

from typing import Any

import redis


class RedisWatch:
    """Redis's own stalls over one phase; `stop()` returns the report's `redis` entry."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=5)
        self._reset()

    def _reset(self) -> None:
        try:
            self.client.execute_command("LATENCY", "RESET")
            self.client.slowlog_reset()
        except redis.RedisError:
            pass

    def stop(self) -> dict[str, Any]:
        """Latency events (name -> worst ms) and slow commands (count, worst ms, the worst's
        command name)."""
        try:
            latest = self.client.execute_command("LATENCY", "LATEST") or []
            slow = self.client.slowlog_get(128)
        except redis.RedisError as exc:
            return {"error": str(exc)}
        finally:
            self.client.close()
        events = {_text(e[0]): int(e[3]) for e in latest}
        worst = max(slow, key=lambda e: e["duration"], default=None)
        return {"latency_events_ms": events, "slow_commands": len(slow),
                "slowest_ms": round(worst["duration"] / 1000, 1) if worst else 0.0,
                "slowest_command": _text(worst["command"]).split(" ")[0] if worst else None}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
