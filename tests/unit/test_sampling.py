"""The sampling table: each row's type and bounds, which API takes it, what the engine gets."""

import ast
import importlib.util
from pathlib import Path

import pytest

from tailguard.errors import InvalidField
from tailguard.sampling import (
    BY_NAME,
    FIELDS,
    MAX_SAMPLING_BYTES,
    MAX_STOP_CHARS,
    MAX_TOKENS,
    as_float,
    as_int,
    field_names,
    parse_sampling,
    vllm_kwargs,
)

# name -> (accepted value, what it becomes), refused values
CASES = {
    "max_tokens": ((1, 1), [0, -1, 1.5, "8", True, None]),
    "temperature": ((0, 0.0), [-0.01, 2.01, "hot", True, None]),
    "top_p": ((1, 1.0), [0, -0.5, 1.01, False]),
    "top_k": ((-1, -1), [0, -2, 1.5, "5"]),
    "stop": (("\n", ["\n"]), ["", ["a", 1], ["a", ""], ["a"] * 5, 3, "x" * (MAX_STOP_CHARS + 1)]),
    "seed": ((-7, -7), [1.5, "1", True]),
    "ignore_eos": ((True, True), [1, "yes", None]),
    "min_tokens": ((0, 0), [-1, 0.5]),
    "repetition_penalty": ((2, 2.0), [0, -1, 2.5]),
    "frequency_penalty": ((-2, -2.0), [-2.5, 2.01, "0"]),
    "presence_penalty": ((2, 2.0), [-2.01, 3, [0]]),
}


def test_every_row_has_cases():
    assert set(CASES) == set(BY_NAME) and len(BY_NAME) == len(FIELDS)


@pytest.mark.parametrize("name", list(CASES))
def test_accepts_and_converts(name):
    value, parsed = CASES[name][0]
    assert BY_NAME[name].parse(value) == parsed
    assert type(BY_NAME[name].parse(value)) is type(parsed)


@pytest.mark.parametrize("name,value", [(n, v) for n, (_, bad) in CASES.items() for v in bad])
def test_refuses_naming_the_field(name, value):
    with pytest.raises(InvalidField) as err:
        BY_NAME[name].parse(value)
    assert (err.value.field, err.value.http_status) == (name, 400)


def test_a_field_can_be_named_as_the_caller_sent_it():
    with pytest.raises(InvalidField) as err:
        MAX_TOKENS.parse(0, "max_completion_tokens")
    assert err.value.field == "max_completion_tokens"
    assert "max_completion_tokens must be >= 1" in err.value.message


@pytest.mark.parametrize("name,lo,hi,lo_open,ok,bad,message", [
    ("t", 0.0, 2.0, False, [0, 2, 1.5], [-0.1, 2.1], "t must be >= 0.0 and <= 2.0"),
    ("p", 0.0, 1.0, True, [1, 0.01], [0, 1.1], "p must be > 0.0 and <= 1.0"),
    ("x", -2.0, None, False, [-2, 1e9], [-3], "x must be >= -2.0"),
    ("y", None, 1.0, False, [-1e9, 1], [2], "y must be <= 1.0"),
])
def test_float_bounds(name, lo, hi, lo_open, ok, bad, message):
    for v in ok:
        assert as_float(name, v, lo, hi, lo_open=lo_open) == float(v)
    for v in bad:
        with pytest.raises(InvalidField, match=message):
            as_float(name, v, lo, hi, lo_open=lo_open)


def test_int_bounds():
    assert as_int("n", 1, 1) == 1 and as_int("n", -5) == -5
    with pytest.raises(InvalidField, match="n must be >= 1, got 0"):
        as_int("n", 0, 1)
    with pytest.raises(InvalidField, match="top_k must be -1 \\(off\\) or >= 1, got 0"):
        BY_NAME["top_k"].parse(0)


@pytest.mark.parametrize("api,names", [
    ("native", {"max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "ignore_eos",
                "min_tokens", "repetition_penalty"}),
    ("openai", set(BY_NAME)),
])
def test_which_api_takes_which_field(api, names):
    assert set(field_names(api)) == names


def test_parse_sampling_keeps_what_the_client_set_and_drops_nulls_and_other_apis_fields():
    """A field absent from the result is one the client did not set: the engine fills those
    from the model's generation config, so a set 0 must stay (it overrides that default)."""
    body = {"temperature": 0, "top_p": None, "frequency_penalty": 0, "presence_penalty": 0.5,
            "prompt": "not sampling"}
    assert parse_sampling(body, "openai") == {"temperature": 0.0, "frequency_penalty": 0.0,
                                              "presence_penalty": 0.5}
    assert parse_sampling(body, "native") == {"temperature": 0.0}


def test_vllm_kwargs_keep_table_fields_only():
    assert vllm_kwargs({"max_tokens": 4, "temperature": None, "stop": ["x"], "prompt": "p"}) == \
        {"max_tokens": 4, "stop": ["x"]}


def test_every_row_is_a_vllm_sampling_params_field():
    """Read from vLLM's source (importing it would load torch): the names must match."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    source = Path(spec.submodule_search_locations[0], "sampling_params.py").read_text()
    [cls] = [node for node in ast.parse(source).body
             if isinstance(node, ast.ClassDef) and node.name == "SamplingParams"]
    fields = {node.target.id for node in cls.body
              if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    assert set(BY_NAME) <= fields


def test_the_sampling_payload_is_bounded_as_a_whole():
    longest = ["停" * MAX_STOP_CHARS] * 4  # each within bounds: 3 bytes a character
    assert len(parse_sampling({"stop": longest[:1]}, "native")["stop"][0]) == MAX_STOP_CHARS
    assert 4 * 3 * MAX_STOP_CHARS > MAX_SAMPLING_BYTES
    with pytest.raises(InvalidField, match="bytes") as exc:
        parse_sampling({"stop": longest}, "native")
    assert exc.value.field == "stop"
