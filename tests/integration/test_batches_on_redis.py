"""The Batch API on a real Redis and the API's real render layer, with no engine: files, batches,
validation, the feeder's feeding, collecting, restart, cancel and expiry (tailguard/batches/).
A stand-in worker moves each queued line's job through the job store as a worker would and
writes a response; the same on real workers and engines: tests/e2e/test_batch_api_e2e.py."""

from __future__ import annotations

import io
import json

import pytest
from openai.types import Batch, FileObject

from app.gateway_ext import BATCHES_EXTENSION, _batches, get_gateway
from tailguard import settings
from tailguard.batches.feeder import BatchFeeder
from tailguard.batches.lines import line_job_id
from tailguard.gateway.api_keys import BATCH_TOKENS, ApiKey, ApiKeyStore
from tailguard.jobs.store import QUEUED, RUNNING, SUCCEEDED
from tailguard.jobs.stream import DeltaWriter
from tailguard.redis import keys

pytestmark = pytest.mark.integration


@pytest.fixture
def app(api_app, redis_client, tmp_path):
    """The session's app with its Batch API on a fresh directory and a fresh Redis."""
    api_app.config[settings.BATCH_STORAGE.env] = str(tmp_path / "files")
    api_app.extensions.pop(BATCHES_EXTENSION, None)
    yield api_app
    api_app.extensions.pop(BATCHES_EXTENSION, None)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def model(client):
    return client.get("/v1/models").get_json()["data"][0]["id"]


def feeder_of(app, owner="feeder-1", in_flight=4) -> BatchFeeder:
    with app.app_context():
        service, _ = _batches(app)
        return BatchFeeder(service.store, get_gateway(), lines_in_flight=in_flight, period_s=0.1,
                           max_lines=1000, max_file_bytes=1 << 20, owner=owner)


def chat_lines(model, n, *, bad=()):
    out = []
    for i in range(n):
        body = {"model": model, "messages": [{"role": "user", "content": f"hi {i}"}],
                "max_tokens": 4}
        if i in bad:
            body["max_tokens"] = -1  # vLLM's request model refuses it
        out.append({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": body})
    return b"".join(json.dumps(x).encode() + b"\n" for x in out)


def upload(client, data: bytes, headers=None) -> dict:
    resp = client.post("/v1/files", data={"purpose": "batch", "file": (io.BytesIO(data), "in.jsonl")},
                       content_type="multipart/form-data", headers=headers or {})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return resp.get_json()


def create(client, file_id, headers=None, endpoint="/v1/chat/completions") -> dict:
    resp = client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": endpoint,
                                            "completion_window": "24h", "metadata": {"t": "1"}},
                       headers=headers or {})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return resp.get_json()


def run_queued(store, batch_id: str, indices) -> int:
    """The stand-in worker: each queued job of these lines runs and answers; how many ran."""
    ran = 0
    for index, attempt in store.pending(batch_id).items():
        if index not in indices:
            continue
        job_id = line_job_id(batch_id, index, attempt)
        gw_store = store.jobs
        if gw_store.get(job_id)["status"] != QUEUED:
            continue
        assert gw_store.start(job_id, "stand-in").started
        writer = DeltaWriter(gw_store.redis, job_id)
        writer.write_response(json.dumps({"id": f"chatcmpl-{job_id}", "object": "chat.completion",
                                          "created": 1, "model": "m", "choices": [
                                              {"index": 0, "message": {"role": "assistant",
                                                                       "content": f"line {index}"},
                                               "finish_reason": "length"}],
                                          "usage": {"prompt_tokens": 3, "completion_tokens": 4,
                                                    "total_tokens": 7}}))
        writer.close()
        moved, _ = gw_store.transition(job_id, {RUNNING}, SUCCEEDED,
                                       {"result": {"finish_reason": "length"}})
        assert moved
        ran += 1
    return ran


def drive(app, client, batch_id, feeder, until=("completed",), rounds=200, run=lambda i: True):
    store = feeder.store
    store.jobs = feeder.gateway.store
    for _ in range(rounds):
        feeder.tick()
        batch = client.get(f"/v1/batches/{batch_id}").get_json()
        if batch["status"] in until:
            return batch
        run_queued(store, batch_id, {i for i in store.pending(batch_id) if run(i)})
    raise AssertionError(f"batch {batch_id} is still {batch['status']}")


