"""What tailguard adds to an OpenAI request around vLLM's own validation: its class, the fields
it refuses or ignores, the lane's grant of max_tokens, the task's `openai` argument."""

from __future__ import annotations

import pytest

from tailguard.errors import InvalidField
from tailguard.gateway.openai_request import (
    REFUSED_FIELDS,
    OpenAIJob,
    grant,
    prompt_text_bytes,
    requested_max_tokens,
    split_body,
    task_argument,
    text_bytes,
)
from tailguard.jobs.task_message import kwargs_repr
from tailguard.lanes.placement import place
from tailguard.lanes.table import Lane
from tailguard.observe.metrics import MAX_IGNORED_FIELD_LABELS, UNLISTED_FIELD, GatewayMetrics

KNOWN = {"model", "messages", "max_tokens", "max_completion_tokens", "priority", "stream", "n",
         "use_beam_search", "kv_transfer_params", "temperature"}
HI = [{"role": "user", "content": "hi"}]


def test_a_class_name_is_tailguards_priority_and_leaves_the_body():
    split = split_body({"messages": HI, "priority": "batch"}, KNOWN)
    assert split.priority == "batch" and split.body == {"messages": HI}


def test_an_integer_priority_is_vllms_and_stays():
    split = split_body({"messages": HI, "priority": -3}, KNOWN)
    assert split.priority == "interactive" and split.body["priority"] == -3


def test_an_unknown_class_is_a_400_naming_priority():
    with pytest.raises(InvalidField) as exc:
        split_body({"messages": HI, "priority": "urgent"}, KNOWN)
    assert exc.value.field == "priority" and "interactive" in exc.value.message


def test_unknown_fields_are_ignored_as_vllm_ignores_them_and_named():
    body = {"messages": HI, "store": True, "metadata": {"k": "v"}, "service_tier": "auto"}
    split = split_body(body, KNOWN)
    assert split.ignored == ("metadata", "service_tier", "store")
    assert split.body == {"messages": HI}
    assert body["store"] is True  # the client's body is not changed


@pytest.mark.parametrize("name,value", [("guided_json", {"type": "object"}), ("guided_choice", ["a"]),
                                        ("guided_regex", "a+"), ("kv_transfer_params", {"x": 1}),
                                        ("use_beam_search", True)])
def test_the_documented_refusals_are_400s_with_their_reason(name, value):
    with pytest.raises(InvalidField) as exc:
        split_body({"messages": HI, name: value}, KNOWN)
    assert exc.value.field == name and REFUSED_FIELDS[name] in exc.value.message


@pytest.mark.parametrize("name,value", [("use_beam_search", False), ("kv_transfer_params", None),
                                        ("guided_json", None)])
def test_a_refused_field_that_asks_for_nothing_passes(name, value):
    assert split_body({"messages": HI, name: value}, KNOWN).priority == "interactive"


@pytest.mark.parametrize("body,where", [
    ({"top_k": 10**30}, "top_k"), ({"seed": -(2**63) - 1}, "seed"),
    ({"prompt": [5, 2**64]}, "prompt.1"), ({"logit_bias": {"5": 2**70}}, "logit_bias.5"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "n": 2**63}]}]},
     "messages.0.content.0.n"),
])
def test_an_integer_no_engine_message_can_carry_is_a_400_naming_it(body, where):
    with pytest.raises(InvalidField) as exc:
        split_body(body, KNOWN | {"top_k", "seed", "prompt", "logit_bias"})
    assert exc.value.field == where


def test_integers_within_64_bits_and_booleans_pass_and_ignored_fields_are_not_looked_at():
    body = {"seed": 2**63 - 1, "top_k": -(2**63), "stream": True}
    assert split_body({**body, "x_trace": 2**99}, KNOWN | {"seed", "top_k"}).body == body


def test_a_body_that_is_not_an_object_is_a_400():
    with pytest.raises(InvalidField):
        split_body([HI], KNOWN)


@pytest.mark.parametrize("endpoint,body,wanted", [
    ("chat", {"max_tokens": 5}, 5),
    ("chat", {"max_tokens": 5, "max_completion_tokens": 7}, 7),  # vLLM reads this one first
    ("chat", {"max_completion_tokens": None, "max_tokens": 5}, 5),
    ("chat", {}, None),
    ("completion", {"max_completion_tokens": 7}, None),  # not a completions field
    ("completion", {"max_tokens": 9}, 9),
])
def test_what_the_client_asked_for(endpoint, body, wanted):
    assert requested_max_tokens(endpoint, body) == wanted


SHORT = Lane("short", max_tokens=64, max_cost=256, default_max_tokens=16, max_model_len=1024)
LONG = Lane("long", max_tokens=1500, default_max_tokens=32, max_model_len=2048)
LANES = (SHORT, LONG)


def job(prompt_tokens: int, vllm_max_tokens: int, max_tokens: int | None = None, n: int = 1):
    return OpenAIJob(endpoint="chat", request={"messages": HI}, prompt_tokens=prompt_tokens,
                     vllm_max_tokens=vllm_max_tokens, max_tokens=max_tokens, n=n)


def granted(j: OpenAIJob):
    placement = place(LANES, priority="interactive", prompt_tokens=j.prompt_tokens,
                      requested_max_tokens=j.max_tokens, model_max_len=2048)
    lane = {lane.name: lane for lane in LANES}[placement.lane]
    return grant(placement, lane, j)


