"""OpenAI-compatible front door, as vLLM's server: /v1/completions, /v1/chat/completions,
/v1/responses, /v1/models, and vLLM's /health, /version, /tokenize, /detokenize.

A front door, not a bypass: every request is validated and rendered by vLLM's own render
layer in this process (tailguard/gateway/openai_frontend.py), refused with a 400 there if
vLLM would refuse it, then costed with its exact prompt tokens, placed, capped and queued
on its lane like a native job. The worker runs it through vLLM's own serving layer, so the
chunks and the response relayed here are vLLM's, byte for byte, with the documented
``tailguard`` field on the final ones (docs/api.md). Responses name the job, the lane and
whether max_tokens was capped in X-Tailguard-* headers. A client that goes away, while
streaming or while waiting for a non-streamed answer, cancels its request; a Redis outage
during a stream does not (it ends the stream with an error event).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, current_app, g, jsonify, request

from app.auth import hold_wait_slot
from app.body import json_body
from app.errors import exception_response
from app.gateway_ext import get_gateway
from app.sse import DONE, HEARTBEAT, client_connected, sse_event, sse_response
from tailguard import settings
from tailguard.errors import InternalJobError, InvalidField, TailguardError, error_class
from tailguard.gateway.openai_errors import openai_error
from tailguard.gateway.openai_request import Endpoint
from tailguard.gateway.service import Gateway, job_error, succeeded
from tailguard.gateway.target_headers import parse_target_headers

bp = Blueprint("openai", __name__, url_prefix="/v1")
#: vLLM's server routes outside /v1 (its error shape too: app/errors.py)
server_bp = Blueprint("vllm", __name__)

#: the request header vLLM's server takes a request id from, and echoes
REQUEST_ID_HEADER = "X-Request-Id"


def _frontend(gw: Gateway) -> Any:
    if gw.openai is None:
        raise InvalidField("this API serves no OpenAI routes", field="body")
    return gw.openai


@bp.get("/models")
def models():
    """The served model's names, as vLLM lists them, with the longest context a lane serves.
    ---
    get:
      summary: List models
      responses:
        200: {description: the served names, content: {application/json: {schema: Models}}}
    """
    return jsonify(_frontend(get_gateway()).models())


@bp.post("/completions")
def completions():
    """A text completion (vLLM's CompletionRequest), queued on its lane like a native job.
    ---
    post:
      summary: Create a completion (OpenAI)
      requestBody: {required: true, content: {application/json: {schema: CompletionRequest}}}
      responses:
        200: OpenAICompletion
    """
    return _serve("completion")


@bp.post("/responses")
def responses():
    """A response (vLLM's ResponsesRequest, OpenAI's Responses API), queued on its lane like a
    chat; nothing is stored (previous_response_id, store and background are refused).
    ---
    post:
      summary: Create a response (OpenAI Responses API)
      requestBody: {required: true, content: {application/json: {schema: ResponsesRequest}}}
      responses:
        200: OpenAIResponse
    """
    return _serve("responses")


@bp.post("/chat/completions")
def chat_completions():
    """A chat completion (vLLM's ChatCompletionRequest), rendered by vLLM's chat template.
    ---
    post:
      summary: Create a chat completion (OpenAI)
      requestBody: {required: true, content: {application/json: {schema: ChatRequest}}}
      responses:
        200: OpenAICompletion
    """
    return _serve("chat")


def _serve(endpoint: Endpoint) -> Response:
    hold_wait_slot()  # every call waits for its job, streamed or not
    gw = get_gateway()
    job = gw.prepare_openai(endpoint, json_body(), request.headers.get(REQUEST_ID_HEADER))
    accepted = gw.submit(job, caller=g.get("api_key"),
                         asked_target=parse_target_headers(request.headers))
    job_id = accepted["id"]
    headers = {"X-Tailguard-Job-Id": job_id, "X-Tailguard-Lane": accepted["lane"],
               "X-Tailguard-Max-Tokens-Capped": "true" if accepted["max_tokens_capped"] else "false",
               "X-Tailguard-Estimated-Start-S": str(accepted["estimated_start_s"])}
    if job.stream:
        relay = _relay_events if endpoint == "responses" else _relay
        return sse_response(
            relay(gw, job_id, settings.SSE_HEARTBEAT_S.get(current_app.config)),
            on_disconnect=lambda: gw.cancel(job_id, reason="the client disconnected", missing_ok=True),
            headers=headers)
    lane = gw.lanes[accepted["lane"]]
    # Every job ends by then: expired past the queue TTL, cut at the deadline, or worker_lost.
    budget = lane.queue_ttl_s + lane.deadline_s + settings.WORKER_LOST_GRACE_S.get(current_app.config) + 5
    done = gw.wait(job_id, budget, still_wanted=client_connected())
    if not succeeded(done):
        return exception_response(job_error(done), headers=headers)
    body = gw.response_body(job_id)
    if body is None:  # a worker that ended the job without vLLM's response: a bug of ours
        return exception_response(InternalJobError(
            f"job {job_id} succeeded without a response in its stream"), headers=headers)
    headers["X-Tailguard-Finish-Reason"] = str((done.get("result") or {}).get("finish_reason"))
    return Response(body, status=200, mimetype="application/json", headers=headers)


@bp.after_request
@server_bp.after_request
def _echo_request_id(response: Response) -> Response:
    """X-Request-Id echoed on every answer, errors included, as vLLM's server echoes it
    (--enable-request-id-headers). The body's id is built from it as vLLM builds it
    (tailguard.gateway.openai_request.OpenAIJob.base_request_id)."""
    given = request.headers.get(REQUEST_ID_HEADER)
    if given:
        response.headers[REQUEST_ID_HEADER] = given
    return response


def _relay(gw: Gateway, job_id: str, heartbeat_s: float) -> Iterator[bytes]:
    """The job's stream as vLLM sent it: each of vLLM's chunk payloads one SSE event, however
    the worker batched them into entries; then `data: [DONE]`."""
    for payload in _payloads(gw, job_id, heartbeat_s):
        yield payload if isinstance(payload, bytes) else sse_event(payload)
    yield sse_event(DONE)


def _relay_events(gw: Gateway, job_id: str, heartbeat_s: float) -> Iterator[bytes]:
    """A Responses stream as vLLM's server frames it: each event named by its type
    (``event: response.output_text.delta``), and no [DONE]."""
    for payload in _payloads(gw, job_id, heartbeat_s):
        if isinstance(payload, bytes):
            yield payload
        elif isinstance(payload, str):
            yield sse_event(payload, event=json.loads(payload).get("type", "unknown"))
        else:  # an error of ours, in vLLM's error event's shape
            yield sse_event(payload, event="error")


def _payloads(gw: Gateway, job_id: str, heartbeat_s: float) -> Iterator[bytes | str | dict]:
    """The job's stream: vLLM's payloads (str) as the worker wrote them, heartbeats (bytes),
    and an error body (dict) when the job failed or following it stopped early."""
    for event in gw.events(job_id, heartbeat_s=heartbeat_s, just_submitted=True):
        if event is None:
            yield HEARTBEAT
            continue
        if event.type == "error":  # following stopped early (Redis down too long): the job goes on
            error = event.data["error"]
            yield openai_error((error_class(error["code"]) or TailguardError)(error["message"]))
            return
        if event.type != "end":
            yield from event.payloads
            continue
        if not succeeded(event.data):
            yield openai_error(job_error(event.data))
        return


@server_bp.get("/health")
def health():
    """vLLM's health check: 200 once this process can serve OpenAI requests (its render layer
    is built), 503 before (or when it could not be built). Lanes and workers: /healthz.
    ---
    get:
      summary: Health (vLLM's)
      responses:
        200: {description: ready}
        503: {description: vLLM's render layer is starting, or failed to start}
    """
    return Response(status=200 if get_gateway().openai_ready() else 503)


@server_bp.get("/version")
def version():
    """vLLM's version, as vLLM's server reports it.
    ---
    get:
      summary: vLLM's version
      responses:
        200: {description: "{version}", content: {application/json: {schema: {type: object}}}}
    """
    return jsonify({"version": _frontend(get_gateway()).version()})


@server_bp.post("/tokenize")
def tokenize():
    """A prompt or chat as the served model's token ids (vLLM's TokenizeRequest).
    ---
    post:
      summary: Tokenize (vLLM's)
      requestBody: {required: true, content: {application/json: {schema: {type: object}}}}
      responses:
        200: {description: "count, max_model_len, tokens",
              content: {application/json: {schema: {type: object}}}}
    """
    return jsonify(_frontend(get_gateway()).tokenize(json_body()).body)


@server_bp.post("/detokenize")
def detokenize():
    """Token ids as the served model's text (vLLM's DetokenizeRequest).
    ---
    post:
      summary: Detokenize (vLLM's)
      requestBody: {required: true, content: {application/json: {schema: {type: object}}}}
      responses:
        200: {description: "prompt", content: {application/json: {schema: {type: object}}}}
    """
    return jsonify(_frontend(get_gateway()).detokenize(json_body()).body)
