"""Validation of a job submission body: one clear error per bad field.

Field names follow the OpenAI completions API and vLLM's extra sampling
parameters (the table in ``tailguard.sampling``), so a caller can reuse what
they already send to vLLM. A JobRequest is one of the gateway's two request kinds
(``tailguard.gateway.service.Submission``): it places itself, and says what its record and
its lane's task carry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tailguard.errors import InvalidField
from tailguard.lanes.latency_targets import TargetBounds
from tailguard.lanes.placement import Placement, Prefer, place
from tailguard.lanes.table import PRIORITY_CLASSES, LaneTable
from tailguard.sampling import MAX_TOKENS, Api, field_names, parse_sampling


@dataclass(frozen=True)
class JobRequest:
    prompt: str
    max_tokens: int | None = None
    priority: str = "interactive"
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, ... (no max_tokens)
    # False for prompts rendered from a chat template: the template writes its own BOS
    add_special_tokens: bool = True

    def within(self, bounds: TargetBounds) -> JobRequest:
        """As it is: its priority is a class, which the key's ceiling bounds."""
        return self

    def place(self, lanes: LaneTable, count_prompt: Callable[[str, bool], int],
              model_max_len: int | None, prefer: Prefer | None = None,
              cached_tokens: int = 0) -> Placement:
        """Its lane, max_tokens and cost, its prompt counted by `count_prompt` (which refuses
        one past the API's byte bound before the tokenizer spends CPU on it); InvalidField
        when min_tokens is above the max_tokens it gets."""
        placement = place(lanes.lanes, priority=self.priority,
                          prompt_tokens=count_prompt(self.prompt, self.add_special_tokens),
                          requested_max_tokens=self.max_tokens, model_max_len=model_max_len,
                          prefer=prefer, cached_tokens=cached_tokens)
        min_tokens = self.sampling.get("min_tokens", 0)
        if min_tokens > placement.max_tokens:
            raise InvalidField(f"min_tokens ({min_tokens}) must be <= max_tokens, which is "
                               f"{placement.max_tokens} on lane {placement.lane!r}"
                               + (" (capped)" if placement.max_tokens_capped else ""),
                               field="min_tokens")
        return placement

    def token_ids(self, encode: Callable[[str, bool], list[int]]) -> Sequence[int]:
        """Its prompt's token ids (prefix affinity names its prefixes by them)."""
        return encode(self.prompt, self.add_special_tokens)

    def record_fields(self, job_id: str) -> dict[str, Any]:
        """What the job record keeps of it besides its placement."""
        return {"sampling": self.sampling}

    def task_kwargs(self, job_id: str, placement: Placement) -> dict[str, Any]:
        """The lane task's keyword arguments of its own: the prompt and its sampling."""
        kwargs: dict[str, Any] = {"prompt": self.prompt, "sampling": self.sampling}
        if not self.add_special_tokens:
            kwargs["add_special_tokens"] = False
        return kwargs


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