@pytest.mark.parametrize("prompt,vllm,asked,lane,max_tokens,capped", [
    # omitted: placed with the lane's default (a chat whose vLLM default is the rest of the
    # context stays on short), granted vLLM's default within the lane's cap
    (19, 2029, None, "short", 64, True),
    # ... and within short's max_cost: 200 + 56 = 256
    (200, 1848, None, "short", 56, True),
    # a completion's vLLM default of 16 is what it gets
    (19, 16, None, "short", 16, False),
    # asked: placed as today, granted min(asked, lane cap, context left)
    (19, 50, 50, "short", 50, False),
    (19, 1000, 1000, "long", 1000, False),
    (19, 2029, 5000, "long", 1500, True),
    # vLLM itself lowers an asked value to its context: that is not a cap of tailguard's
    (1900, 148, 1000, "long", 148, False),
])
def test_the_lane_grants_vllms_max_tokens_within_its_cap(prompt, vllm, asked, lane, max_tokens, capped):
    p = granted(job(prompt, vllm, asked))
    assert (p.lane, p.max_tokens, p.max_tokens_capped) == (lane, max_tokens, capped)
    assert p.requested_max_tokens == asked
    assert p.cost == prompt + max_tokens


def test_each_of_n_sequences_counts_in_the_cost():
    p = granted(job(19, 2029, 50, n=4))
    assert (p.max_tokens, p.cost) == (50, 19 + 4 * 50)


def test_the_task_argument_is_the_contract():
    j = OpenAIJob(endpoint="chat", request={"messages": HI, "max_completion_tokens": 5000,
                                           "request_id": "theirs", "priority": 2},
                  prompt_tokens=19, vllm_max_tokens=2029, max_tokens=5000)
    p = granted(j)
    arg = task_argument(j, "0123456789abcdef0123456789abcdef", p)
    assert arg == {"endpoint": "chat", "prompt_tokens": 19, "capped": True, "request": {
        "messages": HI, "priority": 2, "max_tokens": 1500, "max_completion_tokens": 1500,
        "request_id": "theirs"}}
    assert j.request["max_completion_tokens"] == 5000  # the job's own body is left as it was


def test_a_completion_gets_max_tokens_only():
    j = OpenAIJob(endpoint="completion", request={"prompt": "hi"}, prompt_tokens=3,
                  vllm_max_tokens=16)
    arg = task_argument(j, "f" * 32, granted(j))
    assert arg["request"] == {"prompt": "hi", "max_tokens": 16, "request_id": "f" * 32}
    assert arg["capped"] is False


def test_the_message_preview_shows_no_text_of_the_request():
    j = OpenAIJob(endpoint="chat", request={"messages": [{"role": "user", "content": "secret plan"}]},
                  prompt_tokens=19, vllm_max_tokens=2029)
    kwargs = {"job_id": "f" * 32, "prompt": "", "max_tokens": 64, "sampling": {}, "deadline_s": 30,
              "openai": task_argument(j, "f" * 32, granted(j))}
    shown = kwargs_repr(kwargs)
    assert "secret" not in shown and "characters>" in shown and "'prompt_tokens': 19" in shown


def test_prompt_bytes_count_every_string_of_the_prompt_fields_in_utf8():
    assert text_bytes({"a": ["é", {"b": "xy"}], "n": 3}) == len("a") + 2 + len("b") + 2 + len("n")
    body = {"messages": [{"role": "user", "content": "语"}], "tools": [{"type": "function"}],
            "temperature": 0.5, "metadata": {"x" * 100: "y"}}
    assert prompt_text_bytes(body) == (4 + 4 + 7 + 3) + (4 + 8)


def test_a_deep_body_costs_no_stack():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert text_bytes(deep) == 0


def test_ignored_field_labels_are_bounded():
    metrics = GatewayMetrics(["short"])
    metrics.on_ignored_fields("chat", ["store", "store", "Bad-Name!", "x" * 41])
    names = [f"f{i}" for i in range(MAX_IGNORED_FIELD_LABELS + 10)]
    metrics.on_ignored_fields("completion", names)
    samples = {(s.labels["endpoint"], s.labels["field"]): s.value
               for m in metrics.registry.collect() if m.name == "tailguard_openai_ignored_fields"
               for s in m.samples if s.name.endswith("_total")}
    assert samples[("chat", "store")] == 2 and samples[("chat", UNLISTED_FIELD)] == 2
    fields = {f for _, f in samples}
    assert len(fields - {UNLISTED_FIELD}) == MAX_IGNORED_FIELD_LABELS  # store, then 63 of the f's
    assert samples[("completion", UNLISTED_FIELD)] == 11


# --- ids as vLLM makes them (OpenAIServing._base_request_id, then chatcmpl-/cmpl-) ------------

@pytest.mark.parametrize(("endpoint", "header", "body_id", "expected"), [
    ("chat", None, None, "chatcmpl-job1"),            # vLLM: a fresh id; here the job's
    ("chat", None, "mine", "chatcmpl-mine"),          # the body's request_id
    ("chat", "trace-42", "mine", "chatcmpl-trace-42"),  # X-Request-Id before the body's
    ("completion", "trace-42", None, "cmpl-trace-42"),
    ("completion", None, "mine", "cmpl-mine"),
    ("completion", "", "mine", "cmpl-"),              # vLLM takes any header present, even empty
])
def test_vllms_id_comes_from_the_header_then_the_body_then_the_job(endpoint, header, body_id,
                                                                    expected):
    request = {"prompt": "hi"} if body_id is None else {"prompt": "hi", "request_id": body_id}
    j = OpenAIJob(endpoint=endpoint, request=request, prompt_tokens=3, vllm_max_tokens=16,
                  header_request_id=header)
    assert j.request_id("job1") == expected
    # the worker's serving class gets the base and builds the same id from it
    arg = task_argument(j, "job1", granted(j))
    assert f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-{arg['request']['request_id']}" == expected
    assert j.record_fields("job1") == {"sampling": {}, "openai": endpoint, "request_id": expected}
