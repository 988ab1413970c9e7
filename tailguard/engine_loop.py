"""An asyncio event loop on its own daemon thread, for code that lives on one loop.

vLLM's ``AsyncLLM`` belongs to the loop it was built on (its output handler is a
task there), while Celery's task threads are plain threads: they reach the loop
only through ``submit`` and ``call_soon``, which are safe from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any, Callable, Coroutine, TypeVar

log = logging.getLogger("tailguard.engine")

T = TypeVar("T")

#: How long stopping waits for tasks still on the loop to finish their cancellation.
_DRAIN_S = 5


class LoopThread:
    """Owns one event loop and the daemon thread that runs it, from start() to stop()."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

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