def read_file(client, file_id) -> list[dict]:
    resp = client.get(f"/v1/files/{file_id}/content")
    assert resp.status_code == 200
    return [json.loads(ln) for ln in resp.get_data().splitlines()]


def test_files_are_uploaded_listed_read_and_deleted(client, app, tmp_path):
    f = FileObject.model_validate(upload(client, b'{"a": 1}\n'))
    assert f.purpose == "batch" and f.bytes == 9 and f.filename == "in.jsonl"
    assert client.get(f"/v1/files/{f.id}").get_json()["id"] == f.id
    assert client.get(f"/v1/files/{f.id}/content").get_data() == b'{"a": 1}\n'
    listed = client.get("/v1/files").get_json()
    assert [x["id"] for x in listed["data"]] == [f.id] and listed["has_more"] is False
    stored = tmp_path / "files" / f.id
    assert stored.stat().st_mode & 0o777 == 0o600 and (tmp_path / "files").stat().st_mode & 0o777 == 0o700
    assert client.delete(f"/v1/files/{f.id}").get_json() == {"id": f.id, "object": "file",
                                                            "deleted": True}
    assert client.get(f"/v1/files/{f.id}").status_code == 404 and not stored.exists()
    bad = client.post("/v1/files", data={"purpose": "fine-tune", "file": (io.BytesIO(b"x"), "a")},
                      content_type="multipart/form-data")
    assert bad.status_code == 400 and bad.get_json()["error"]["param"] == "purpose"


def test_an_upload_may_be_larger_than_a_request_body_up_to_the_batch_limit(client, app):
    """POST /v1/files alone takes bodies past TAILGUARD_MAX_BODY_BYTES (1 MiB), up to a batch
    file's limit; a larger file is a 413."""
    big = b'{"pad": "' + b"x" * (2 << 20) + b'"}\n'
    assert upload(client, big)["bytes"] == len(big)
    app.config[settings.BATCH_MAX_FILE_BYTES.env] = 1 << 20
    try:
        resp = client.post("/v1/files", data={"purpose": "batch", "file": (io.BytesIO(big), "a")},
                           content_type="multipart/form-data")
    finally:
        app.config[settings.BATCH_MAX_FILE_BYTES.env] = settings.BATCH_MAX_FILE_BYTES.default
    assert resp.status_code == 413 and resp.get_json()["error"]["code"] == "body_too_large"


def test_a_malformed_file_fails_at_validating_with_errors(client, app, model):
    data = chat_lines(model, 3) + b"not json\n" + chat_lines(model, 1)  # req-0 twice, too
    batch = create(client, upload(client, data)["id"])
    assert batch["status"] == "validating"
    feeder_of(app).tick()
    failed = Batch.model_validate(client.get(f"/v1/batches/{batch['id']}").get_json())
    assert failed.status == "failed" and failed.failed_at and failed.output_file_id is None
    codes = {(e.code, e.line) for e in failed.errors.data}
    assert codes == {("invalid_json_line", 4), ("duplicate_custom_id", 5)}


@pytest.mark.parametrize("field, value", [("endpoint", ["/v1/completions"]),
                                          ("completion_window", {"24h": True}),
                                          ("input_file_id", 7), ("metadata", ["a"])])
def test_a_create_body_of_the_wrong_types_is_a_400_naming_the_field(client, field, value):
    body = {"input_file_id": "file-x", "endpoint": "/v1/completions",
            "completion_window": "24h", field: value}
    resp = client.post("/v1/batches", json=body)
    assert resp.status_code == 400, resp.get_json()
    assert resp.get_json()["error"]["param"] == field


