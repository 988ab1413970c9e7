"""An asyncio event loop on its own daemon thread, for code that lives on one loop.

What lives there belongs to the loop it was built on: vLLM's ``AsyncLLM`` in a
worker (its output handler is a task there), vLLM's render layer in the API.
The callers are plain threads (Celery's task threads, Flask's request threads):
they reach the loop only through ``submit`` and ``call_soon``, which are safe
from any thread.

Every request of the process goes through this one loop, so a loop that does not
run for a while delays every request at once. The loop watches its own
punctuality and logs each stall longer than ``STALL_WARN_S``, with the CPU time
this process used meanwhile: about the stall's length means something in this
process held the GIL (or the loop itself ran something long); near zero means the
process got no CPU (other processes on its cores) or was blocked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("tailguard.loop")

T = TypeVar("T")

#: How long stopping waits for tasks still on the loop to finish their cancellation.
_DRAIN_S = 5
#: The loop checks its punctuality this often, and logs a tick later than STALL_WARN_S.
LAG_CHECK_S = 0.1
STALL_WARN_S = 0.5


class LoopThread:
    """Owns one event loop and the daemon thread that runs it, from start() to stop()."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        #: loop stalls longer than STALL_WARN_S so far, and the longest (seconds)
        self.stalls = 0
        self.longest_stall_s = 0.0
        self._watch: asyncio.Task[None] | None = None  # the stall watch, once started

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._loop.is_running()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on the loop from any thread; its result comes back in the future."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop from any thread; a no-op once the loop is closed."""
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:  # closed: nothing is left to act on
            pass

    def watch_stalls(self) -> None:
        """From now on, log each stall of the loop (the module docstring). Called once the
        code that may block the loop on purpose (building an engine, a render layer) is done."""

        def start() -> None:
            if self._watch is None:
                self._watch = self._loop.create_task(self._watch_lag())
        self.call_soon(start)

    def stop_watching(self) -> None:
        """On the loop: no more stall warnings (before blocking it on purpose, to shut down)."""
        if self._watch is not None:
            self._watch.cancel()

    def stop(self, timeout: float) -> None:
        """Stop the loop (its pending tasks are cancelled) and join the thread."""
        self.call_soon(self._loop.stop)
        if self._thread.ident is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("event loop thread %s did not stop within %.0f s", self.name, timeout)

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=_DRAIN_S))
            loop.close()

    async def _watch_lag(self) -> None:
        while True:
            start, cpu = time.monotonic(), time.process_time()
            await asyncio.sleep(LAG_CHECK_S)
            late = time.monotonic() - start - LAG_CHECK_S
            if late > STALL_WARN_S:
                self.stalls += 1
                self.longest_stall_s = max(self.longest_stall_s, late)
                log.warning("event loop %s stalled %.2f s; this process used %.2f CPU-s meanwhile",
                            self.name, late, time.process_time() - cpu)
