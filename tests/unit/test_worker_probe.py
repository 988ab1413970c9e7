"""A worker's liveness verdict (tailguard/worker/probe.py): its engine's state and its heartbeat."""

import pytest

from tailguard.engine.keeper import FAILED, IDLE, RESTARTING, SERVING, STARTING
from tailguard.worker.probe import liveness

LAPSE_S = 4.5


@pytest.mark.parametrize("state, age, stopping, alive, why", [
    (SERVING, 1.0, False, True, "serving"),
    (IDLE, 0.0, False, True, "serving"),  # no eager engine: starts with the first task
    (STARTING, 1.0, False, False, "starting"),
    (RESTARTING, 1.0, False, False, "restarting"),
    (FAILED, 1.0, False, False, "failed"),
    (SERVING, None, False, False, "no heartbeat"),
    (SERVING, LAPSE_S + 0.1, False, False, "stale"),
    (SERVING, LAPSE_S, False, True, "serving"),
    (SERVING, 1.0, True, False, "stopping"),
])
def test_alive_while_the_engine_serves_and_the_heartbeat_beats(state, age, stopping, alive, why):
    verdict = liveness(state, age, LAPSE_S, stopping=stopping)
    assert verdict.alive is alive
    assert why in verdict.reason
    body = verdict.to_dict()
    assert body["status"] == ("ok" if alive else "failing") and body["engine"] == state