def test_a_batch_runs_every_line_once_and_writes_its_files(client, app, model, redis_client):
    n = 10
    batch = create(client, upload(client, chat_lines(model, n, bad={7}))["id"])
    feeder = feeder_of(app)
    feeder.tick()  # validating -> in_progress, the first lines queued
    assert client.get(f"/v1/batches/{batch['id']}").get_json()["status"] == "in_progress"
    assert len(feeder.store.pending(batch["id"])) == 4  # never more than in flight
    for index in feeder.store.pending(batch["id"]):
        job = redis_client.hgetall(keys.job_key(line_job_id(batch["id"], index)))
        assert job[b"lane"] == b"batch" and job[b"openai"] == b"chat"
    done = Batch.model_validate(drive(app, client, batch["id"], feeder))
    assert done.request_counts.total == n and done.request_counts.completed == n - 1
    assert done.request_counts.failed == 1 and done.completed_at and done.finalizing_at
    out = read_file(client, done.output_file_id)
    assert [x["custom_id"] for x in out] == [f"req-{i}" for i in range(n) if i != 7]
    assert all(x["response"]["status_code"] == 200 and x["error"] is None for x in out)
    assert out[0]["response"]["body"]["choices"][0]["message"]["content"] == "line 0"
    [err] = read_file(client, done.error_file_id)
    assert err["custom_id"] == "req-7" and err["response"]["status_code"] == 400
    assert err["response"]["body"]["error"]["type"] == "invalid_request_error"
    output_file = client.get(f"/v1/files/{done.output_file_id}").get_json()
    assert output_file["purpose"] == "batch_output" and output_file["expires_at"]
    assert not redis_client.sismember(keys.BATCHES_ACTIVE, batch["id"])
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'tailguard_batches_ended_total{status="completed"} 1.0' in metrics
    assert "tailguard_batch_lines_in_flight 0.0" in metrics
    stored = sum(client.get(f"/v1/files/{f}").get_json()["bytes"]
                 for f in (batch["input_file_id"], done.output_file_id, done.error_file_id))
    assert f"tailguard_batch_files_bytes {float(stored)}" in metrics


def test_a_new_feeder_resumes_a_batch_without_running_a_line_twice(client, app, model,
                                                                   redis_client):
    n = 8
    batch = create(client, upload(client, chat_lines(model, n))["id"])
    first = feeder_of(app, "dies")
    first.tick()
    first.tick()
    queued = set(first.store.pending(batch["id"]))
    # the first process dies after queuing, before recording its cursor: its lease lapses
    redis_client.hset(keys.batch_key(batch["id"]), "next", 0)
    redis_client.delete(keys.BATCH_FEEDER_LEASE)
    second = feeder_of(app, "takes-over")
    done = drive(app, client, batch["id"], second)
    assert done["status"] == "completed" and done["request_counts"]["completed"] == n
    out = read_file(client, done["output_file_id"])
    assert sorted(x["custom_id"] for x in out) == sorted(f"req-{i}" for i in range(n))
    # the lines queued before were found by their job ids, not queued again (create is only_new)
    assert queued and all(x["response"]["request_id"] == line_job_id(batch["id"], int(
        x["custom_id"].split("-")[1])) for x in out)


def test_a_feeder_that_stops_hands_its_lease_over_at_once(app, redis_client):
    first, second = feeder_of(app, "stops"), feeder_of(app, "replaces")
    assert first.tick() and not second.tick()
    first.close()  # as the API process stops: its lease would otherwise last 10 periods
    assert second.tick()
    first.close()  # a second close leaves the new holder's lease alone
    assert redis_client.get(keys.BATCH_FEEDER_LEASE) == b"replaces"


def test_a_line_whose_worker_was_lost_runs_again_under_a_new_job_id(client, app, model):
    """A job that ended without running to its end (worker_lost, expired in its queue) is the
    lane's trouble, not the line's: queued again as its next attempt, at most MAX_ATTEMPTS."""
    from tailguard.batches.feeder import MAX_ATTEMPTS

    batch = create(client, upload(client, chat_lines(model, 2))["id"])
    feeder = feeder_of(app)
    jobs = feeder.gateway.store
    feeder.tick()
    for attempt in range(MAX_ATTEMPTS):
        job_id = line_job_id(batch["id"], 0, attempt)
        assert jobs.start(job_id, "doomed").started
        jobs.transition(job_id, {RUNNING}, "failed", {"error": {"code": "worker_lost",
                                                                "message": "gone"}})
        feeder.tick()
    done = drive(app, client, batch["id"], feeder)
    [line0] = [x for x in read_file(client, done["error_file_id"])]
    assert line0["custom_id"] == "req-0" and line0["response"]["status_code"] == 500
    assert line0["response"]["request_id"] == line_job_id(batch["id"], 0, MAX_ATTEMPTS - 1)
    assert line0["response"]["body"]["error"]["code"] == "worker_lost"
    assert [x["custom_id"] for x in read_file(client, done["output_file_id"])] == ["req-1"]


