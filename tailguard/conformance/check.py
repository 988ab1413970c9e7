"""One conformance check: the HTTP calls it makes, what came back, and how one side is judged.

Pure: a check is a few calls and a predicate on their answers (returns what it saw, raises
``Failed``); placeholders in a call (``$MODEL``, ``$TOKEN``, ...) are filled per side from
what the run found (``Context``). A failed check on tailguard whose request asks for
something refused on purpose (``REFUSED_FIELDS`` and ``BATCH_REFUSED`` in
tailguard/gateway/openai_request.py, docs/api.md's "Refused on purpose") is ``refused``
when tailguard answered the documented 400.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tailguard.gateway.openai_request import BATCH_REFUSED, REFUSED_FIELDS, RESPONSES_REFUSED

#: a documented refusal's reason, by the field the 400 names
REFUSAL_REASONS: dict[str, str] = {**REFUSED_FIELDS, **RESPONSES_REFUSED, "prompt": BATCH_REFUSED}
#: a tool parser is configured (TAILGUARD_OPENAI_ARGS: --enable-auto-tool-choice
#: --tool-call-parser ...), so tool_choice "auto" can be served
TOOL_PARSER = "tool_parser"

Route = Literal["completions", "chat", "responses", "models", "get", "post", "raw", "metrics"]
Status = Literal["pass", "fail", "skip", "refused"]

# Placeholders in a call's body, filled per side from what the run found (Context):
MODEL = "$MODEL"            # the served model's id (GET /v1/models' first)
TOKEN = "$TOKEN"            # an ordinary token's id (also as a logit_bias key)
TOKEN_TEXT = "$TOKEN_TEXT"  # its text
SPECIAL = "$SPECIAL"        # the end-of-sequence token's id
SPECIAL_TEXT = "$SPECIAL_TEXT"


@dataclass(frozen=True)
class Call:
    """One HTTP request. `route`: an OpenAI SDK method (``completions``, ``chat``,
    ``responses``, ``models``), the SDK's generic ``get``/``post`` on a path outside /v1 (``path``),
    ``raw``: bytes the SDK cannot send (``data``, e.g. a NaN), with the standard library, or
    ``metrics``: the side's Prometheus endpoints where its engines' ``vllm:*`` series are
    (`vllm serve`'s /metrics; each tailguard worker's port), their texts joined."""

    route: Route
    body: Mapping[str, Any] | None = None
    path: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    data: str = ""  # raw: the body's text, placeholders included

    @property
    def stream(self) -> bool:
        return bool((self.body or {}).get("stream"))


@dataclass
class Answer:
    """What came back for one call, as the check's predicate reads it."""

    status: int | None  # None: no HTTP answer at all (see `error`)
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased
    body: Any = None  # JSON (an error body too), else text; None for a stream
    #: a stream: every ``data:`` payload, parsed (the last is the string "[DONE]")
    events: list[Any] | None = None
    lines: list[str] | None = None  # a stream's raw lines
    error: str | None = None  # the client's exception, when it got no answer
    requests: int = 0  # HTTP requests the SDK sent for it (1 unless it retried)
    retries: int = 0   # of them, retries (the SDK's x-stainless-retry-count)
    would_retry: int = 0  # answers a default-retrying SDK (max_retries=2) would retry
    seconds: float = 0.0

    @property
    def chunks(self) -> list[dict[str, Any]]:
        """A stream's JSON chunks (without [DONE])."""
        return [e for e in self.events or () if isinstance(e, dict)]

    @property
    def job_id(self) -> str | None:
        return self.headers.get("x-tailguard-job-id")

    def brief(self) -> str:
        """The status and, for an error, its message: what a failed check's detail shows."""
        if self.status is None:
            return f"no answer: {self.error}"
        error = self.body.get("error") if isinstance(self.body, dict) else None
        if isinstance(error, dict):
            message = " ".join(str(error.get("message") or "").split())
            return f"{self.status} {error.get('code') or error.get('type') or ''}: {message[:160]}"
        if self.status >= 400:
            return f"{self.status}: {str(self.body)[:160]}"
        return str(self.status)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "headers": self.headers, "body": self.body,
                "events": self.events, "error": self.error, "requests": self.requests,
                "retries": self.retries, "would_retry": self.would_retry,
                "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class Context:
    """What a side's predicates and placeholders need to know of its server."""

    side: str
    model: str = ""
    max_model_len: int = 0
    token: int = 0
    token_text: str = ""
    special: int = 0
    special_text: str = ""
    capabilities: frozenset[str] = frozenset()

    def placeholders(self) -> dict[str, Any]:
        return {MODEL: self.model, TOKEN: self.token, TOKEN_TEXT: self.token_text,
                SPECIAL: self.special, SPECIAL_TEXT: self.special_text}


