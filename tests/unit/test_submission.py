"""The two request kinds on the gateway's one submit path (tailguard.gateway.service.Submission):
each places itself and says what its job record and its lane's task carry of their own."""

from __future__ import annotations

import pytest

from tailguard.errors import InvalidField
from tailguard.gateway.job_request import JobRequest
from tailguard.gateway.openai_request import OpenAIJob
from tailguard.lanes.latency_targets import TargetBounds
from tailguard.lanes.table import Lane, LaneTable

LANES = LaneTable(lanes=(Lane("short", max_tokens=64, max_cost=256, default_max_tokens=16,
                              max_model_len=1024),
                         Lane("long", max_tokens=1500, default_max_tokens=32, max_model_len=2048)))


def test_a_native_request_counts_its_prompt_with_the_gateways_counter():
    counted = []

    def count(prompt: str, add_special_tokens: bool) -> int:
        counted.append((prompt, add_special_tokens))
        return 10

    req = JobRequest(prompt="hi", max_tokens=8, sampling={"temperature": 0.0},
                     add_special_tokens=False)
    placement = req.place(LANES, count, 2048)
    assert counted == [("hi", False)]
    assert (placement.lane, placement.prompt_tokens, placement.max_tokens) == ("short", 10, 8)
    assert req.record_fields("j") == {"sampling": {"temperature": 0.0}}
    assert req.task_kwargs("j", placement) == {"prompt": "hi", "sampling": {"temperature": 0.0},
                                                "add_special_tokens": False}
    assert "add_special_tokens" not in JobRequest(prompt="hi").task_kwargs("j", placement)


def test_a_native_min_tokens_above_the_max_tokens_it_gets_is_a_400():
    req = JobRequest(prompt="hi", sampling={"min_tokens": 100})
    with pytest.raises(InvalidField) as err:
        req.place(LANES, lambda prompt, special: 10, 2048)
    assert err.value.field == "min_tokens"


def test_an_openai_request_is_placed_with_vllms_count_and_granted_and_verified():
    verified = []
    job = OpenAIJob(endpoint="chat", request={"messages": []}, prompt_tokens=19,
                    vllm_max_tokens=2029, verify=verified.append)

    def never(prompt: str, add_special_tokens: bool) -> int:
        raise AssertionError("vLLM's render counted it already")

    placement = job.place(LANES, never, 2048)
    assert (placement.lane, placement.max_tokens, placement.max_tokens_capped) == ("short", 64, True)
    assert verified == [64]
    assert job.record_fields("j") == {"sampling": {}, "openai": "chat", "request_id": "chatcmpl-j"}
    kwargs = job.task_kwargs("j", placement)
    assert (kwargs["prompt"], kwargs["sampling"]) == ("", {})
    assert kwargs["openai"]["request"]["request_id"] == "j"
    assert kwargs["openai"]["request"]["max_tokens"] == 64


@pytest.mark.parametrize("sent,floor,applied", [
    (-10, 0, 0),        # more urgent than the key may ask: raised to its floor
    (5, 0, 5),
    (-10, None, -10),   # a key without the bound
    (None, 0, None),    # none sent: none added
])
def test_vllms_priority_is_bounded_by_the_key(sent, floor, applied):
    request = {"messages": []} | ({} if sent is None else {"priority": sent})
    job = OpenAIJob(endpoint="chat", request=request, prompt_tokens=1, vllm_max_tokens=8)
    bounded = job.within(TargetBounds(min_vllm_priority=floor))
    assert bounded.request.get("priority") == applied
    native = JobRequest(prompt="hi")
    assert native.within(TargetBounds(min_vllm_priority=0)) is native