def test_cancel_stops_queuing_and_ends_cancelled_with_partial_output(client, app, model):
    n = 12
    batch = create(client, upload(client, chat_lines(model, n))["id"])
    feeder = feeder_of(app)
    feeder.tick()
    in_flight = set(feeder.store.pending(batch["id"]))
    resp = client.post(f"/v1/batches/{batch['id']}/cancel")
    assert resp.status_code == 200 and resp.get_json()["status"] == "cancelling"
    done = drive(app, client, batch["id"], feeder, until=("cancelled",))
    assert done["cancelling_at"] and done["cancelled_at"]
    out = read_file(client, done["output_file_id"])
    assert {x["custom_id"] for x in out} == {f"req-{i}" for i in in_flight}
    errors = read_file(client, done["error_file_id"])
    assert len(out) + len(errors) == n
    assert {x["error"]["code"] for x in errors} == {"batch_cancelled"}
    assert client.post(f"/v1/batches/{batch['id']}/cancel").status_code == 200  # as it is


def test_past_its_window_a_batch_expires_with_what_finished(client, app, model, redis_client):
    n = 6
    batch = create(client, upload(client, chat_lines(model, n))["id"])
    feeder = feeder_of(app, in_flight=2)
    feeder.store.jobs = feeder.gateway.store
    feeder.tick()
    run_queued(feeder.store, batch["id"], {0, 1})
    feeder.tick()  # lines 0 and 1 collected, 2 and 3 queued
    redis_client.hset(keys.batch_key(batch["id"]), "expires_at", 1)
    done = drive(app, client, batch["id"], feeder, until=("expired",), run=lambda i: False)
    assert done["expired_at"] and done["request_counts"]["completed"] == 2
    assert len(read_file(client, done["output_file_id"])) == 2
    errors = read_file(client, done["error_file_id"])
    assert {x["error"]["code"] for x in errors} == {"batch_expired"} and len(errors) == n - 2
    assert redis_client.hget(keys.job_key(line_job_id(batch["id"], 2)), "status") == b"cancelled"


def test_the_cli_lists_shows_and_cancels_batches(client, app, model, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tailguard.cli import main

    monkeypatch.setenv(settings.BATCH_STORAGE.env, str(tmp_path / "files"))
    batch_id = create(client, upload(client, chat_lines(model, 2))["id"])["id"]
    runner = CliRunner()
    listed = runner.invoke(main, ["batches", "list"])
    assert listed.exit_code == 0 and f"{batch_id}  validating  0+0/0" in listed.output
    stats = runner.invoke(main, ["stats", "--json"])
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.output)["batches"]["running"] == {"validating": 1}
    assert "batches now: validating 1; lines in flight 0" in runner.invoke(main, ["stats"]).output
    shown = runner.invoke(main, ["batches", "show", batch_id])
    assert shown.exit_code == 0 and json.loads(shown.output)["id"] == batch_id
    assert runner.invoke(main, ["batches", "cancel", batch_id]).output.strip() == (
        f"batch {batch_id} cancelling")
    missing = runner.invoke(main, ["batches", "show", "batch_" + "0" * 32])
    assert missing.exit_code != 0 and "no batch" in missing.output


def test_batches_are_listed_with_openais_cursor(client, app, model):
    file_id = upload(client, chat_lines(model, 1))["id"]
    ids = [create(client, file_id)["id"] for _ in range(3)]
    first = client.get("/v1/batches?limit=2").get_json()
    assert first["has_more"] and [b["id"] for b in first["data"]] == ids[::-1][:2]
    rest = client.get(f"/v1/batches?limit=2&after={first['last_id']}").get_json()
    assert [b["id"] for b in rest["data"]] == ids[:1] and rest["has_more"] is False
    assert client.get("/v1/batches?limit=0").status_code == 400


