"""The one table of sampling fields: what a request may set, how it is checked, what the engine gets.

Names are OpenAI's and vLLM's (each is the keyword of vLLM's ``SamplingParams``
with the same meaning), so a caller reuses what it already sends to vLLM. The
native API (``gateway/job_request.py``), its OpenAPI document and the engine
(``engine.host``) read this table; a field added here is accepted, validated and
passed to vLLM at once. The OpenAI routes do not: vLLM's own request models and
render layer validate those (``gateway/openai_frontend.py``).
"""

from __future__ import annotations

import json
import math
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
#: The range of a 64-bit integer: vLLM's bound for seed, and what its engine's messages
#: (msgspec) can carry at all, so an integer field outside it could never run.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def as_int(name: str, value: Any, lo: int | None = None) -> int:
    """``value`` if it is an integer (not a bool) >= lo, else InvalidField naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidField(f"{name} must be an integer, got {type(value).__name__}", field=name)
    if lo is not None and value < lo:
        raise InvalidField(f"{name} must be >= {lo}, got {value}", field=name)
    return value


def as_float(name: str, value: Any, lo: float | None = None, hi: float | None = None, *,
             lo_open: bool = False) -> float:
    """``value`` as a float if it is a finite number within [lo, hi] (or (lo, hi]), else
    InvalidField. JSON as Python reads it can say NaN and Infinity (and 1e999 is inf): NaN
    passes every comparison, so it is refused first, as vLLM refuses it."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidField(f"{name} must be a number, got {type(value).__name__}", field=name)
    try:
        value = float(value)
    except OverflowError:  # an integer too large for a float
        value = math.inf
    if not math.isfinite(value):
        raise InvalidField(f"{name} must be a finite number, got {value}", field=name)
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
            raise InvalidField(f"{name} must be {allowed}, got {_short(value)}", field=name)
        if self.hi is not None and value > self.hi:
            raise InvalidField(f"{name} must be <= {int(self.hi)}, got {_short(value)}", field=name)
        return value


def _short(value: int) -> str:
    """An integer as an error message shows it: a 4,000-digit one is not repeated back."""
    return str(value) if value.bit_length() <= 64 else f"an integer of {value.bit_length()} bits"


#: Every sampling field, in the order they are validated. max_tokens is one of them for the
#: engine, but a request keeps it apart from the others: its lane caps it.
FIELDS: tuple[SamplingField, ...] = (
    SamplingField("max_tokens", "int", lo=1),
    SamplingField("temperature", "float", lo=0.0, hi=2.0),
    SamplingField("top_p", "float", lo=0.0, hi=1.0, lo_open=True),
    SamplingField("top_k", "int", lo=1, off=-1, hi=INT64_MAX),
    SamplingField("stop", "stop", hi=4),
    SamplingField("seed", "int", lo=INT64_MIN, hi=INT64_MAX),
    SamplingField("ignore_eos", "bool"),
    SamplingField("min_tokens", "int", lo=0, hi=INT64_MAX),
    SamplingField("repetition_penalty", "float", lo=0.0, hi=2.0, lo_open=True),
    # OpenAI's penalties. A 0 is kept, not dropped as a no-op: it overrides a model's
    # generation-config default, as in vLLM's server (the engine fills only absent fields)
    SamplingField("frequency_penalty", "float", lo=-2.0, hi=2.0, native=False),
    SamplingField("presence_penalty", "float", lo=-2.0, hi=2.0, native=False),
)
BY_NAME: dict[str, SamplingField] = {f.name: f for f in FIELDS}
MAX_TOKENS = BY_NAME["max_tokens"]


def field_names(api: Api) -> tuple[str, ...]:
    """The sampling fields a request body of ``api`` may carry."""
    return tuple(f.name for f in FIELDS if f.accepted_by(api))


def parse_sampling(body: Mapping[str, Any], api: Api) -> dict[str, Any]:
    """The sampling fields of ``body`` for ``api``, validated; nulls left out, so a field
    absent here is one the client did not set (the engine fills it from the model's defaults)."""
    out = {}
    for f in FIELDS:
        if f.accepted_by(api) and body.get(f.name) is not None:
            out[f.name] = f.parse(body[f.name])
    size = len(json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode())
    if size > MAX_SAMPLING_BYTES:
        raise InvalidField(f"the sampling fields take {size} bytes, more than {MAX_SAMPLING_BYTES}",
                           field="stop" if "stop" in out else "body")
    return out


def vllm_kwargs(sampling: Mapping[str, Any]) -> dict[str, Any]:
    """The ``SamplingParams`` keywords of a validated sampling dict: table fields only, no nulls."""
    return {k: v for k, v in sampling.items() if k in BY_NAME and v is not None}
