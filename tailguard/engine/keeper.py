"""Keeps one worker's engine serving: start, warm up, and restart after it dies.

    idle ──start──► starting ──warm──► serving ──died──► restarting ──warm──► serving
                        │                                     │
                        └── failed first start ──► failed     └── too many failures ──► failed

Why in-process: a vLLM engine that dies takes only its engine-core process with it;
the worker process, its Celery consumer and the task threads waiting on it are fine.
Building a new ``EngineHost`` (a new AsyncLLM on a new loop thread) and warming it up
brings the worker back without the supervisor, and without Celery redelivering (or
failing) the messages it holds: a task that asks for the engine while it restarts
waits (``get``), so queued work stays queued for the new engine.

A first start that fails is not retried: a model that cannot load here will not
load on a second try, and the worker exits saying why (tailguard/engine/warmup.py). After a
death the restart is retried with exponential backoff; an engine that keeps failing
to come back is given up (``on_give_up``: the worker exits non-zero and its
supervisor restarts the whole process). The backoff also grows with deaths close
together, so a request that kills every engine it reaches cannot make the worker
spin (and such a request is quarantined by the runner after two deaths).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from tailguard.errors import EngineDeadError

log = logging.getLogger("tailguard.worker")


class Host(Protocol):
    """What the keeper needs of an engine host (tailguard.engine.host.EngineHost)."""

    def start(self) -> None: ...
    def shutdown(self) -> None: ...
    @property
    def dead(self) -> bool: ...


H = TypeVar("H", bound=Host)

IDLE, STARTING, SERVING, RESTARTING, FAILED = "idle", "starting", "serving", "restarting", "failed"


@dataclass(frozen=True)
class Backoff:
    """Delay before restart attempt n (1, 2, ...): base * 2**(n-1), capped; the count also
    includes the other deaths within `window_s`, so deaths close together back off too."""

    base_s: float = 1.0
    cap_s: float = 30.0
    #: restart attempts after one death before the worker gives up
    max_attempts: int = 5
    window_s: float = 300.0

    def delay(self, attempt: int) -> float:
        return min(self.cap_s, self.base_s * 2 ** max(0, attempt - 1))


class EngineKeeper(Generic[H]):
    """The current engine host of one worker and its restarts; thread-safe.

    ``build`` makes a new (unstarted) host, ``warm`` proves it can serve (raising if
    not). ``on_up`` runs once a host serves (advertise the lanes), ``on_down`` the
    moment the serving host is reported dead (withdraw them), ``on_give_up`` when
    the keeper stops trying (stop the worker).
    """

    def __init__(self, build: Callable[[], H], warm: Callable[[H], None], *,
                 on_up: Callable[[], None] = lambda: None,
                 on_down: Callable[[], None] = lambda: None,
                 on_give_up: Callable[[BaseException], None] = lambda exc: None,
                 backoff: Backoff = Backoff()) -> None:
        self._build, self._warm = build, warm
        self._on_up, self._on_down, self._on_give_up = on_up, on_down, on_give_up
        self.backoff = backoff
        self._cond = threading.Condition()
        self._state = IDLE
        self._host: H | None = None
        self._error: BaseException | None = None
        self._deaths: deque[float] = deque()
        self._stopped = threading.Event()
        #: how many times a dead engine was replaced by a serving one
        self.restarts = 0

    @property
    def state(self) -> str:
        return self._state

    @property
    def host(self) -> H | None:
        """The latest host (serving or not), for its counters; None before the first build."""
        return self._host

    @property
    def error(self) -> BaseException | None:
        """Why the keeper gave up (state failed)."""
        return self._error

    def start(self, *, background: bool = True) -> None:
        """Start and warm up the first engine (once; later calls do nothing)."""
        with self._cond:
            if self._state != IDLE:
                return
            self._state = STARTING
        if background:
            threading.Thread(target=self._bring_up, args=(False,), name="tailguard-engine-start",
                             daemon=True).start()
        else:
            self._bring_up(False)

    def get(self, timeout: float | None = None) -> H:
        """The serving host; waits while it starts or restarts (starting it if idle).

        Raises EngineDeadError once the keeper has given up or stopped (or after `timeout`).
        """
        if self._state == IDLE:
            self.start(background=False)
        with self._cond:
            ok = self._cond.wait_for(lambda: self._state in (SERVING, FAILED)
                                     or self._stopped.is_set(), timeout)
            if self._state == SERVING and self._host is not None and not self._stopped.is_set():
                return self._host
        if self._stopped.is_set():
            raise EngineDeadError("the worker is stopping")
        if not ok:
            raise EngineDeadError(f"no engine came up within {timeout} s")
        raise EngineDeadError(f"the engine cannot serve: {self._error}")

    def died(self, host: H, why: str = "") -> None:
        """Report that `host` is dead; the first report for the serving host restarts it."""
        with self._cond:
            if host is not self._host or self._state != SERVING or self._stopped.is_set():
                return
            self._state = RESTARTING
            self._deaths.append(time.monotonic())
        log.error("the engine died%s; withdrawing this worker's lanes and restarting it",
                  f" ({why})" if why else "")
        try:
            self._on_down()
        finally:
            threading.Thread(target=self._restart, args=(host,), name="tailguard-engine-restart",
                             daemon=True).start()

    def check(self) -> None:
        """Notice a serving engine that died while no request was in it (polled)."""
        host = self._host
        if self._state == SERVING and host is not None and host.dead:
            self.died(host, "found dead while idle")

    def stop(self) -> None:
        """Stop: no more restarts; waiting callers get EngineDeadError; the host shuts down."""
        self._stopped.set()
        with self._cond:
            self._cond.notify_all()
            host = self._host
        if host is not None:
            host.shutdown()

    # --- internals ---------------------------------------------------------------------

    def _restart(self, dead: H) -> None:
        try:
            dead.shutdown()
        except Exception:  # it is dead already; the new one matters
            log.warning("shutting the dead engine down failed", exc_info=True)
        self._bring_up(True)

    def _bring_up(self, restart: bool) -> None:
        """Build, start and warm up hosts until one serves, or give up."""
        attempt = 0
        while not self._stopped.is_set():
            if restart:
                now = time.monotonic()
                while self._deaths and now - self._deaths[0] > self.backoff.window_s:
                    self._deaths.popleft()
                delay = self.backoff.delay(attempt + len(self._deaths))
                log.info("restarting the engine in %.1f s", delay)
                if self._stopped.wait(delay):
                    break
            attempt += 1
            host = self._build()
            with self._cond:
                self._host = host
            try:
                host.start()
                self._warm(host)
            except BaseException as exc:  # noqa: BLE001 - every failure decides the same way
                try:
                    host.shutdown()
                except Exception:  # noqa: BLE001
                    pass
                if not restart or attempt >= self.backoff.max_attempts:
                    self._fail(exc)
                    return
                log.warning("engine restart attempt %d failed: %s", attempt, exc)
                continue
            with self._cond:
                if self._stopped.is_set():
                    break
                self._state = SERVING
                self.restarts += int(restart)
                self._cond.notify_all()
            if restart:
                log.warning("the engine is back after %d attempt(s); serving again", attempt)
            self._on_up()
            return
        with self._cond:
            self._cond.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            self._state = FAILED
            self._error = exc
            self._cond.notify_all()
        self._on_give_up(exc)