def test_another_keys_files_and_batches_are_404s(keys_app, redis_client, tmp_path, model):
    keys_app.config[settings.BATCH_STORAGE.env] = str(tmp_path / "files")
    keys_app.extensions.pop(BATCHES_EXTENSION, None)
    store = ApiKeyStore(redis_client)
    a, b, ops = ({"Authorization": f"Bearer {store.add(ApiKey(name, admin=name == 'ops'))}"}
                 for name in ("a", "b", "ops"))
    client = keys_app.test_client()
    file_id = upload(client, chat_lines(model, 1), a)["id"]
    batch_id = create(client, file_id, a)["id"]
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content", f"/v1/batches/{batch_id}"):
        assert client.get(path, headers=b).status_code == 404, path
        assert client.get(path, headers=a).status_code == 200, path
        assert client.get(path, headers=ops).status_code == 200, path
    assert client.post(f"/v1/batches/{batch_id}/cancel", headers=b).status_code == 404
    assert client.delete(f"/v1/files/{file_id}", headers=b).status_code == 404
    resp = client.post("/v1/batches", json={"input_file_id": file_id, "completion_window": "24h",
                                            "endpoint": "/v1/chat/completions"}, headers=b)
    assert resp.status_code == 404 and resp.get_json()["error"]["type"] == "invalid_request_error"
    assert client.get("/v1/files", headers=b).get_json()["data"] == []
    assert client.get("/v1/batches", headers=b).get_json()["data"] == []
    assert [x["id"] for x in client.get("/v1/batches", headers=ops).get_json()["data"]] == [batch_id]
    keys_app.extensions.pop(BATCHES_EXTENSION, None)


def test_a_keys_stored_bytes_and_running_batches_are_bounded(keys_app, redis_client, tmp_path,
                                                             model):
    keys_app.config[settings.BATCH_STORAGE.env] = str(tmp_path / "files")
    keys_app.config[settings.BATCH_MAX_BYTES_PER_KEY.env] = 600
    keys_app.config[settings.BATCH_MAX_RUNNING_PER_KEY.env] = 1
    keys_app.extensions.pop(BATCHES_EXTENSION, None)
    try:
        store = ApiKeyStore(redis_client)
        a, b = ({"Authorization": f"Bearer {store.add(ApiKey(name))}"} for name in ("a", "b"))
        client = keys_app.test_client()
        data = chat_lines(model, 2)
        assert len(data) * 2 > 600 >= len(data)
        file_id = upload(client, data, a)["id"]
        over = client.post("/v1/files", data={"purpose": "batch", "file": (io.BytesIO(data), "x")},
                           content_type="multipart/form-data", headers=a)
        assert over.status_code == 429 and over.get_json()["error"]["code"] == "quota_exceeded"
        upload(client, data, b)  # another key's room is its own
        batch_id = create(client, file_id, a)["id"]
        again = client.post("/v1/batches", json={"input_file_id": file_id, "completion_window": "24h",
                                                 "endpoint": "/v1/chat/completions"}, headers=a)
        assert again.status_code == 429 and "Retry-After" in again.headers
        assert client.delete(f"/v1/files/{file_id}", headers=a).status_code == 409  # its input
        assert client.post(f"/v1/batches/{batch_id}/cancel", headers=a).status_code == 200
        feeder_of(keys_app).tick()  # nothing of it ran: it ends cancelled at once
        assert client.delete(f"/v1/files/{file_id}", headers=a).status_code == 200
        assert upload(client, data, a)["bytes"] == len(data)  # deleting gave the room back
    finally:
        for setting in (settings.BATCH_MAX_BYTES_PER_KEY, settings.BATCH_MAX_RUNNING_PER_KEY):
            keys_app.config[setting.env] = setting.default
        keys_app.extensions.pop(BATCHES_EXTENSION, None)


