"""The native job API: submit, then read the result by id."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify, request

from app import get_gateway
from tailguard.errors import InvalidField
from tailguard.jobrequest import parse_job_request

bp = Blueprint("jobs", __name__, url_prefix="/v1/jobs")


@bp.post("")
def submit():
    body = request.get_json(force=True, silent=True)
    if body is None:
        raise InvalidField("the body must be valid JSON", field="body")
    accepted = get_gateway().submit(parse_job_request(body))
    return jsonify(accepted), 202, {"Location": f"/v1/jobs/{accepted['id']}"}


@bp.get("/<job_id>")
def status(job_id: str):
    raw = request.args.get("wait", "0")
    try:
        wait_s = float(raw)
    except ValueError:
        raise InvalidField(f"wait must be a number of seconds, got {raw!r}", field="wait") from None
    if not 0 <= wait_s <= current_app.config["TAILGUARD_MAX_WAIT_S"]:
        raise InvalidField(f"wait must be between 0 and {current_app.config['TAILGUARD_MAX_WAIT_S']} s",
                           field="wait")
    return jsonify(get_gateway().status(job_id, wait_s=wait_s))
