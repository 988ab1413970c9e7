"""The one table of sampling fields: what a request may set, how it is checked, what the engine gets.

Names are OpenAI's and vLLM's (each is the keyword of vLLM's ``SamplingParams``
with the same meaning), so a caller reuses what it already sends to vLLM. The
native API (``jobrequest.py``), the OpenAI API (``openai_protocol.py``) and the
engine (``engine.sampling_params``) all read this table; a field added here is
accepted, validated and passed to vLLM everywhere at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tailguard.errors import InvalidField

Api = Literal["native", "openai"]
Kind = Literal["int", "float", "bool", "stop"]

#: Longest stop string, in characters: vLLM matches each against the growing output text, so
#: their length is work done per token, and their count is bounded by the table.
MAX_STOP_CHARS = 256
#: Largest sampling payload (the validated fields as compact JSON): it travels in every queue
#: message and job record.
MAX_SAMPLING_BYTES = 2048


def as_int(name: str, value: Any, lo: int | None = None) -> int:
    """``value`` if it is an integer (not a bool) >= lo, else InvalidField naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidField(f"{name} must be an integer, got {type(value).__name__}", field=name)
    if lo is not None and value < lo:
        raise InvalidField(f"{name} must be >= {lo}, got {value}", field=name)
    return value


def as_float(name: str, value: Any, lo: float | None = None, hi: float | None = None, *,
             lo_open: bool = False) -> float:
    """``value`` as a float if it is a number within [lo, hi] (or (lo, hi]), else InvalidField."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidField(f"{name} must be a number, got {type(value).__name__}", field=name)
    value = float(value)
    below = lo is not None and (value <= lo if lo_open else value < lo)
    if below or (hi is not None and value > hi):
        bounds = ([f"{'>' if lo_open else '>='} {lo}"] if lo is not None else []) + \
                 ([f"<= {hi}"] if hi is not None else [])
        raise InvalidField(f"{name} must be {' and '.join(bounds)}, got {value}", field=name)
    return value


def as_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidField(f"{name} must be true or false", field=name)
    return value


def as_stop(name: str, value: Any, most: int) -> list[str]:
    """A stop string or a list of at most ``most`` of them, as a list."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise InvalidField(f"{name} must be a non-empty string or a list of them", field=name)
    if len(items) > most:
        raise InvalidField(f"{name} takes at most {most} sequences", field=name)
    if any(len(s) > MAX_STOP_CHARS for s in items):
        raise InvalidField(f"{name}: each sequence may be at most {MAX_STOP_CHARS} characters",
                           field=name)
    return items


@dataclass(frozen=True)
class SamplingField:
    """One row of the table: a request field that becomes a ``SamplingParams`` keyword."""

    name: str  # as OpenAI and vLLM spell it, and the SamplingParams keyword it sets
    kind: Kind
    lo: float | None = None  # lower bound (numbers)
    hi: float | None = None  # upper bound (numbers); for "stop", how many sequences
    lo_open: bool = False  # the bound lo itself is refused
    off: int | None = None  # a value below lo that means "disabled" (top_k's -1)
    native: bool = True  # the native API takes it too (the OpenAI API takes every field)
    inert: float | None = None  # a value that does nothing: dropped, not sent to the engine

    def accepted_by(self, api: Api) -> bool:
        return api == "openai" or self.native

    def parse(self, value: Any, name: str | None = None) -> Any:
        """The validated value, or InvalidField naming ``name`` (the field's own name by default)."""
        name = name or self.name
        if self.kind == "bool":
            return as_bool(name, value)
        if self.kind == "stop":
            return as_stop(name, value, int(self.hi))
        if self.kind == "float":
            return as_float(name, value, self.lo, self.hi, lo_open=self.lo_open)
        value = as_int(name, value)
        if self.lo is not None and value < self.lo and value != self.off:
            allowed = f">= {self.lo}" if self.off is None else f"{self.off} (off) or >= {self.lo}"
            raise InvalidField(f"{name} must be {allowed}, got {value}", field=name)
        return value


#: Every sampling field, in the order they are validated. max_tokens is one of them for the
#: engine, but a request keeps it apart from the others: its lane caps it.
FIELDS: tuple[SamplingField, ...] = (
    SamplingField("max_tokens", "int", lo=1),
    SamplingField("temperature", "float", lo=0.0, hi=2.0),
    SamplingField("top_p", "float", lo=0.0, hi=1.0, lo_open=True),
    SamplingField("top_k", "int", lo=1, off=-1),
    SamplingField("stop", "stop", hi=4),
    SamplingField("seed", "int"),
    SamplingField("ignore_eos", "bool"),
    SamplingField("min_tokens", "int", lo=0),
    SamplingField("repetition_penalty", "float", lo=0.0, hi=2.0, lo_open=True),
    # OpenAI's penalties: clients send 0 by default, which changes nothing
    SamplingField("frequency_penalty", "float", lo=-2.0, hi=2.0, native=False, inert=0.0),
    SamplingField("presence_penalty", "float", lo=-2.0, hi=2.0, native=False, inert=0.0),
)
BY_NAME: dict[str, SamplingField] = {f.name: f for f in FIELDS}
MAX_TOKENS = BY_NAME["max_tokens"]


def field_names(api: Api) -> tuple[str, ...]:
    """The sampling fields a request body of ``api`` may carry."""
    return tuple(f.name for f in FIELDS if f.accepted_by(api))


def parse_sampling(body: Mapping[str, Any], api: Api) -> dict[str, Any]:
    """The sampling fields of ``body`` for ``api``, validated; null and inert values left out."""
    out = {}
    for f in FIELDS:
        if f.accepted_by(api) and body.get(f.name) is not None:
            value = f.parse(body[f.name])
            if f.inert is None or value != f.inert:
                out[f.name] = value
    size = len(json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode())
    if size > MAX_SAMPLING_BYTES:
        raise InvalidField(f"the sampling fields take {size} bytes, more than {MAX_SAMPLING_BYTES}",
                           field="stop" if "stop" in out else "body")
    return out


def vllm_kwargs(sampling: Mapping[str, Any]) -> dict[str, Any]:
    """The ``SamplingParams`` keywords of a validated sampling dict: table fields only, no nulls."""
    return {k: v for k, v in sampling.items() if k in BY_NAME and v is not None}