def test_a_keys_batch_lines_draw_on_a_tokens_bucket_of_their_own(keys_app, redis_client, tmp_path,
                                                                 model):
    """A batch of a key with a tokens/min charges its lines to the key's batch_tokens bucket:
    its interactive tokens bucket stays whole."""
    keys_app.config[settings.BATCH_STORAGE.env] = str(tmp_path / "files")
    keys_app.extensions.pop(BATCHES_EXTENSION, None)
    try:
        store = ApiKeyStore(redis_client)
        secret = store.add(ApiKey("a", tokens_per_min=100_000))
        key = store.lookup(secret)
        client = keys_app.test_client()
        headers = {"Authorization": f"Bearer {secret}"}
        batch = create(client, upload(client, chat_lines(model, 3), headers)["id"], headers)
        feeder = feeder_of(keys_app)
        feeder.tick()
        assert len(feeder.store.pending(batch["id"])) == 3
        buckets = redis_client.hgetall(keys.api_key_bucket_key(key.id))
        assert b"batch_tokens:level" in buckets and b"tokens:level" not in buckets
        job = redis_client.hgetall(keys.job_key(line_job_id(batch["id"], 0)))
        assert job[b"owner"] == key.id.encode() and job[b"api_key"] == b"a"
    finally:
        keys_app.extensions.pop(BATCHES_EXTENSION, None)


def test_the_input_file_of_a_batch_not_yet_ended_cannot_be_deleted(client, app, model):
    """OpenAI keeps the input of a running batch: its delete is a 409 (OpenAI's error shape)
    until the batch ended; then the file goes as any other."""
    batch = create(client, upload(client, chat_lines(model, 3))["id"])
    feeder = feeder_of(app)
    feeder.tick()
    resp = client.delete(f"/v1/files/{batch['input_file_id']}")
    assert resp.status_code == 409, resp.get_json()
    error = resp.get_json()["error"]
    assert error["type"] == "invalid_request_error" and batch["id"] in error["message"]
    assert client.get(f"/v1/files/{batch['input_file_id']}/content").status_code == 200
    drive(app, client, batch["id"], feeder)
    assert client.delete(f"/v1/files/{batch['input_file_id']}").status_code == 200


def test_lower_limits_after_a_restart_do_not_fail_a_batch_validated_under_the_old_ones(
        client, app, model):
    """The limits are checked once, at validating: a feeder started since with lower ones
    (reading the input again: nothing of it is cached) runs the batch to its end."""
    n = 6
    batch = create(client, upload(client, chat_lines(model, n))["id"])
    first = feeder_of(app, "before")
    first.tick()
    first.close()
    with app.app_context():
        service, _ = _batches(app)
        second = BatchFeeder(service.store, get_gateway(), lines_in_flight=4, period_s=0.1,
                             max_lines=2, max_file_bytes=64, owner="after")
    done = drive(app, client, batch["id"], second)
    assert done["status"] == "completed" and done["request_counts"]["completed"] == n


def test_a_batch_whose_input_vanished_mid_run_ends_failed_with_its_finished_lines_written(
        client, app, model, redis_client):
    """Contents lost under a running batch (a wiped disk, a changed file: the API refuses the
    delete): the feeder that reads its input again cannot queue or match more lines, and ends
    it failed, its finished lines in its output file, never dropped."""
    n = 6
    batch = create(client, upload(client, chat_lines(model, n))["id"])
    first = feeder_of(app, "before", in_flight=2)
    first.store.jobs = first.gateway.store
    first.tick()
    run_queued(first.store, batch["id"], {0, 1})
    first.tick()  # lines 0 and 1 collected, 2 and 3 queued
    first.close()
    first.store.contents.delete(batch["input_file_id"])
    done = drive(app, client, batch["id"], feeder_of(app, "after"), until=("failed",))
    assert done["errors"]["data"][0]["code"] == "invalid_file" and done["failed_at"]
    out = read_file(client, done["output_file_id"])
    assert [x["custom_id"] for x in out] == ["req-0", "req-1"]
    assert done["request_counts"]["completed"] == 2
    for index in (2, 3):  # queued, never to be matched to a line: cancelled
        job = redis_client.hget(keys.job_key(line_job_id(batch["id"], index)), "status")
        assert job == b"cancelled"
    assert not redis_client.sismember(keys.BATCHES_ACTIVE, batch["id"])


