"""GET /openapi.json: the API described by apispec from the routes themselves.

Each view documents its own operation in the YAML after ``---`` in its docstring
(apispec's Flask plugin reads it, with the path from the view's URL rule). What
would otherwise be written twice is generated here from its owner: request
bodies from the sampling table (``tailguard.sampling.FIELDS``), the OpenAI ones from what
tailguard adds to vLLM's own request models (the bodies are vLLM's: its documentation
describes every field), the error responses from the exception tree
(``tailguard.errors``: which codes each status carries), the 401 and the bearer
scheme from the one rule that says which paths need a key (``needs_api_key``).
"""

from __future__ import annotations

from typing import Any

from apispec import APISpec, BasePlugin
from apispec_webframeworks.flask import FlaskPlugin
from flask import Blueprint, Flask, current_app, jsonify

from app.auth import needs_api_key
from app.errors import HTTP_CODES, OPENAI_BLUEPRINTS
from tailguard.errors import Refused, Unavailable, error_classes
from tailguard.gateway.target_headers import TPOT_HEADERS, TTFT_HEADERS
from tailguard.lanes.table import PRIORITY_CLASSES
from tailguard.sampling import FIELDS, MAX_STOP_CHARS, SamplingField

bp = Blueprint("openapi", __name__)

#: error statuses a view may list in its docstring (the tree's and Flask's own); each becomes a
#: response component per API, e.g. Native404 and OpenAI404
ERROR_STATUSES = sorted({c.http_status for c in error_classes()} | set(HTTP_CODES))

_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying (from the lane's "
                                               "predicted wait, or the key's bucket)",
                                "required": True, "schema": {"type": "integer", "minimum": 1}}}


@bp.get("/openapi.json")
def openapi():
    """The OpenAPI description of this API, built once per app.
    ---
    get:
      summary: This document
      responses:
        200:
          description: OpenAPI 3 description of every route
          content:
            application/json:
              schema: {type: object}
    """
    spec = current_app.extensions.get("tailguard.openapi")
    if spec is None:
        spec = current_app.extensions["tailguard.openapi"] = build_spec(current_app)
    return jsonify(spec)


def build_spec(app: Flask) -> dict[str, Any]:
    """The description of every route of ``app``, as a dict ready for JSON."""
    spec = APISpec(title="tailguard", version=_version(), openapi_version="3.0.3",
                   plugins=[FlaskPlugin(), _KeyProtected()],
                   info={"description": "Lanes of Celery queues in front of vLLM workers: a native "
                                        "job API and an OpenAI-compatible one."})
    spec.components.security_scheme("apiKey", {
        "type": "http", "scheme": "bearer",
        "description": "`tailguard keys add NAME` makes one; needed in keys mode "
                       "(TAILGUARD_API_AUTH), the default on any bind but loopback"})
    for name, schema in _schemas().items():
        spec.components.schema(name, schema)
    for family in ("Native", "OpenAI"):
        for status in ERROR_STATUSES:
            spec.components.response(f"{family}{status}", _error_response(family, status))
    spec.components.response("OpenAICompletion", {
        "description": "the answer; with stream=true, OpenAI chunks as server-sent events ending "
                       "with `data: [DONE]`",
        "headers": {"X-Tailguard-Lane": {"schema": {"type": "string"}},
                    "X-Tailguard-Estimated-Start-S": {"schema": {"type": "number"}}},
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Completion"}},
                    "text/event-stream": {"schema": {"$ref": "#/components/schemas/SSEEvent"}}}})
    spec.components.response("OpenAIResponse", {
        "description": "the response; with stream=true, its events as server-sent events, each "
                       "named by its type (`event: response.output_text.delta`), without [DONE]",
        "headers": {"X-Tailguard-Lane": {"schema": {"type": "string"}},
                    "X-Tailguard-Estimated-Start-S": {"schema": {"type": "number"}}},
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Response"}},
                    "text/event-stream": {"schema": {"$ref": "#/components/schemas/SSEEvent"}}}})
    with app.test_request_context():
        for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
            if rule.endpoint == "static":
                continue
            spec.path(view=app.view_functions[rule.endpoint], app=app, endpoint=rule.endpoint)
    return spec.to_dict()


