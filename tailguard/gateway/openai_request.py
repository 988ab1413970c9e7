"""An OpenAI request on its way to a lane: tailguard's part of it, around vLLM's.

vLLM's own request models and render layer (``openai_frontend``) say what a body means,
what it costs in prompt tokens and what vLLM would grant or refuse. This module holds what
tailguard adds, as pure functions: its one field of its own (``priority`` as a class name),
the fields it refuses on purpose, the unknown fields it ignores (as vLLM does) and counts,
the max_tokens a lane grants, and the ``openai`` argument of the lane's task (the contract
between the API and the worker: docs/api.md). It also refuses an integer no engine message can
carry (outside 64 bits): vLLM's request models take any, and its engine would fail on it only
after the job was queued.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from tailguard.errors import InvalidField
from tailguard.lanes.latency_targets import TargetBounds, clamp_vllm_priority
from tailguard.lanes.placement import Placement, Prefer, place, request_cost
from tailguard.lanes.table import PRIORITY_CLASSES, Lane, LaneTable
from tailguard.sampling import INT64_MAX, INT64_MIN

Endpoint = Literal["chat", "completion", "responses"]
ENDPOINTS: tuple[Endpoint, ...] = ("chat", "completion", "responses")
#: what vLLM's serving classes put before the base id in a response's (and its request's) id
ID_PREFIXES: dict[Endpoint, str] = {"chat": "chatcmpl", "completion": "cmpl"}
#: what vLLM's Responses API puts before the fresh id it draws when the body gives none
RESPONSE_ID_PREFIX = "resp_"

#: vLLM fields tailguard refuses on purpose, with the reason the 400 gives. Each is refused
#: only with a value that asks for something (vLLM's default of each is accepted).
REFUSED_FIELDS: dict[str, str] = {
    **{name: ("the guided_* fields were removed from vLLM, which now ignores them without a "
              "word (the output would not be constrained): use structured_outputs or "
              "response_format") for name in (
        "guided_json", "guided_regex", "guided_choice", "guided_grammar",
        "guided_decoding_backend", "guided_whitespace_pattern")},
    "kv_transfer_params": "disaggregated prefill/decode is not tailguard's: a lane's engine runs "
                          "the whole request",
    "ec_transfer_params": "disaggregated encoding is not tailguard's: a lane's engine runs the "
                          "whole request",
    "use_beam_search": "beam search is not served: vLLM's render layer, which costs and places "
                       "a request before it is queued, does not support it",
}

#: Responses API fields that need state kept on the server between requests, refused before
#: queueing: a request runs on whichever worker its lane has, and no worker keeps what another
#: served (vLLM itself keeps it in its process, off unless VLLM_ENABLE_RESPONSES_API_STORE)
RESPONSES_REFUSED: dict[str, str] = {
    "previous_response_id": "responses are not stored here (each runs on any worker of its "
                            "lane): send the conversation so far in `input`",
    "store": "responses are not stored here (each runs on any worker of its lane): send "
             "store=false, or leave it out",
    "background": "background responses need a stored response to poll: not served",
}

#: why a completions request with several prompts is refused (vLLM would run each)
BATCH_REFUSED = ("a batch of prompts is not served as one request: a job is one prompt on one "
                 "lane (its cost, cap and deadline are that prompt's); send one request per "
                 "prompt")


def _asks_for_something(value: Any) -> bool:
    """A refused field is refused unless it says "nothing": absent, null, false, empty."""
    return value not in (None, False, {}, [], "")


@dataclass(frozen=True)
class SplitBody:
    """A client's body taken apart: what vLLM validates, tailguard's class, what is ignored."""

    body: dict[str, Any]  # for vLLM: tailguard's class and the ignored fields removed
    priority: str         # tailguard's priority class
    ignored: tuple[str, ...]  # unknown top-level fields, ignored as vLLM ignores them


def split_body(body: Any, known: Iterable[str],
               refused: Mapping[str, str] = REFUSED_FIELDS) -> SplitBody:
    """Take tailguard's own field out of an OpenAI body (``priority`` as a class name; an
    integer ``priority`` is vLLM's and stays), refuse the fields of `refused` (REFUSED_FIELDS,
    and RESPONSES_REFUSED for a Responses request), and drop the fields vLLM's request model
    does not know (`known`), which vLLM ignores."""
    if not isinstance(body, dict):
        raise InvalidField("the body must be a JSON object", field="body")
    out = dict(body)
    priority = "interactive"
    if isinstance(body.get("priority"), str):
        priority = out.pop("priority")
        if priority not in PRIORITY_CLASSES:
            raise InvalidField(f"priority must be one of {', '.join(PRIORITY_CLASSES)} (tailguard's "
                               f"class) or an integer (vLLM's), got {priority!r}", field="priority")
    for name, reason in refused.items():
        if _asks_for_something(body.get(name)):
            raise InvalidField(f"{name} is refused here: {reason}", field=name)
    names = frozenset(known)
    ignored = tuple(sorted(k for k in out if k not in names))
    for name in ignored:
        del out[name]
    if (where := beyond_int64(out)) is not None:
        raise InvalidField(f"{where} must be an integer within 64 bits: vLLM's engine could not "
                           "take it", field=where)
    return SplitBody(out, priority, ignored)


def beyond_int64(body: Any) -> str | None:
    """The path (vLLM's style: ``tokens.0``) of the first integer in `body` outside the 64-bit
    range, or None; iterative, so a deeply nested body costs no stack."""
    stack: list[tuple[Any, str]] = [(body, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{where}.{i}") for i, v in enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool) and not (
                INT64_MIN <= value <= INT64_MAX):
            return where
    return None


def requested_max_tokens(endpoint: Endpoint, body: Mapping[str, Any]) -> int | None:
    """The output length the client asked for, as vLLM reads it (chat: max_completion_tokens
    before max_tokens; Responses: max_output_tokens); None when it left it to the server."""
    if endpoint == "responses":
        return body.get("max_output_tokens")
    if endpoint == "chat" and body.get("max_completion_tokens") is not None:
        return body["max_completion_tokens"]
    return body.get("max_tokens")


@dataclass(frozen=True)
class OpenAIJob:
    """An OpenAI request validated and rendered by vLLM, ready to be placed on a lane."""

    endpoint: Endpoint
    #: the body the worker's vLLM serving layer gets (split_body's, before the grant)
    request: dict[str, Any]
    #: its exact prompt tokens, from vLLM's render
    prompt_tokens: int
    #: what vLLM itself would grant it (its default, or the client's value within its context)
    vllm_max_tokens: int
    #: what the client asked for (None: left to the server)
    max_tokens: int | None = None
    priority: str = "interactive"
    stream: bool = False
    #: sequences it generates (vLLM's n): its cost counts each
    n: int = 1
    #: what its prompt's text weighs in UTF-8 bytes (the API's byte bound)
    prompt_bytes: int = 0
    #: raises InvalidField when vLLM refuses the request at this max_tokens (the grant may
    #: lower it below, say, min_tokens)
    verify: Callable[[int], None] = field(default=lambda _: None, compare=False, repr=False)
    #: the X-Request-Id header it came with (None: none), which vLLM prefers to the body's
    header_request_id: str | None = None
    #: its prompt's token ids, from vLLM's render (prefix affinity names its prefixes by them)
    prompt_ids: tuple[int, ...] = field(default=(), compare=False, repr=False)

    def base_request_id(self, job_id: str) -> str:
        """The base of its vLLM ids, by vLLM's rule (``OpenAIServing._base_request_id``): the
        X-Request-Id header, else the body's ``request_id``, else a fresh id, which here is
        the job's (unique too, and names the request in every tailguard route). vLLM's
        Responses API takes the body's id whole and no header: else ``resp_<job id>``."""
        given = self.request.get("request_id")
        if self.endpoint == "responses":
            return given if isinstance(given, str) else f"{RESPONSE_ID_PREFIX}{job_id}"
        if self.header_request_id is not None:
            return self.header_request_id
        return given if isinstance(given, str) else job_id

    def request_id(self, job_id: str) -> str:
        """vLLM's id of it, as its serving class makes it and its response says it:
        ``chatcmpl-<base>``, ``cmpl-<base>``, or a Responses request's base itself."""
        base = self.base_request_id(job_id)
        return base if self.endpoint == "responses" else f"{ID_PREFIXES[self.endpoint]}-{base}"

    # The gateway's request-kind protocol (tailguard.gateway.service.Submission):

    def within(self, bounds: TargetBounds) -> OpenAIJob:
        """It with vLLM's integer ``priority`` no more urgent than its key may ask."""
        sent = self.request.get("priority")
        if not isinstance(sent, int) or isinstance(sent, bool):
            return self
        return replace(self, request={**self.request,
                                      "priority": clamp_vllm_priority(sent, bounds)})

    def place(self, lanes: LaneTable, count_prompt: Callable[[str, bool], int],
              model_max_len: int | None, prefer: Prefer | None = None,
              cached_tokens: int = 0) -> Placement:
        """Its lane, granted vLLM's own max_tokens within it (`grant`); its prompt was counted
        by vLLM's render (and its bytes checked before that), so `count_prompt` is not used.
        InvalidField for anything vLLM refuses at the granted max_tokens."""
        placement = place(lanes.lanes, priority=self.priority, prompt_tokens=self.prompt_tokens,
                          requested_max_tokens=self.max_tokens, model_max_len=model_max_len,
                          prefer=prefer, cached_tokens=cached_tokens)
        placement = grant(placement, lanes[placement.lane], self)
        self.verify(placement.max_tokens)
        return placement

    def token_ids(self, encode: Callable[[str, bool], list[int]]) -> Sequence[int]:
        """Its prompt's token ids, as vLLM rendered them (`encode` is not used)."""
        return self.prompt_ids

    def record_fields(self, job_id: str) -> dict[str, Any]:
        """What the job record keeps of it besides its placement: the endpoint it came by
        and vLLM's id of it, the response's ``id`` (its sampling is in vLLM's request, in the
        task's ``openai`` argument)."""
        return {"sampling": {}, "openai": self.endpoint, "request_id": self.request_id(job_id)}

    def task_kwargs(self, job_id: str, placement: Placement) -> dict[str, Any]:
        """The lane task's keyword arguments of its own: the ``openai`` argument (no prompt
        text: the worker hands vLLM's serving layer the request)."""
        return {"prompt": "", "sampling": {}, "openai": task_argument(self, job_id, placement)}


def grant(placement: Placement, lane: Lane, job: OpenAIJob) -> Placement:
    """`placement` (made with the client's max_tokens, or the lane's default_max_tokens when
    it gave none) with the max_tokens the lane grants: vLLM's own value, within the lane's
    cap, the context its engine has left after the prompt, and its max_cost; capped whenever
    that is less than vLLM would grant. Its cost counts each of the n sequences' output."""
    granted = min(job.vllm_max_tokens, lane.max_tokens, placement.context_len - placement.prompt_tokens)
    if job.max_tokens is not None:
        granted = min(granted, placement.max_tokens)
    elif lane.max_cost is not None:
        granted = min(granted, lane.max_cost - placement.new_prompt_tokens)
    return replace(placement, requested_max_tokens=job.max_tokens, max_tokens=granted,
                   max_tokens_capped=granted < job.vllm_max_tokens,
                   cost=request_cost(placement.new_prompt_tokens, job.n * granted))


def task_argument(job: OpenAIJob, job_id: str, placement: Placement) -> dict[str, Any]:
    """The lane task's ``openai`` keyword argument (the contract, docs/api.md): the body for
    vLLM's serving layer with the granted max_tokens and the base of its ids as its
    ``request_id`` (`OpenAIJob.base_request_id`), from which vLLM's serving class builds them."""
    limit = "max_output_tokens" if job.endpoint == "responses" else "max_tokens"
    request = {**job.request, limit: placement.max_tokens,
               "request_id": job.base_request_id(job_id)}
    if job.endpoint == "chat" and job.request.get("max_completion_tokens") is not None:
        request["max_completion_tokens"] = placement.max_tokens
    return {"endpoint": job.endpoint, "request": request, "prompt_tokens": job.prompt_tokens,
            "capped": placement.max_tokens_capped}


def text_bytes(value: Any) -> int:
    """UTF-8 bytes of every string in `value` (a prompt, messages, tools), keys included;
    iterative, so a deeply nested body costs no stack."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) if item.isascii() else len(item.encode("utf-8", "surrogatepass"))
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


#: the body fields a prompt is rendered from (what the API's prompt byte bound weighs)
PROMPT_FIELDS = ("prompt", "messages", "tools", "documents", "input", "instructions")


def prompt_text_bytes(body: Mapping[str, Any]) -> int:
    return sum(text_bytes(body.get(name)) for name in PROMPT_FIELDS)
