"""The bridge between a caller's thread and one request running on the engine loop.

The loop reports progress through ``events`` (a thread-safe queue) and the
caller asks for cancellation through ``cancel`` (an asyncio.Event, set on the
loop with ``call_soon``), so neither side ever runs the other's code. User
callbacks run on the caller's thread, never on the loop: they may do blocking
I/O (Redis), and the loop serves every request of the process.

Output is handed over in batches: the first piece wakes the caller at once (time to
first token), later ones collect until the caller's next tick (every
``CANCEL_POLL_S``, the pace at which a job's stream is written anyway). Waking a
thread per token cost the front end a thread switch per token and request, on the
core the API and Redis share (docs/cpu-hosts.md, "Where the front end runs"). A piece
is a text delta (``generate``) or one of vLLM's SSE payloads (an OpenAI request).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tailguard.errors import EngineDeadError
from tailguard.loop_thread import LoopThread

T = TypeVar("T")

#: How often the caller's thread polls should_cancel and takes the text collected meanwhile.
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
        self._pending: list[str] = []  # pieces of output the caller has not taken yet
        self._pending_lock = threading.Lock()
        self._woken = False  # the first piece woke the caller; later ones wait

    # --- loop side ---------------------------------------------------------------------

    def first_token(self) -> None:
        self.events.put((Call.FIRST, None))

    def delta(self, piece: str) -> None:
        """One piece of output: a text delta, or an SSE payload."""
        if not self.want_deltas:
            return
        with self._pending_lock:
            self._pending.append(piece)
            wake, self._woken = not self._woken, True
        if wake:
            self.events.put((Call.DELTA, None))

    def _take(self) -> list[str]:
        with self._pending_lock:
            pieces, self._pending = self._pending, []
        return pieces

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
             on_delta: Callable[[str], None] | None = None,
             on_pieces: Callable[[list[str]], None] | None = None) -> T:
        """Block this thread until the request's coroutine (`future`) ends; return its result.

        Runs the callbacks as events arrive (``on_delta`` with all the text that came since
        its last call, joined; ``on_pieces`` with the pieces themselves, in order: the module
        docstring) and polls ``should_cancel`` every
        CANCEL_POLL_S. If a callback raises, this thread is torn down, or the loop has
        not ended the request LOOP_GRACE_S past its deadline (EngineDeadError), the
        request is aborted before the exception reaches the caller.
        """
        future.add_done_callback(lambda _: self.events.put((Call.DONE, None)))
        wait_until = None if deadline_s is None else time.monotonic() + deadline_s + LOOP_GRACE_S
        next_poll = time.monotonic() + CANCEL_POLL_S
        try:
            while True:
                ticking = should_cancel is not None or on_delta is not None or on_pieces is not None
                timeout = CANCEL_POLL_S if ticking else None
                if wait_until is not None:
                    left = max(0.0, wait_until - time.monotonic())
                    timeout = left if timeout is None else min(timeout, left)
                try:
                    kind, _ = self.events.get(timeout=timeout)
                except queue.Empty:
                    kind = ""
                if kind == Call.FIRST and on_first_token is not None:
                    on_first_token()
                if (on_delta is not None or on_pieces is not None) and (pieces := self._take()):
                    if on_pieces is not None:
                        on_pieces(pieces)
                    else:
                        on_delta("".join(pieces))
                if kind == Call.DONE:
                    break
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
