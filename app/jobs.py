"""The native job API: submit, then read the result by id."""

from __future__ import annotations

from flask import Blueprint, current_app, g, jsonify, request

from app.auth import hold_wait_slot
from app.body import json_body
from app.gateway_ext import get_gateway
from app.sse import HEARTBEAT, sse_event, sse_response
from tailguard import settings
from tailguard.errors import InvalidField
from tailguard.gateway.job_request import parse_job_request
from tailguard.gateway.service import check_event_id
from tailguard.gateway.target_headers import parse_target_headers

bp = Blueprint("jobs", __name__, url_prefix="/v1/jobs")


@bp.post("")
def submit():
    """Queue a job on the lane its priority and cost place it in.
    ---
    post:
      summary: Submit a job
      requestBody: {required: true, content: {application/json: {schema: JobRequest}}}
      responses:
        202:
          description: accepted; Location names the job
          headers: {Location: {schema: {type: string}}}
          content: {application/json: {schema: Accepted}}
        400: Native400
        413: Native413
        415: Native415
        429: Native429
    """
    accepted = get_gateway().submit(parse_job_request(json_body()), caller=g.get("api_key"),
                                    asked_target=parse_target_headers(request.headers))
    return jsonify(accepted), 202, {"Location": f"/v1/jobs/{accepted['id']}"}


@bp.get("/<job_id>")
def status(job_id: str):
    """The job; with ?wait=S, once it ended or after S seconds.
    ---
    get:
      summary: A job's state and result
      parameters:
        - {in: path, name: job_id, required: true, schema: {type: string}}
        - {in: query, name: wait, schema: {type: number, minimum: 0},
           description: long-poll up to this many seconds (at most TAILGUARD_MAX_WAIT_S)}
      responses:
        200: {description: the job, content: {application/json: {schema: Job}}}
        400: Native400
        404: Native404
    """
    raw = request.args.get("wait", "0")
    try:
        wait_s = float(raw)
    except ValueError:
        raise InvalidField(f"wait must be a number of seconds, got {raw!r}", field="wait") from None
    max_wait_s = settings.MAX_WAIT_S.get(current_app.config)
    if not 0 <= wait_s <= max_wait_s:
        raise InvalidField(f"wait must be between 0 and {max_wait_s} s", field="wait")
    if wait_s > 0:
        hold_wait_slot()
    return jsonify(get_gateway().status(job_id, wait_s=wait_s, caller=g.get("api_key")))


@bp.delete("/<job_id>")
def cancel(job_id: str):
    """Cancel a queued or running job: 200 with the job; 409 if it already ended.
    ---
    delete:
      summary: Cancel a job
      parameters: [{in: path, name: job_id, required: true, schema: {type: string}}]
      responses:
        200: {description: the cancelled job, content: {application/json: {schema: Job}}}
        404: Native404
        409: Native409
    """
    return jsonify(get_gateway().cancel(job_id, caller=g.get("api_key")))


@bp.get("/<job_id>/stream")
def stream(job_id: str):
    """The job's output as SSE: `delta` events, then one `end` event.

    Each event's id is its Redis Stream id: reconnect with `Last-Event-ID` (or
    `?after=`) to get exactly the events after it. A disconnect leaves the job
    running (it can be resumed) unless `?cancel_on_disconnect=true`.
    ---
    get:
      summary: A job's output as server-sent events
      parameters:
        - {in: path, name: job_id, required: true, schema: {type: string}}
        - {in: header, name: Last-Event-ID, schema: {type: string}, description: resume after this event id}
        - {in: query, name: after, schema: {type: string}, description: resume after this event id}
        - {in: query, name: cancel_on_disconnect, schema: {type: boolean}}
      responses:
        200:
          description: "`delta` events ({text}), then one `end` event (the job's end state)"
          content: {text/event-stream: {schema: SSEEvent}}
        400: Native400
        404: Native404
    """
    after = request.headers.get("Last-Event-ID") or request.args.get("after") or "0-0"
    check_event_id(after)
    cancel_on_disconnect = request.args.get("cancel_on_disconnect", "false").lower() in ("1", "true")
    hold_wait_slot()
    gw, caller = get_gateway(), g.get("api_key")
    events = gw.events(job_id, after, heartbeat_s=settings.SSE_HEARTBEAT_S.get(current_app.config),
                       caller=caller)

    def chunks():
        for ev in events:
            yield HEARTBEAT if ev is None else sse_event(ev.data, event=ev.type, id=ev.id)

    on_disconnect = (lambda: gw.cancel(job_id, reason="the client disconnected", missing_ok=True,
                                       caller=caller)) if cancel_on_disconnect else None
    return sse_response(chunks(), on_disconnect)
