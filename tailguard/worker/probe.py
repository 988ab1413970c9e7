"""A worker's liveness, as an orchestrator asks for it: GET /livez on its metrics port.

Alive while its engine serves (or, set up without eager_engine, waits for its first task)
and its heartbeat thread still beats. A beat counts whether Redis answered or not: a Redis
outage is not the worker's fault, and restarting every engine for it would only add minutes
of engine start to the outage. A starting or restarting engine is not alive yet: Kubernetes'
startupProbe gives the first start its time, and the liveness probe's failureThreshold x
periodSeconds an in-process restart (docs/deployment.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from tailguard.engine.keeper import IDLE, SERVING

#: the engine states in which the worker is alive
ALIVE_STATES = (SERVING, IDLE)


@dataclass(frozen=True)
class Verdict:
    """The verdict and the JSON body that says why."""

    alive: bool
    reason: str
    engine: str
    heartbeat_age_s: float | None

    def to_dict(self) -> dict[str, object]:
        return {"status": "ok" if self.alive else "failing", "reason": self.reason,
                "engine": self.engine, "heartbeat_age_s": self.heartbeat_age_s}


def liveness(engine_state: str, heartbeat_age_s: float | None, lapse_s: float,
             stopping: bool = False) -> Verdict:
    """Whether a worker whose engine is in `engine_state` and whose heartbeat last beat
    `heartbeat_age_s` ago (None: never) is alive; a beat older than `lapse_s` is stale
    (its thread is stuck: the heartbeat also checks the engine)."""
    age = None if heartbeat_age_s is None else round(heartbeat_age_s, 3)

    def verdict(alive: bool, reason: str) -> Verdict:
        return Verdict(alive, reason, engine_state, age)

    if stopping:
        return verdict(False, "the worker is stopping")
    if engine_state not in ALIVE_STATES:
        return verdict(False, f"the engine is {engine_state}, not serving")
    if heartbeat_age_s is None:
        return verdict(False, "no heartbeat yet")
    if heartbeat_age_s > lapse_s:
        return verdict(False, f"the heartbeat is stale (last beat {age} s ago, lapses after "
                              f"{lapse_s:g} s)")
    return verdict(True, "serving")
