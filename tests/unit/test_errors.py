"""The error tree and its one mapping to HTTP: every member answers with its status and code."""

import json

import pytest
from flask import Flask

from app.errors import error_response, exception_response
from tailguard import errors
from tailguard.errors import (
    EngineError,
    JobCancelled,
    JobError,
    JobExpired,
    ModelNotFound,
    PromptTooLong,
    ResultTimeout,
    TailguardError,
    Unavailable,
    error_class,
)
from tailguard.gateway.openai_errors import openai_error, openai_error_type
from tailguard.gateway.service import job_error
from tailguard.jobs.store import CANCELLED, EXPIRED, FAILED, QUEUED, RUNNING


def _below(cls):
    return [c for sub in cls.__subclasses__() for c in (sub, *_below(sub))]


MEMBERS = _below(TailguardError)
#: what a job record can say: the job errors and the engine's
JOB_CODES = [c for c in MEMBERS if issubclass(c, (JobError, EngineError))]


def test_codes_below_the_root_are_unique():
    codes = [c.code for c in MEMBERS]
    assert len(codes) == len(set(codes))


def test_the_tree_drawing_lists_every_member_with_its_code_and_status():
    drawn = errors.__doc__
    for cls in MEMBERS:
        line = next(l for l in drawn.splitlines() if f" {cls.__name__} " in l)
        assert f" {cls.code} " in line and str(cls.http_status) in line, line


@pytest.mark.parametrize("openai", [False, True], ids=["native", "openai"])
@pytest.mark.parametrize("cls", [TailguardError, *MEMBERS], ids=lambda c: c.__name__)
def test_every_member_maps_to_its_status_and_code(cls, openai):
    assert 400 <= cls.http_status < 600
    app = Flask(__name__)
    with app.test_request_context("/v1/completions" if openai else "/v1/jobs"):
        resp = exception_response(cls("why", field="f"), headers={"X-Tailguard-Lane": "short"})
    body = json.loads(resp.get_data())["error"]
    assert resp.status_code == cls.http_status and resp.headers["X-Tailguard-Lane"] == "short"
    if openai:
        assert body == {"message": "why", "type": openai_error_type(cls.http_status), "param": "f",
                        "code": cls.code}
    else:
        assert body == {"code": cls.code, "message": "why", "field": "f"}


def _state(cls):
    return {JobExpired: EXPIRED, JobCancelled: CANCELLED}.get(cls, FAILED)


@pytest.mark.parametrize("cls", JOB_CODES, ids=lambda c: c.__name__)
def test_every_job_error_code_round_trips_through_the_record(cls):
    assert error_class(cls.code) is cls
    err = job_error({"status": _state(cls), "error": cls("what happened").to_dict()})
    assert (type(err), err.code, err.message, err.http_status) == \
        (cls, cls.code, "what happened", cls.http_status)


@pytest.mark.parametrize("job,status,code", [
    # what the OpenAI endpoints answered before the tree owned these codes
    ({"status": EXPIRED, "error": {"code": "expired", "message": "m"}}, 503, "expired"),
    ({"status": CANCELLED, "error": {"code": "cancelled", "message": "m"}}, 400, "cancelled"),
    ({"status": FAILED, "error": {"code": "worker_lost", "message": "m"}}, 500, "worker_lost"),
    ({"status": FAILED, "error": {"code": "engine_dead", "message": "m"}}, 500, "engine_dead"),
    # quarantined: a 4xx, so clients that retry 5xx on their own do not send it again
    ({"status": FAILED, "error": {"code": "poison_request", "message": "m"}}, 422, "poison_request"),
    ({"status": FAILED, "error": {"code": "internal_error", "message": "m"}}, 500, "internal_error"),
    # a record without a known code: its state decides
    ({"status": EXPIRED}, 503, "expired"),
    # cancelled: a 400 as vLLM answers an aborted request; the SDKs retry a 409 into a new job
    ({"status": CANCELLED, "error": None}, 400, "cancelled"),
    ({"status": FAILED, "error": {"message": "m"}}, 500, "engine_error"),
    ({"status": FAILED, "error": {"code": "from_a_newer_worker"}}, 500, "engine_error"),
    # still going when the caller stopped waiting
    ({"status": RUNNING}, 504, "timeout"),
    ({"status": QUEUED}, 504, "timeout"),
])
def test_job_error_by_record(job, status, code):
    err = job_error(job)
    assert (err.http_status, err.code) == (status, code)
    assert err.message


def test_job_error_messages():
    assert job_error({"status": EXPIRED, "error": {"code": "expired", "message": "waited"}}).message \
        == "waited"
    assert job_error({"status": FAILED}).message == "the request ended failed"
    assert isinstance(job_error({"status": RUNNING}), ResultTimeout)
    assert "running" in job_error({"status": RUNNING}).message


@pytest.mark.parametrize("status,type_", [
    (400, "invalid_request_error"), (404, "invalid_request_error"), (409, "invalid_request_error"),
    (413, "invalid_request_error"), (422, "invalid_request_error"), (401, "authentication_error"),
    (403, "permission_error"), (429, "rate_limit_error"), (500, "server_error"),
    (503, "server_error"), (504, "server_error"),
])
def test_openai_error_type(status, type_):
    assert openai_error_type(status) == type_


def test_openai_error_bodies():
    assert openai_error(ModelNotFound("The model `x` does not exist.", field="model")) == \
        {"error": {"message": "The model `x` does not exist.", "type": "invalid_request_error",
                   "param": "model", "code": "model_not_found"}}
    assert openai_error(PromptTooLong("too long"))["error"]["param"] is None
    assert openai_error(Unavailable("later"))["error"]["type"] == "server_error"
    # what a failed OpenAI stream sends last
    assert openai_error(job_error({"status": CANCELLED, "error": JobCancelled("gone").to_dict()})) == \
        {"error": {"message": "gone", "type": "invalid_request_error", "param": None,
                   "code": "cancelled"}}


def test_http_errors_outside_the_tree():
    app = Flask(__name__)
    with app.test_request_context("/v1/jobs"):
        resp = error_response(405, "method_not_allowed", "no")
    assert resp.status_code == 405
    assert json.loads(resp.get_data()) == {"error": {"code": "method_not_allowed", "message": "no"}}