def test_one_keys_refused_lines_hold_back_its_batch_alone(keys_app, redis_client, tmp_path, model):
    """A key over its batch tokens per minute has its lines refused (429): that holds back its
    own batch, not another key's in the same feeder tick, whichever the tick reaches first."""
    keys_app.config[settings.BATCH_STORAGE.env] = str(tmp_path / "files")
    keys_app.extensions.pop(BATCHES_EXTENSION, None)
    try:
        store = ApiKeyStore(redis_client)
        secrets = {name: store.add(ApiKey(name, tokens_per_min=600)) for name in ("a", "b")}
        headers = {n: {"Authorization": f"Bearer {s}"} for n, s in secrets.items()}
        client = keys_app.test_client()
        batches = {n: create(client, upload(client, chat_lines(model, 12), headers[n])["id"],
                             headers[n])["id"] for n in ("a", "b")}
        feeder = feeder_of(keys_app, in_flight=2)
        feeder.store.jobs = feeder.gateway.store
        feeder.gateway.api_keys.take_tokens(store.lookup(secrets["a"]), 600, BATCH_TOKENS)
        for _ in range(4):  # each batch first in two of the ticks
            feeder.tick()
            assert feeder.store.pending(batches["a"]) == {}  # its bucket is empty
            assert len(feeder.store.pending(batches["b"])) == 2
            run_queued(feeder.store, batches["b"], set(range(12)))
    finally:
        keys_app.extensions.pop(BATCHES_EXTENSION, None)


def test_a_feeder_whose_lease_lapsed_during_a_long_parse_writes_nothing(client, app, model,
                                                                        monkeypatch):
    """A parse of a large input can outlast the feeder's lease: another process takes over
    meanwhile. The first one, its parse done, finds the lease gone and stops there: it
    collects, queues and counts nothing while the other one feeds."""
    n = 8
    batch = create(client, upload(client, chat_lines(model, n))["id"])
    before = feeder_of(app, "before", in_flight=2)
    before.tick()
    before.close()
    slow, other = feeder_of(app, "slow", in_flight=2), feeder_of(app, "other", in_flight=2)
    store = slow.store
    store.jobs = slow.gateway.store
    read = store.contents.get
    left = []

    def state():
        return (store.pending(batch["id"]), store.batch(batch["id"])["next"],
                store.counts(batch["id"]))

    def long_read(file_id):
        if not left:  # the lease lapses while this process parses; another one feeds
            left.append(None)  # (its own read of the input goes through)
            store.redis.delete(keys.BATCH_FEEDER_LEASE)
            for _ in range(2):
                assert other.tick()
                run_queued(store, batch["id"], set(range(n)))
            left[0] = state()
        return read(file_id)

    monkeypatch.setattr(store.contents, "get", long_read)
    slow.tick()
    assert left and left[0][2] == (2, 0)  # the other one collected the first two lines
    assert state() == left[0]  # the slow one collected and queued nothing after its parse
    assert store.redis.get(keys.BATCH_FEEDER_LEASE) == b"other"


class ChunksOnly(io.BytesIO):
    """An upload's stream that refuses to be read whole (as a large upload must never be)."""

    def read(self, size=-1):
        assert size is not None and 0 < size <= 1 << 20, f"read({size}): the whole upload"
        return super().read(size)


def test_an_upload_is_copied_in_chunks_and_a_keys_files_are_bounded_by_default(app, model):
    with app.app_context():
        service, _ = _batches(app)
    assert service.max_bytes_per_key == settings.BATCH_MAX_BYTES_PER_KEY.default > 0
    data = b'{"pad": "' + b"x" * (3 << 20) + b'"}\n'
    record = service.upload("big.jsonl", "batch", ChunksOnly(data), None)
    assert record["bytes"] == len(data)
    assert service.store.contents.get(record["id"]) == data
    assert service.store.stored_bytes(None) == len(data)


def test_a_line_finished_twice_is_in_one_file_once(app, redis_client):
    """Two collectors of one line (feeders a lease apart) that disagree, one seeing it
    succeed, the other refused: the first line written stands, in one file."""
    with app.app_context():
        service, _ = _batches(app)
    store, batch_id = service.store, "batch_" + "1" * 32
    store.queued(batch_id, 3, 0, 4)
    assert store.finish_line(batch_id, 3, '{"custom_id": "c", "ok": 1}', ok=True)
    assert not store.finish_line(batch_id, 3, '{"custom_id": "c", "ok": 0}', ok=False)
    assert store.finished_lines(batch_id, "output") == {3: '{"custom_id": "c", "ok": 1}'}
    assert store.finished_lines(batch_id, "errors") == {} and store.pending(batch_id) == {}
    assert store.counts(batch_id) == (1, 0)
