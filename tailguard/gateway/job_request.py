"""Validation of a job submission body: one clear error per bad field.

Field names follow the OpenAI completions API and vLLM's extra sampling
parameters (the table in ``tailguard.sampling``), so a caller can reuse what
they already send to vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tailguard.errors import InvalidField
from tailguard.lanes.table import PRIORITY_CLASSES
from tailguard.sampling import MAX_TOKENS, Api, field_names, parse_sampling


@dataclass(frozen=True)
class JobRequest:
    prompt: str
    max_tokens: int | None = None
    priority: str = "interactive"
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, ... (no max_tokens)
    # False for prompts rendered from a chat template: the template writes its own BOS
    add_special_tokens: bool = True


def parse_job_request(body: Any, api: Api = "native") -> JobRequest:
    """Turn a decoded JSON body into a JobRequest or raise InvalidField.

    ``api`` says whose sampling fields the body may carry: the OpenAI API
    passes its body's through here too, and takes a few more than the native one.
    """
    if not isinstance(body, dict):
        raise InvalidField("the body must be a JSON object", field="body")
    known = {"prompt", "priority", *field_names(api)}
    unknown = sorted(set(body) - known)
    if unknown:
        raise InvalidField(f"unknown field(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})",
                           field=unknown[0])
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise InvalidField("prompt is required and must be a non-empty string", field="prompt")
    priority = body.get("priority", "interactive")
    if priority not in PRIORITY_CLASSES:
        raise InvalidField(f"priority must be one of {', '.join(PRIORITY_CLASSES)}, got {priority!r}",
                           field="priority")
    sampling = parse_sampling(body, api)
    max_tokens = sampling.pop(MAX_TOKENS.name, None)
    if max_tokens is not None and sampling.get("min_tokens", 0) > max_tokens:
        raise InvalidField("min_tokens must be <= max_tokens", field="min_tokens")
    return JobRequest(prompt=prompt, max_tokens=max_tokens, priority=priority, sampling=sampling)