#: the views that submit a job: they read the latency-target headers
SUBMITTING_ENDPOINTS = frozenset({"jobs.submit", "openai.completions", "openai.chat_completions"})


def _target_header(names: tuple[str, ...], what: str) -> dict[str, Any]:
    return {"in": "header", "name": names[0], "schema": {"type": "number", "minimum": 0,
                                                          "exclusiveMinimum": True},
            "description": f"{what} (alias {names[1]})"}


_TARGET_HEADERS = [
    _target_header(TTFT_HEADERS, "time-to-first-token target in ms, clamped into the key's "
                   "bounds: placed on a lane whose predicted wait meets it, else refused (429 "
                   "wait_past_target)"),
    _target_header(TPOT_HEADERS, "time-per-output-token target in ms, clamped into the key's "
                   "bounds: recorded and reported")]


class _KeyProtected(BasePlugin):
    """What every operation of a key-protected path has: the scheme, 401, 429 (each call counts
    toward its key's requests per minute) and 503 (Redis down), in the error shape of the
    view's API; an OpenAI generation, every error status; a submission, the latency-target
    headers."""

    def operation_helper(self, path: str | None = None, operations: dict | None = None,
                         **kwargs: Any) -> None:
        if path is None or operations is None or not needs_api_key(path):
            return
        family = "OpenAI" if kwargs["endpoint"].split(".")[0] in OPENAI_BLUEPRINTS else "Native"
        for op in operations.values():
            op["security"] = [{"apiKey": []}]
            op["responses"].setdefault(401, f"{family}401")
            op["responses"].setdefault(429, f"{family}429")
            op["responses"].setdefault(503, f"{family}503")
            if kwargs["endpoint"] in SUBMITTING_ENDPOINTS:
                op.setdefault("parameters", []).extend(_TARGET_HEADERS)
            if family == "OpenAI" and "requestBody" in op:
                # a generation: any error of the tree can answer it
                for status in ERROR_STATUSES:
                    op["responses"].setdefault(status, f"OpenAI{status}")


def _error_response(family: str, status: int) -> dict[str, Any]:
    codes = [c.code for c in error_classes() if c.http_status == status]
    codes += [code for s, code in HTTP_CODES.items() if s == status and code not in codes]
    response: dict[str, Any] = {
        "description": f"error; code: {', '.join(codes)}",
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{family}Error"}}}}
    if status == Refused.http_status:
        response["headers"] = _RETRY_AFTER
    elif status == Unavailable.http_status:  # a dependency down: Retry-After; an expired job: none
        response["headers"] = {"Retry-After": {**_RETRY_AFTER["Retry-After"], "required": False,
                                               "description": "seconds to wait before retrying "
                                                              "(Redis or the lane's workers down)"}}
    return response


# ---------------------------------------------------------------- schemas


def sampling_schema(f: SamplingField) -> dict[str, Any]:
    """The JSON schema of one row of the sampling table (null means "the default")."""
    if f.kind == "bool":
        schema: dict[str, Any] = {"type": "boolean"}
    elif f.kind == "stop":
        one = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}
        schema = {"oneOf": [one, {"type": "array", "items": one, "maxItems": int(f.hi)}]}
    else:
        schema = {"type": "integer" if f.kind == "int" else "number"}
        if f.lo is not None:
            schema["minimum"] = f.lo
            if f.lo_open:
                schema["exclusiveMinimum"] = True
        if f.hi is not None:
            schema["maximum"] = f.hi
        if f.off is not None:
            schema = {"oneOf": [{"type": "integer", "enum": [f.off]}, schema]}
    return {**schema, "nullable": True}


def _sampling(api: str) -> dict[str, Any]:
    return {f.name: sampling_schema(f) for f in FIELDS if f.accepted_by(api)}