def fill(value: Any, ctx: Context) -> Any:
    """`value` with each placeholder (a whole string, or a dict key) replaced by ctx's value;
    a key stays a string (a logit_bias key is a token id as text)."""
    table = ctx.placeholders()
    if isinstance(value, str):
        return table.get(value, value)
    if isinstance(value, Mapping):
        return {(str(table[k]) if k in table else k): fill(v, ctx) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [fill(v, ctx) for v in value]
    return value


def fill_text(text: str, ctx: Context) -> str:
    """A raw body's text with its placeholders replaced (as JSON values)."""
    for name, value in sorted(ctx.placeholders().items(), key=lambda kv: -len(kv[0])):
        text = text.replace(f'"{name}"', json.dumps(value))
    return text


class Failed(Exception):
    """A predicate's verdict: the check does not hold (the message says what was seen)."""


def need(condition: Any, detail: str) -> None:
    if not condition:
        raise Failed(detail)


Predicate = Callable[[Sequence[Answer], Context], str]


@dataclass(frozen=True)
class Check:
    """One compatibility check: its calls, sent in order, and the predicate on their answers
    (returns what it saw, raises Failed)."""

    name: str
    area: str
    what: str  # one line: what it asks of a server
    calls: tuple[Call, ...]
    expect: Predicate
    #: a documented refusal: the field tailguard's 400 names (a key of REFUSAL_REASONS)
    refused: str | None = None
    #: tailguard must pass it whatever vLLM does
    required: bool = False
    #: a capability the servers need (else both skip it, saying why)
    needs: str | None = None


@dataclass(frozen=True)
class Result:
    status: Status
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"status": self.status, "detail": self.detail}


SKIP_REASONS = {TOOL_PARSER: "no tool parser configured (TAILGUARD_OPENAI_ARGS="
                             "'--enable-auto-tool-choice --tool-call-parser NAME')"}


def judge(check: Check, answers: Sequence[Answer], ctx: Context) -> Result:
    """One side's result of `check`: its predicate on `answers`; on tailguard, a failed
    documented-refusal check that got the documented 400 is ``refused``."""
    try:
        detail = check.expect(answers, ctx)
        status: Status = "pass"
    except Failed as exc:
        status, detail = "fail", str(exc)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        status, detail = "fail", f"unexpected answer ({type(exc).__name__}: {exc}): " + "; ".join(
            a.brief() for a in answers)
    if status == "fail" and check.refused and ctx.side == "tailguard":
        why = documented_refusal(answers[-1], check.refused)
        if why is None:
            return Result("refused", f"documented refusal: {answers[-1].brief()}")
        detail += f"; not the documented refusal ({why})"
    return Result(status, detail)


def documented_refusal(answer: Answer, name: str) -> str | None:
    """None when `answer` is tailguard's documented refusal of `name`: a 400 that names it
    and gives its reason; else what differs."""
    if answer.status != 400:
        return f"status {answer.status}, not 400"
    error = (answer.body or {}).get("error") if isinstance(answer.body, dict) else None
    if not isinstance(error, dict):
        return "no OpenAI error body"
    if REFUSAL_REASONS[name] not in str(error.get("message")):
        return f"the message does not give the documented reason: {error.get('message')!r}"
    if error.get("param") not in (name, None):
        return f"param {error.get('param')!r}, not {name!r}"
    return None


def skipped(check: Check, ctx: Context) -> Result | None:
    if check.needs and check.needs not in ctx.capabilities:
        return Result("skip", SKIP_REASONS.get(check.needs, f"needs {check.needs}"))
    return None
