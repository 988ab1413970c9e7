"""Cost, classification and caps: where a request goes and what it may ask for.

Pure functions over a LaneTable and token counts, so the whole routing policy is
table-testable without Redis, Celery or a model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from tailguard.errors import NoLaneForRequest, PromptTooLong
from tailguard.lanes.table import Lane


@dataclass(frozen=True)
class Placement:
    """The decision for one request."""

    lane: str
    prompt_tokens: int
    requested_max_tokens: int | None  # what the caller asked for (None: lane default)
    max_tokens: int                   # what the engine will be asked for
    max_tokens_capped: bool           # True when max_tokens < what was asked (or defaulted)
    cost: int                         # new_prompt_tokens + max_tokens, in tokens
    context_len: int                  # the lane's engine context
    cached_tokens: int = 0            # of its prompt, in a live engine's prefix cache

    @property
    def new_prompt_tokens(self) -> int:
        """The prompt tokens its engine must prefill (those not in its prefix cache)."""
        return self.prompt_tokens - self.cached_tokens

    def to_dict(self) -> dict:
        return asdict(self)


#: which of the lanes that accept a request it should rather go to (place's `prefer`)
Prefer = Callable[["Placement"], bool]


def request_cost(prompt_tokens: int, max_tokens: int) -> int:
    """A request's cost in tokens: its KV-cache footprint and, roughly, its engine time."""
    return prompt_tokens + max_tokens


def place(lanes: Sequence[Lane], *, priority: str, prompt_tokens: int,
          requested_max_tokens: int | None, model_max_len: int | None = None,
          prefer: Prefer | None = None, cached_tokens: int = 0) -> Placement:
    """Choose the lane for a request and cap its max_tokens.

    The first lane (in table order) of the request's priority class that accepts it
    wins; with `prefer` (a request's latency target over each lane's predicted wait:
    tailguard/lanes/latency_targets.py), the first accepting lane it prefers, else the first
    accepting one. A lane with ``max_cost`` accepts a request whose cost fits and whose
    max_tokens is within the lane cap; a lane without one accepts everything of its
    class and clamps max_tokens to its cap and to the context left after the prompt.
    `cached_tokens` of the prompt are in an engine's prefix cache (prefix affinity offers the
    request to it): its cost leaves them out, its context does not.
    """
    candidates = [lane for lane in lanes if lane.priority == priority]
    if not candidates:
        raise NoLaneForRequest(f"no lane serves priority {priority!r}", field="priority")
    fits = [p for lane in candidates
            if (p := _fit(lane, prompt_tokens, requested_max_tokens, model_max_len,
                          cached_tokens)) is not None]
    if fits:
        return next((p for p in fits if prefer(p)), fits[0]) if prefer else fits[0]
    longest_context = max(lane.context_len(model_max_len) for lane in candidates)
    if prompt_tokens + 1 > longest_context:
        raise PromptTooLong(
            f"the prompt has {prompt_tokens} tokens; the longest context of a "
            f"{priority} lane is {longest_context} tokens", field="prompt")
    raise NoLaneForRequest(
        f"no {priority} lane accepts a request of {prompt_tokens} prompt tokens and "
        f"max_tokens {requested_max_tokens} (every lane has a max_cost and none fits)",
        field="max_tokens")


def _fit(lane: Lane, prompt_tokens: int, requested_max_tokens: int | None,
         model_max_len: int | None, cached_tokens: int = 0) -> Placement | None:
    """The request placed on `lane`, or None when the lane does not accept it."""
    context = lane.context_len(model_max_len)
    if prompt_tokens + 1 > context:  # room for at least one output token
        return None
    wanted = requested_max_tokens if requested_max_tokens is not None \
        else lane.effective_default_max_tokens
    new_tokens = prompt_tokens - cached_tokens
    if lane.max_cost is not None and (
            request_cost(new_tokens, wanted) > lane.max_cost or wanted > lane.max_tokens):
        return None
    effective = min(wanted, lane.max_tokens, context - prompt_tokens)
    return Placement(
        lane=lane.name, prompt_tokens=prompt_tokens, requested_max_tokens=requested_max_tokens,
        max_tokens=effective, max_tokens_capped=effective < wanted,
        cost=request_cost(new_tokens, effective), context_len=context,
        cached_tokens=cached_tokens)
