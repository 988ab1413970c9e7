"""The loop thread's stall watch: a loop kept from running is logged, a punctual one is not."""

import logging
import time

from tailguard import loop_thread
from tailguard.loop_thread import LoopThread


def test_a_blocked_loop_is_logged_with_the_cpu_it_used(caplog, monkeypatch):
    monkeypatch.setattr(loop_thread, "STALL_WARN_S", 0.2)
    loop = LoopThread("test-loop")
    loop.start()
    try:
        loop.watch_stalls()
        time.sleep(0.3)  # punctual so far
        assert loop.stalls == 0
        with caplog.at_level(logging.WARNING, logger="tailguard.loop"):
            # something on the loop that does not yield (what a blocking call would do)
            loop.submit(_block(0.5)).result(5)
            time.sleep(0.3)
        assert loop.stalls == 1 and loop.longest_stall_s >= 0.3
        assert any("stalled" in r.getMessage() and "CPU-s" in r.getMessage()
                   for r in caplog.records)
        loop.submit(_stop_watching(loop)).result(5)
        loop.submit(_block(0.5)).result(5)
        time.sleep(0.3)
        assert loop.stalls == 1  # not watched any more
    finally:
        loop.stop(timeout=5)


async def _block(seconds: float) -> None:
    time.sleep(seconds)


async def _stop_watching(loop: LoopThread) -> None:
    loop.stop_watching()
