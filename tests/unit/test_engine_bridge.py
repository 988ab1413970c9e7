"""The engine host's parts that need no engine: the loop thread, the thread->loop bridge
and the counters, driven by plain coroutines standing in for a vLLM request."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tailguard.engine.bridge import Call
from tailguard.engine.stats import HostCounters, HostStats
from tailguard.loop_thread import LoopThread


@pytest.fixture
def loop():
    lt = LoopThread("test-loop")
    lt.start()
    yield lt
    lt.stop(timeout=5)
    assert not lt.running


async def stream(call: Call, pieces: list[str], pause_s: float = 0.0) -> str:
    """A request on the loop: reports progress, stops early if asked to cancel."""
    call.first_token()
    sent = []
    for text in pieces:
        if call.cancel.is_set():
            return "cancelled:" + "".join(sent)
        call.delta(text)
        sent.append(text)
        await asyncio.sleep(pause_s)
    return "done:" + "".join(sent)


def test_callbacks_run_on_the_callers_thread_and_the_result_comes_back(loop):
    call = Call("r1", loop, want_deltas=True)
    seen: list[tuple[str, str]] = []
    me = threading.current_thread().name
    result = call.wait(loop.submit(stream(call, ["a", "b"])), deadline_s=10,
                       on_first_token=lambda: seen.append(("first", threading.current_thread().name)),
                       on_delta=lambda t: seen.append((t, threading.current_thread().name)))
    assert result == "done:ab"
    assert seen[0] == ("first", me)  # before any text
    assert all(thread == me for _, thread in seen)
    assert "".join(text for text, _ in seen[1:]) == "ab"  # in order, maybe batched


def test_text_after_the_first_delta_comes_in_batches_not_one_wake_per_token(loop):
    call = Call("r4", loop, want_deltas=True)
    batches: list[str] = []
    result = call.wait(loop.submit(stream(call, ["x"] * 200, pause_s=0.001)), deadline_s=10,
                       on_delta=batches.append)
    assert result == "done:" + "x" * 200 and "".join(batches) == "x" * 200
    # one call per token would be 200; batched, it is one per tick of the caller (plus the
    # first), however slowly the loop runs
    assert len(batches) < 100


def test_should_cancel_reaches_the_request_on_the_loop(loop):
    call = Call("r2", loop, want_deltas=False)
    result = call.wait(loop.submit(stream(call, ["x"] * 1000, pause_s=0.01)), deadline_s=10,
                       should_cancel=lambda: True)
    assert result.startswith("cancelled:") and call.cancel_reason == "cancelled"


def test_a_raising_callback_cancels_the_request_and_propagates(loop):
    call = Call("r3", loop, want_deltas=True)
    future = loop.submit(stream(call, ["x"] * 1000, pause_s=0.01))

    def boom(_: str) -> None:
        raise RuntimeError("client gone")

    with pytest.raises(RuntimeError, match="client gone"):
        call.wait(future, deadline_s=10, on_delta=boom)
    assert future.done() and call.cancel_reason == "cancelled"


def test_pieces_come_as_they_were_put_in_order_and_never_joined(loop):
    # an OpenAI request's SSE payloads: each stays one piece, batched per tick like text
    call = Call("r9", loop, want_deltas=True)
    payloads = [f'{{"n":{i}}}' for i in range(100)]
    batches: list[list[str]] = []
    result = call.wait(loop.submit(stream(call, payloads, pause_s=0.001)), deadline_s=10,
                       on_pieces=batches.append)
    assert result.startswith("done:")
    assert [p for batch in batches for p in batch] == payloads
    assert all(batches) and len(batches) < len(payloads)


def test_counters_snapshot_is_a_copy_and_tracks_outcomes():
    counters = HostCounters()
    counters.entered()
    counters.entered()
    counters.first_token()
    first = counters.snapshot()
    counters.left(decoded=True, outcome="aborted", engine_unfinished=1)
    counters.left(decoded=False, outcome="completed", engine_unfinished=0)
    counters.rejected()
    assert first == HostStats(in_flight=2, peak_in_flight=2, decoding=1, peak_decoding=1)
    assert counters.snapshot() == HostStats(peak_in_flight=2, peak_decoding=1, completed=1,
                                            aborted=1, failed=1, engine_unfinished=0)
