"""The bridge between a caller's thread and one request running on the engine loop.

The loop reports progress through ``events`` (a thread-safe queue) and the
caller asks for cancellation through ``cancel`` (an asyncio.Event, set on the
loop with ``call_soon``), so neither side ever runs the other's code. User
callbacks run on the caller's thread, never on the loop: they may do blocking
I/O (Redis), and the loop serves every request of the process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import time
from typing import Any, Callable, TypeVar

from tailguard.engine_loop import LoopThread
from tailguard.errors import EngineDeadError

T = TypeVar("T")

#: How often the caller's thread polls should_cancel.
CANCEL_POLL_S = 0.05
#: How long past its deadline a caller waits for the loop before declaring it wedged.
LOOP_GRACE_S = 30.0
#: How long a caller that is giving up waits for its request's abort.
ABORT_WAIT_S = 5.0


class Call:
    """One request: what its caller thread and the loop share."""

    FIRST, DELTA, DONE = "first", "delta", "done"

    def __init__(self, request_id: str, loop: LoopThread, want_deltas: bool) -> None:
        self.request_id = request_id
        self.loop = loop
        self.want_deltas = want_deltas
        self.events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        # Set only on the loop; it binds to the loop on first use, not here.
        self.cancel = asyncio.Event()
        self.cancel_reason: str | None = None  # "cancelled" | "shutdown"

    # --- loop side ---------------------------------------------------------------------

    def first_token(self) -> None:
        self.events.put((Call.FIRST, None))

    def delta(self, text: str) -> None:
        if self.want_deltas:
            self.events.put((Call.DELTA, text))

    # --- caller side -------------------------------------------------------------------

    def request_cancel(self, reason: str) -> None:
        """From any thread: ask the loop to abort this request (the first reason wins)."""
        def _set() -> None:
            if self.cancel_reason is None:
                self.cancel_reason = reason
                self.cancel.set()
        self.loop.call_soon(_set)

    def wait(self, future: concurrent.futures.Future[T], deadline_s: float | None,
             on_first_token: Callable[[], None] | None = None,
             should_cancel: Callable[[], bool] | None = None,
             on_delta: Callable[[str], None] | None = None) -> T:
        """Block this thread until the request's coroutine (`future`) ends; return its result.

        Runs the callbacks as events arrive and polls ``should_cancel`` every
        CANCEL_POLL_S. If a callback raises, this thread is torn down, or the loop has
        not ended the request LOOP_GRACE_S past its deadline (EngineDeadError), the
        request is aborted before the exception reaches the caller.
        """
        future.add_done_callback(lambda _: self.events.put((Call.DONE, None)))
        wait_until = None if deadline_s is None else time.monotonic() + deadline_s + LOOP_GRACE_S
        next_poll = time.monotonic() + CANCEL_POLL_S
        try:
            while True:
                timeout = CANCEL_POLL_S if should_cancel is not None else None
                if wait_until is not None:
                    left = max(0.0, wait_until - time.monotonic())
                    timeout = left if timeout is None else min(timeout, left)
                try:
                    kind, payload = self.events.get(timeout=timeout)
                except queue.Empty:
                    kind, payload = "", None
                if kind == Call.DONE:
                    break
                if kind == Call.FIRST and on_first_token is not None:
                    on_first_token()
                elif kind == Call.DELTA and on_delta is not None:
                    on_delta(payload)
                now = time.monotonic()
                if should_cancel is not None and now >= next_poll:
                    next_poll = now + CANCEL_POLL_S
                    if should_cancel():
                        self.request_cancel("cancelled")
                        should_cancel = None
                if wait_until is not None and now >= wait_until and not future.done():
                    raise EngineDeadError(
                        f"the engine loop did not end request {self.request_id} "
                        f"{LOOP_GRACE_S:.0f} s past its deadline")
        except BaseException:
            # Do not leave the request running on the engine. Wait (briefly) for the
            # abort, so the engine is clean when the exception reaches the caller.
            if not future.done():
                self.request_cancel("cancelled")
                concurrent.futures.wait([future], timeout=ABORT_WAIT_S)
                future.cancel()
            raise
        return future.result()
