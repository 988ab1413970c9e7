"""Validation of a job submission body: one clear error per bad field.

Field names follow the OpenAI completions API and vLLM's extra sampling
parameters, so a caller can reuse what they already send to vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tailguard.errors import InvalidField
from tailguard.lanes import PRIORITY_CLASSES

MAX_STOP_SEQUENCES = 4


@dataclass(frozen=True)
class JobRequest:
    prompt: str
    max_tokens: int | None = None
    priority: str = "interactive"
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, ... (no max_tokens)
    # False for prompts rendered from a chat template: the template writes its own BOS
    add_special_tokens: bool = True


def _int(name: str, v: Any, lo: int | None = None) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise InvalidField(f"{name} must be an integer, got {type(v).__name__}", field=name)
    if lo is not None and v < lo:
        raise InvalidField(f"{name} must be >= {lo}, got {v}", field=name)
    return v


def _float(name: str, v: Any, lo: float, hi: float | None = None, lo_open: bool = False) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise InvalidField(f"{name} must be a number, got {type(v).__name__}", field=name)
    v = float(v)
    if (v <= lo if lo_open else v < lo) or (hi is not None and v > hi):
        bound = f"{'>' if lo_open else '>='} {lo}" + (f" and <= {hi}" if hi is not None else "")
        raise InvalidField(f"{name} must be {bound}, got {v}", field=name)
    return v


def _stop(v: Any) -> list[str]:
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise InvalidField("stop must be a non-empty string or a list of them", field="stop")
    if len(items) > MAX_STOP_SEQUENCES:
        raise InvalidField(f"stop takes at most {MAX_STOP_SEQUENCES} sequences", field="stop")
    return items


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise InvalidField(f"{name} must be true or false", field=name)
    return v


def _top_k(v: Any) -> int:
    if _int("top_k", v, -1) == 0:
        raise InvalidField("top_k must be -1 (off) or >= 1", field="top_k")
    return v


# name -> validator of the sampling fields passed through to the engine
_SAMPLING = {
    "temperature": lambda v: _float("temperature", v, 0.0, 2.0),
    "top_p": lambda v: _float("top_p", v, 0.0, 1.0, lo_open=True),
    "top_k": lambda v: _top_k(v),
    "stop": _stop,
    "seed": lambda v: _int("seed", v),
    "ignore_eos": lambda v: _bool("ignore_eos", v),
    "min_tokens": lambda v: _int("min_tokens", v, 0),
    "repetition_penalty": lambda v: _float("repetition_penalty", v, 0.0, 2.0, lo_open=True),
}


def parse_job_request(body: Any) -> JobRequest:
    """Turn a decoded JSON body into a JobRequest or raise InvalidField."""
    if not isinstance(body, dict):
        raise InvalidField("the body must be a JSON object", field="body")
    known = {"prompt", "max_tokens", "priority", *_SAMPLING}
    unknown = sorted(set(body) - known)
    if unknown:
        raise InvalidField(f"unknown field(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})",
                           field=unknown[0])
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise InvalidField("prompt is required and must be a non-empty string", field="prompt")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        _int("max_tokens", max_tokens, 1)
    priority = body.get("priority", "interactive")
    if priority not in PRIORITY_CLASSES:
        raise InvalidField(f"priority must be one of {', '.join(PRIORITY_CLASSES)}, got {priority!r}",
                           field="priority")
    sampling = {k: _SAMPLING[k](body[k]) for k in _SAMPLING if body.get(k) is not None}
    if max_tokens is not None and sampling.get("min_tokens", 0) > max_tokens:
        raise InvalidField("min_tokens must be <= max_tokens", field="min_tokens")
    return JobRequest(prompt=prompt, max_tokens=max_tokens, priority=priority, sampling=sampling)