_PROMPT = {"type": "string", "minLength": 1}
_VLLM_BODY = ("vLLM's {model} (vllm/entrypoints/openai/): every field it takes, as vLLM's "
              "server takes it; unknown fields are ignored; docs/api.md lists the few refused")
_PRIORITY = {"type": "string", "enum": list(PRIORITY_CLASSES)}
_NULLABLE_STR = {"type": "string", "nullable": True}
_TARGET_ASKED = ("only when the request asked for a latency target (x-llm-d-slo-ttft-ms, "
                 "x-llm-d-slo-tpot-ms): ttft_ms and tpot_ms applied, asked_ttft_ms and "
                 "asked_tpot_ms, clamped (whether the key's bounds changed them)")
_TARGET_OUTCOME = ("only when the request asked for a latency target: ttft_ms and tpot_ms "
                   "applied, ttft_met and tpot_met (null until known)")
_NULLABLE_INT = {"type": "integer", "nullable": True}


def _schemas() -> dict[str, dict[str, Any]]:
    # vLLM's request models, with what tailguard adds: the rest is vLLM's (any field it
    # takes means what it means there; unknown fields are ignored, as vLLM ignores them)
    openai_common = {
        "model": {"type": "string", "nullable": True,
                  "description": "one of GET /v1/models' ids (omitted: the served model)"},
        "priority": {"nullable": True, "oneOf": [_PRIORITY, {"type": "integer"}],
                     "description": "tailguard's class (interactive, batch: the lanes it may "
                                    "take), or vLLM's integer priority"},
        "stream": {"type": "boolean", "nullable": True},
        "max_tokens": {"type": "integer", "minimum": 1, "nullable": True,
                       "description": "omitted: vLLM's default within the lane's cap"},
    }
    job_fields = {"id": {"type": "string"}, "status": {"type": "string"}, "lane": _NULLABLE_STR,
                  "priority": _NULLABLE_STR, "prompt_tokens": _NULLABLE_INT,
                  "requested_max_tokens": _NULLABLE_INT, "max_tokens": _NULLABLE_INT,
                  "max_tokens_capped": {"type": "boolean"}}
    request_id = {**_NULLABLE_STR, "description": "an OpenAI request's vLLM id (its response's "
                  "id: chatcmpl-<base>, cmpl-<base>, resp_...)"}
    usage = {"type": "object", "properties": {k: {"type": "integer"} for k in (
        "prompt_tokens", "completion_tokens", "total_tokens")}}
    return {
        "SSEEvent": {"type": "object", "required": ["data"],
                     "description": "one server-sent event: its data line(s), and its type and id "
                                    "where the route sends them",
                     "properties": {"data": {"type": "string"}, "event": {"type": "string"},
                                    "id": {"type": "string"}}},
        "NativeError": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["code", "message"], "additionalProperties": False,
            "properties": {"code": {"type": "string"}, "message": {"type": "string"},
                           "field": {"type": "string"}}}}},
        "OpenAIError": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["message", "type", "param", "code"],
            "additionalProperties": False,
            "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                           "param": _NULLABLE_STR, "code": _NULLABLE_STR}}}},
        "JobRequest": {"type": "object", "required": ["prompt"], "additionalProperties": False,
                       "properties": {"prompt": _PROMPT, "priority": _PRIORITY, **_sampling("native")}},
        "CompletionRequest": {
            "type": "object", "required": ["prompt"],
            "description": _VLLM_BODY.format(model="CompletionRequest"),
            "properties": {**openai_common, "prompt": {"oneOf": [
                _PROMPT, {"type": "array", "items": {"type": "integer", "minimum": 0},
                          "minItems": 1},
                {"type": "array", "items": _PROMPT, "minItems": 1, "maxItems": 1}]}}},
        "ChatRequest": {
            "type": "object", "required": ["messages"],
            "description": _VLLM_BODY.format(model="ChatCompletionRequest"),
            "properties": {**openai_common,
                           "messages": {"type": "array", "minItems": 1, "items": {
                               "type": "object", "required": ["role"],
                               "properties": {"role": {"type": "string"}}}},
                           "max_completion_tokens": {"type": "integer", "minimum": 1,
                                                     "nullable": True}}},
        "ResponsesRequest": {
            "type": "object", "required": ["input"],
            "description": _VLLM_BODY.format(model="ResponsesRequest") + "; previous_response_id, "
                           "store=true and background=true are refused (nothing is stored)",
            "properties": {**{k: v for k, v in openai_common.items() if k != "max_tokens"},
                           "input": {"oneOf": [{"type": "string"}, {"type": "array"}]},
                           "instructions": _NULLABLE_STR,
                           "max_output_tokens": {"type": "integer", "minimum": 1,
                                                 "nullable": True},
                           "store": {"type": "boolean", "nullable": True, "enum": [False, None]},
                           "previous_response_id": {"nullable": True, "enum": [None]}}},
        "Accepted": {"type": "object", "required": [*job_fields, "cost", "estimated_start_s"],
                     "properties": {**job_fields, "cost": {"type": "integer"},
                                    "estimated_start_s": {"type": "number"},
                                    "latency_target": {
                                        "type": "object", "description": _TARGET_ASKED}}},
        "Job": {"type": "object", "required": [*job_fields, "request_id", "result", "error",
                                               "timing"],
                "properties": {**job_fields, "request_id": request_id, "result": {
                    "type": "object", "nullable": True,
                    "description": "text, completion_tokens, finish_reason; text is null, with "
                                   "text_expired, once TAILGUARD_OUTPUT_TTL_S has passed"},
                               "error": {"type": "object", "nullable": True},
                               "worker": _NULLABLE_STR, "timing": {"type": "object"},
                               "latency_target": {"type": "object",
                                                  "description": _TARGET_OUTCOME}}},
        "Response": {"type": "object", "required": ["id", "object", "output", "status"],
                     "properties": {"id": {"type": "string"}, "object": {"type": "string"},
                                    "output": {"type": "array"}, "status": {"type": "string"},
                                    "usage": {"type": "object", "nullable": True}}},
        "Completion": {"type": "object", "required": ["id", "object", "choices", "usage"],
                       "properties": {"id": {"type": "string"}, "object": {"type": "string"},
                                      "choices": {"type": "array"}, "usage": usage}},
        "Models": {"type": "object", "required": ["object", "data"], "properties": {
            "object": {"type": "string", "enum": ["list"]},
            "data": {"type": "array", "items": {"type": "object", "required": ["id", "object"]}}}},
        "Lanes": {"type": "object", "required": ["lanes", "workers"], "properties": {
            "model": _NULLABLE_STR, "model_max_len": {"type": "integer"},
            "lanes": {"type": "array", "items": {"type": "object"}},
            "workers": {"type": "array", "items": {"type": "object"}}}},
        "Probe": {"type": "object", "required": ["status"], "properties": {
            "status": {"type": "string", "enum": ["ok", "unready"]},
            "redis": {"type": "string", "description": "ok, or why Redis did not answer"}}},
        "Health": {"type": "object", "required": ["status", "workers_per_lane"], "properties": {
            "status": {"type": "string", "enum": ["ok", "degraded"]},
            "auth": {"type": "string", "enum": ["open", "keys"],
                     "description": "whether /v1/ calls need an API key (TAILGUARD_API_AUTH): open "
                     "asks none, and every caller sees every job"},
            "redis": {"type": "string"},
            "workers_per_lane": {"type": "object", "additionalProperties": {"type": "integer"}},
            "lanes_without_worker": {"type": "array", "items": {"type": "string"}},
            "storage": {"type": "object", "description": "Redis memory against its high-water "
                        "mark; full: submits answer 503 storage_full"}}},
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tailguard")
    except PackageNotFoundError:
        return "0"
