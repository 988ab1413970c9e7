"""The engine keeper's lifecycle with fake hosts (no engine): start, death, restart, give up."""

import threading
import time

import pytest

from tailguard.engine.keeper import FAILED, SERVING, Backoff, EngineKeeper
from tailguard.errors import EngineDeadError


class FakeHost:
    def __init__(self, fail: bool = False) -> None:
        self.fail, self.dead, self.shut = fail, False, False

    def start(self) -> None:
        if self.fail:
            raise EngineDeadError("cannot start")

    def shutdown(self) -> None:
        self.shut = True


def settled(events: list[str], expected: list[str], timeout_s: float = 5.0) -> bool:
    """on_up runs on the keeper's thread just after get() can return: wait for it."""
    deadline = time.monotonic() + timeout_s
    while events != expected and time.monotonic() < deadline:
        time.sleep(0.001)
    return events == expected


def keeper_for(failures: list[bool], **kw):
    """A keeper whose n-th build fails if failures[n] (later builds succeed)."""
    built, events = [], []
    gave_up = threading.Event()

    def build():
        built.append(FakeHost(fail=failures[len(built)] if len(built) < len(failures) else False))
        return built[-1]

    keeper = EngineKeeper(build, lambda host: None, on_up=lambda: events.append("up"),
                          on_down=lambda: events.append("down"),
                          on_give_up=lambda exc: (events.append("give_up"), gave_up.set()),
                          backoff=Backoff(base_s=0.001, max_attempts=3), **kw)
    return keeper, built, events, gave_up


def test_a_dead_engine_is_withdrawn_and_replaced():
    keeper, built, events, _ = keeper_for([])
    first = keeper.get(timeout=5)
    keeper.died(first)
    keeper.died(first)  # every task thread that saw it die reports it: one restart
    second = keeper.get(timeout=5)
    assert second is not first and first.shut and keeper.state == SERVING
    assert settled(events, ["up", "down", "up"]) and keeper.restarts == 1 and len(built) == 2


def test_a_death_noticed_while_idle_restarts_too():
    keeper, built, events, _ = keeper_for([])
    host = keeper.get(timeout=5)
    assert settled(events, ["up"])
    keeper.check()
    assert events == ["up"]
    host.dead = True
    keeper.check()
    assert keeper.get(timeout=5) is not host and settled(events, ["up", "down", "up"])


def test_a_failed_first_start_is_not_retried():
    keeper, built, events, gave_up = keeper_for([True])
    with pytest.raises(EngineDeadError, match="cannot start"):
        keeper.get(timeout=5)
    assert keeper.state == FAILED and settled(events, ["give_up"]) and len(built) == 1


def test_restarts_back_off_then_give_up():
    keeper, built, events, gave_up = keeper_for([False, True, True, True])
    keeper.died(keeper.get(timeout=5))
    assert gave_up.wait(5)
    with pytest.raises(EngineDeadError):
        keeper.get(timeout=5)
    assert len(built) == 4 and events == ["up", "down", "give_up"]


def test_a_restart_that_fails_once_then_works_serves_again():
    keeper, built, events, _ = keeper_for([False, True])
    keeper.died(keeper.get(timeout=5))
    assert keeper.get(timeout=5) is built[2] and keeper.restarts == 1


def test_stop_wakes_the_waiters():
    keeper, *_ = keeper_for([])
    keeper.get(timeout=5)
    keeper.stop()
    with pytest.raises(EngineDeadError, match="stopping"):
        keeper.get(timeout=5)


@pytest.mark.parametrize("attempt,delay", [(1, 1.0), (2, 2.0), (3, 4.0), (6, 30.0)])
def test_backoff_doubles_up_to_its_cap(attempt, delay):
    assert Backoff().delay(attempt) == delay
