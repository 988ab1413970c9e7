"""Validation of submissions: every bad field is a 400 naming that field."""

import pytest

from tailguard.errors import InvalidField
from tailguard.gateway.job_request import parse_job_request


def test_minimal_request():
    req = parse_job_request({"prompt": "解释什么是Transformer"})
    assert (req.prompt, req.max_tokens, req.priority, req.sampling) == \
        ("解释什么是Transformer", None, "interactive", {})


def test_sampling_fields_pass_through_with_openai_names():
    req = parse_job_request({"prompt": "p", "max_tokens": 8, "temperature": 0, "top_p": 0.9,
                             "top_k": 5, "stop": "\n", "seed": 1, "ignore_eos": True,
                             "min_tokens": 2, "repetition_penalty": 1.1, "priority": "batch"})
    assert req.sampling == {"temperature": 0.0, "top_p": 0.9, "top_k": 5, "stop": ["\n"],
                            "seed": 1, "ignore_eos": True, "min_tokens": 2,
                            "repetition_penalty": 1.1}
    assert req.priority == "batch" and req.max_tokens == 8


@pytest.mark.parametrize("body,field", [
    ([], "body"),
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": "p", "max_tokens": "64"}, "max_tokens"),
    ({"prompt": "p", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "p", "max_tokens": 1.5}, "max_tokens"),
    ({"prompt": "p", "max_tokens": True}, "max_tokens"),
    ({"prompt": "p", "temperature": -1}, "temperature"),
    ({"prompt": "p", "temperature": "hot"}, "temperature"),
    ({"prompt": "p", "top_p": 0}, "top_p"),
    ({"prompt": "p", "top_k": 0}, "top_k"),
    ({"prompt": "p", "stop": ["a", 1]}, "stop"),
    ({"prompt": "p", "stop": ["a"] * 5}, "stop"),
    ({"prompt": "p", "ignore_eos": "yes"}, "ignore_eos"),
    ({"prompt": "p", "priority": "urgent"}, "priority"),
    ({"prompt": "p", "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ({"prompt": "p", "max_token": 4}, "max_token"),
    ({"prompt": "p", "frequency_penalty": 0.5}, "frequency_penalty"),  # OpenAI API only
])
def test_bad_field_is_named(body, field):
    with pytest.raises(InvalidField) as err:
        parse_job_request(body)
    assert err.value.field == field
    assert err.value.http_status == 400
