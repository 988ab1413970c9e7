"""OpenAI-compatible front door: /v1/completions, /v1/chat/completions, /v1/models.

A front door, not a bypass: every request is classified, capped and queued on
its lane exactly like a native job, then answered in OpenAI's shapes (as
vLLM's server answers them). Responses name the lane and whether max_tokens
was capped in X-Tailguard-* headers. A client that goes away, while streaming
or while waiting for a non-streaming answer, cancels its request; a Redis
outage during a stream does not (it ends the stream with an error event).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from flask import Blueprint, Response, current_app, g, jsonify

from app import get_gateway, hold_wait_slot, json_body
from app.errors import exception_response, job_error, openai_error
from app.sse import HEARTBEAT, client_connected, sse_event, sse_response
from tailguard import settings
from tailguard.errors import InvalidField, TailguardError, error_class
from tailguard.gateway.openai_protocol import (
    STREAM_DONE,
    OpenAIRequest,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    openai_finish_reason,
    parse_chat_request,
    parse_completion_request,
    usage_chunk,
)
from tailguard.gateway.service import Gateway
from tailguard.jobs.store import SUCCEEDED
from tailguard.model.chat import (
    chat_template_for,
    compile_chat_template,
    render_chat,
    special_token,
)
from tailguard.model.info import resolve_model_dir, served_model_names

bp = Blueprint("openai", __name__, url_prefix="/v1")

_renderers: dict[str, Callable[[list[dict]], str]] = {}
_renderers_lock = threading.Lock()


def _served_names(gw: Gateway) -> list[str]:
    return served_model_names(gw.counter.model, settings.SERVED_MODEL_NAME.get(current_app.config))


def _chat_renderer(gw: Gateway) -> Callable[[list[dict]], str]:
    """The served model's chat template, compiled once (a broken template fails loudly)."""
    model = gw.counter.model
    with _renderers_lock:
        if model not in _renderers:
            config = gw.counter.tokenizer_config
            folder = resolve_model_dir(model)
            template = chat_template_for(folder, config) if folder is not None else None
            if template is None:
                def no_template(_: list[dict]) -> str:
                    raise InvalidField("the served model has no chat template: use /v1/completions",
                                       field="messages")
                _renderers[model] = no_template
            else:
                compile_chat_template(template)
                bos, eos = special_token(config, "bos_token"), special_token(config, "eos_token")
                _renderers[model] = lambda messages: render_chat(
                    messages, template, bos_token=bos, eos_token=eos)
        return _renderers[model]


@bp.get("/models")
def models():
    """The served model's names, as OpenAI lists models.
    ---
    get:
      summary: List models
      responses:
        200: {description: the served names, content: {application/json: {schema: Models}}}
    """
    gw = get_gateway()
    created = int(time.time())
    return jsonify({"object": "list", "data": [
        {"id": name, "object": "model", "created": created, "owned_by": "tailguard",
         "root": gw.counter.model, "parent": None, "max_model_len": gw.counter.model_max_len}
        for name in _served_names(gw)]})


@bp.post("/completions")
def completions():
    """A text completion, queued on its lane like a native job.
    ---
    post:
      summary: Create a completion (OpenAI)
      requestBody: {required: true, content: {application/json: {schema: CompletionRequest}}}
      responses:
        200: OpenAICompletion
    """
    hold_wait_slot()  # every call waits for its job, streamed or not
    gw = get_gateway()
    return _serve(gw, parse_completion_request(json_body(), set(_served_names(gw))))


@bp.post("/chat/completions")
def chat_completions():
    """A chat completion: the messages rendered by the model's chat template, then as completions.
    ---
    post:
      summary: Create a chat completion (OpenAI)
      requestBody: {required: true, content: {application/json: {schema: ChatRequest}}}
      responses:
        200: OpenAICompletion
    """
    hold_wait_slot()
    gw = get_gateway()
    return _serve(gw, parse_chat_request(json_body(), set(_served_names(gw)), _chat_renderer(gw)))


def _serve(gw: Gateway, req: OpenAIRequest) -> Response:
    accepted = gw.submit(req.job, caller=g.get("api_key"))
    job_id = accepted["id"]
    headers = {"X-Tailguard-Job-Id": job_id, "X-Tailguard-Lane": accepted["lane"],
               "X-Tailguard-Max-Tokens-Capped": "true" if accepted["max_tokens_capped"] else "false",
               "X-Tailguard-Estimated-Start-S": str(accepted["estimated_start_s"])}
    created = int(time.time())
    if req.stream:
        return sse_response(
            _chunks(gw, req, accepted, created, settings.SSE_HEARTBEAT_S.get(current_app.config)),
            on_disconnect=lambda: gw.cancel(job_id, reason="the client disconnected", missing_ok=True),
            headers=headers)
    lane = gw.lanes[accepted["lane"]]
    # Every job ends by then: expired past the queue TTL, cut at the deadline, or worker_lost.
    budget = lane.queue_ttl_s + lane.deadline_s + settings.WORKER_LOST_GRACE_S.get(current_app.config) + 5
    job = gw.wait(job_id, budget, still_wanted=client_connected())
    if job["status"] != SUCCEEDED:
        return exception_response(job_error(job), headers=headers)
    result = job["result"]
    headers["X-Tailguard-Finish-Reason"] = result["finish_reason"]
    build = chat_response if req.kind == "chat" else completion_response
    resp = jsonify(build(request_id=job_id, model=req.model, created=created, text=result["text"],
                         finish_reason=openai_finish_reason(result["finish_reason"]),
                         prompt_tokens=accepted["prompt_tokens"],
                         completion_tokens=result["completion_tokens"]))
    resp.headers.update(headers)
    return resp


def _chunks(gw: Gateway, req: OpenAIRequest, accepted: dict[str, Any], created: int,
            heartbeat_s: float) -> Iterator[bytes]:
    """The job's stream as OpenAI chunks, ending with `data: [DONE]`."""
    job_id, chat = accepted["id"], req.kind == "chat"
    common = {"request_id": job_id, "model": req.model, "created": created}
    first = True
    for event in gw.events(job_id, heartbeat_s=heartbeat_s, just_submitted=True):
        if event is None:
            yield HEARTBEAT
            continue
        if event.type == "error":  # following stopped early (Redis down too long): the job goes on
            error = event.data["error"]
            yield sse_event(openai_error((error_class(error["code"]) or TailguardError)(
                error["message"])))
            break
        if event.type == "delta":
            text = event.data.get("text", "")
            yield sse_event(chat_chunk(**common, text=text, first=first) if chat
                            else completion_chunk(**common, text=text))
            first = False
            continue
        end = event.data  # the end event
        if end["status"] != SUCCEEDED:
            yield sse_event(openai_error(job_error(end)))
            break
        reason = openai_finish_reason(end.get("finish_reason", "stop"))
        if chat and first:  # nothing was generated: the role still comes first
            yield sse_event(chat_chunk(**common, first=True))
        yield sse_event(chat_chunk(**common, finish_reason=reason) if chat
                        else completion_chunk(**common, text="", finish_reason=reason))
        if req.include_usage:
            yield sse_event(usage_chunk(kind=req.kind, **common,
                                        prompt_tokens=accepted["prompt_tokens"],
                                        completion_tokens=end.get("completion_tokens", 0)))
        break
    yield sse_event(STREAM_DONE)
