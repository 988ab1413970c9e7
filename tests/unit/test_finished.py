"""The finished-request record: every timing derived from the job's one-clock stamps."""

import pytest

from tailguard.jobs.finished import finished_request


def test_timings_of_a_succeeded_job():
    job = {"status": "succeeded", "lane": "short", "priority": "interactive", "prompt_tokens": 10,
           "requested_max_tokens": None, "max_tokens": 64, "max_tokens_capped": False,
           "submitted_at": 100.0, "running_at": 100.5, "succeeded_at": 102.5, "ttft_s": 0.1,
           "completion_tokens": 20, "worker": "short@h",
           "result": {"text": "…", "completion_tokens": 20, "finish_reason": "length"}}
    r = finished_request("ab" * 16, job)
    assert (r.queued_s, r.e2e_s, r.engine_s) == (0.5, 2.5, 2.0)
    assert r.ttft_s == pytest.approx(0.6)
    assert r.tpot_s == pytest.approx((2.0 - 0.1) / 19)
    assert (r.finish_reason, r.error, r.finished_at) == ("length", None, 102.5)


def test_a_job_that_never_ran():
    job = {"status": "expired", "lane": "batch", "submitted_at": 100.0, "expired_at": 160.0,
           "error": {"code": "expired", "message": "…"}}
    r = finished_request("cd" * 16, job)
    assert (r.queued_s, r.ttft_s, r.engine_s, r.tpot_s) == (None, None, None, None)
    assert (r.e2e_s, r.error, r.max_tokens_capped) == (60.0, "expired", False)


def test_log_line_is_one_json_object():
    import json

    r = finished_request("ef" * 16, {"status": "cancelled", "submitted_at": 1.0, "cancelled_at": 2.0})
    line = r.log_line()
    assert "\n" not in line and json.loads(line)["event"] == "request_finished"
