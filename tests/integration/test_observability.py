"""Metrics, the request log and `tailguard stats` against a real Redis: jobs are ended
by the real state machine (as workers and the API end them) and picked up by the real
finished-stream consumer."""

import json
import logging
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from tailguard.jobs.finished import GROUP, FinishedConsumer, FinishedRequest
from tailguard.jobs.liveness import Liveness
from tailguard.jobs.store import QUEUED, RUNNING, SUCCEEDED, JobStore
from tailguard.observe.stats import StatsStore
from tailguard.redis import keys

pytestmark = pytest.mark.integration


def submit(client, **body):
    resp = client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 8, **body})
    assert resp.status_code == 202
    return resp.get_json()["id"]


def succeed(redis_client, job_id, tokens=8, ttft=0.01):
    store = JobStore(redis_client)
    assert store.transition(job_id, {QUEUED}, RUNNING, {"worker": "short@test"})[0]
    time.sleep(0.05)  # the "engine" takes a moment, so timings are ordered as in real life
    assert store.transition(job_id, {RUNNING}, SUCCEEDED, {
        "result": {"text": "x" * tokens, "completion_tokens": tokens, "finish_reason": "length"},
        "completion_tokens": tokens, "ttft_s": f"{ttft:.6f}"})[0]


def sample(text: str, name: str, **labels) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture
def gateway(api_app, client):
    from app.gateway_ext import get_gateway

    with api_app.app_context():
        return get_gateway()


@pytest.fixture
def request_log(caplog):
    logger = logging.getLogger("tailguard.requests")  # does not propagate: attach directly
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="tailguard.requests")
    yield caplog
    logger.removeHandler(caplog.handler)


def request_lines(request_log) -> list[dict]:
    """The request log's lines (caplog's handler also sees other loggers' warnings)."""
    return [json.loads(r.getMessage()) for r in request_log.records if r.name == "tailguard.requests"]


def test_lane_backlog_tokens_are_the_queued_jobs_costs(client, redis_client):
    """The series workers scale by (deploy/kubernetes/base/scaling.yaml): queued cost tokens."""
    jobs = [client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": n}).get_json()
            for n in (8, 16, 100000)]  # the last is capped to, and queued on, the long lane
    text = client.get("/metrics").data.decode()
    for lane in ("short", "long", "batch"):
        assert sample(text, "tailguard_lane_backlog_tokens", lane=lane) == sum(
            j["cost"] for j in jobs if j["lane"] == lane)
    assert {j["lane"] for j in jobs} == {"short", "long"}
    client.delete(f"/v1/jobs/{jobs[0]['id']}")  # no longer queued: out of the backlog
    text = client.get("/metrics").data.decode()
    assert sample(text, "tailguard_lane_backlog_tokens", lane="short") == jobs[1]["cost"]


def test_the_scaling_queries_read_series_the_api_exports(client, redis_client):
    """Every metric a KEDA trigger of deploy/kubernetes/ reads is on the API's /metrics, with a
    sample for each lane it names (a misspelt name would scale nothing, silently)."""
    import re

    import yaml

    text = client.get("/metrics").data.decode()
    docs = yaml.safe_load_all((ROOT / "deploy/kubernetes/base/scaling.yaml").read_text())
    queries = [t["metadata"]["query"] for d in docs if d and d["kind"] == "ScaledObject"
               for t in d["spec"]["triggers"]]
    assert queries
    for query in queries:
        names = set(re.findall(r"\btailguard_[a-z_]+", query))
        lanes = re.search(r'lane\s*=~?\s*"([^"]+)"', query).group(1).split("|")
        assert names, query
        for name in names:
            for lane in lanes:
                assert sample(text, name, lane=lane) is not None, (name, lane)


def test_metrics_move_as_requests_finish(client, redis_client, gateway):
    # the app (and its registry) lives for the whole session: compare against a snapshot
    before = client.get("/metrics").data.decode()

    def moved(name, **labels):
        now = client.get("/metrics").data.decode()
        return (sample(now, name, **labels) or 0) - (sample(before, name, **labels) or 0)

    assert sample(before, "tailguard_requests_accepted_total", lane="short") is not None
    done, waiting = submit(client), submit(client, max_tokens=100000)  # the second is capped
    text = client.get("/metrics").data.decode()
    assert sample(text, "tailguard_queue_depth", lane="short") == 1
    assert sample(text, "tailguard_queue_depth", lane="long") == 1
    assert moved("tailguard_requests_accepted_total", lane="short") == 1
    assert moved("tailguard_requests_capped_total", lane="long") == 1
    succeed(redis_client, done)
    client.delete(f"/v1/jobs/{waiting}")
    assert gateway.finished.run_once() == 2
    assert moved("tailguard_requests_total", lane="short", status="succeeded") == 1
    assert moved("tailguard_requests_total", lane="long", status="cancelled") == 1
    assert moved("tailguard_e2e_request_latency_seconds_count", lane="short") == 1
    assert moved("tailguard_time_to_first_token_seconds_count", lane="short") == 1
    assert moved("tailguard_request_generation_tokens_sum", lane="short") == 8
    assert moved("tailguard_request_prompt_tokens_sum", lane="short") == 3  # BOS h i
    assert gateway.finished.run_once() == 0  # each finished request is counted once
    assert moved("tailguard_requests_total", lane="short", status="succeeded") == 1


def test_rejections_are_counted_by_code(client, gateway):
    client.post("/v1/jobs", json={"prompt": 5})
    client.post("/v1/jobs", json={"prompt": "word " * 3000})
    text = client.get("/metrics").data.decode()
    assert sample(text, "tailguard_requests_rejected_total", code="invalid_field") >= 1
    assert sample(text, "tailguard_requests_rejected_total", code="prompt_too_long") >= 1


def test_request_log_has_one_line_per_finished_request(client, redis_client, gateway, request_log):
    job_id = submit(client, max_tokens=100000)
    succeed(redis_client, job_id, tokens=5, ttft=0.01)
    gateway.finished.run_once()
    [line] = request_lines(request_log)
    assert set(line) == {"event", "id", "lane", "priority", "status", "prompt_tokens",
                         "requested_max_tokens", "max_tokens", "max_tokens_capped",
                         "completion_tokens", "finish_reason", "queued_s", "ttft_s", "e2e_s",
                         "engine_s", "tpot_s", "worker", "error", "finished_at", "api_key"}
    assert line["api_key"] is None  # no key exists: authentication is off
    assert (line["id"], line["lane"], line["status"], line["worker"]) == \
        (job_id, "long", "succeeded", "short@test")
    assert (line["requested_max_tokens"], line["max_tokens"], line["max_tokens_capped"]) == \
        (100000, 1500, True)
    assert (line["prompt_tokens"], line["completion_tokens"], line["finish_reason"]) == (3, 5, "length")
    assert 0 <= line["queued_s"] <= line["ttft_s"] <= line["e2e_s"]
    assert line["ttft_s"] == pytest.approx(line["queued_s"] + 0.01, abs=1e-5)


def test_expired_requests_are_logged_too(client, gateway, request_log):
    job_id = submit(client, priority="batch")
    assert client.get(f"/v1/jobs/{job_id}?wait=15").get_json()["status"] == "expired"
    gateway.finished.run_once()
    [line] = request_lines(request_log)
    assert (line["status"], line["error"], line["queued_s"]) == ("expired", "expired", None)


def test_two_consumers_split_the_work_never_double_count(redis_client, client):
    ids = [submit(client) for _ in range(6)]
    for job_id in ids:
        succeed(redis_client, job_id)
    seen_a, seen_b = [], []
    a = FinishedConsumer(redis_client, [lambda r: seen_a.append(r.id)], consumer="a")
    b = FinishedConsumer(redis_client, [lambda r: seen_b.append(r.id)], consumer="b")
    a.run_once(count=3)
    b.run_once(count=10)
    assert sorted(seen_a + seen_b) == sorted(ids) and not set(seen_a) & set(seen_b)


def test_entries_pending_on_a_dead_consumer_are_claimed(redis_client, client):
    """An API process that read finished entries and died before acking them: another
    process takes them over once they are idle, and counts each once."""
    ids = [submit(client) for _ in range(3)]
    for job_id in ids:
        succeed(redis_client, job_id)
    dead = FinishedConsumer(redis_client, [], consumer="dead")
    dead._ensure_group()
    redis_client.xreadgroup(GROUP, "dead", {keys.FINISHED_STREAM: ">"}, count=10)  # never acked
    seen = []
    alive = FinishedConsumer(redis_client, [lambda r: seen.append(r.id)], consumer="alive",
                             claim_idle_ms=200)
    assert alive.run_once() == 0  # not idle long enough yet: the owner may still be working
    time.sleep(0.3)
    assert alive.run_once() == 3 and sorted(seen) == sorted(ids)
    assert alive.run_once() == 0
    assert redis_client.xpending(keys.FINISHED_STREAM, GROUP)["pending"] == 0


def test_entries_older_than_the_records_are_trimmed(redis_client):
    """The consumer trims what names records gone (older than keep_s), not what is newer."""
    now_ms = int(redis_client.time()[0]) * 1000
    old = [redis_client.xadd(keys.FINISHED_STREAM, {"key": keys.job_key(f"{i:032x}")},
                             id=f"{now_ms - 600_000 + i}-0") for i in range(300)]
    new = redis_client.xadd(keys.FINISHED_STREAM, {"key": keys.job_key(f"{999:032x}")})
    consumer = FinishedConsumer(redis_client, [], consumer="trimmer", keep_s=60)
    consumer.run_once()
    left = [entry_id for entry_id, _ in redis_client.xrange(keys.FINISHED_STREAM)]
    assert new in left and len(left) < len(old)  # approximate: whole nodes of old entries go
    FinishedConsumer(redis_client, [], consumer="keeper").run_once()
    assert redis_client.xlen(keys.FINISHED_STREAM) == len(left)  # no keep_s: nothing trimmed


def record(i, lane, e2e, queued=0.0, prompt=10, out=20, status="succeeded", at=1_800_000_000.0,
           api_key=None):
    return FinishedRequest(
        id=f"{i:032x}", lane=lane, priority="interactive", status=status, prompt_tokens=prompt,
        requested_max_tokens=out, max_tokens=out, max_tokens_capped=False, completion_tokens=out,
        finish_reason="length", queued_s=queued, ttft_s=queued + 0.01, e2e_s=e2e,
        engine_s=e2e - queued, tpot_s=0.01, worker="w", error=None, finished_at=at,
        api_key=api_key)


def test_stats_by_key_split_each_lanes_service_and_count_refusals(redis_client, redis_server):
    now = float(redis_client.time()[0])
    stats = StatsStore(redis_client)
    # the flood: 30 short requests of 20 tokens; the quiet key: 10 short and 2 long of 500
    for i in range(30):
        stats.record(record(i, "short", e2e=1.0, at=now, api_key="flood"))
    for i in range(10):
        stats.record(record(100 + i, "short", e2e=0.2, at=now, api_key="quiet"))
    for i in range(2):
        stats.record(record(200 + i, "long", e2e=9.0, out=500, at=now, api_key="quiet"))
    stats.record(record(300, "short", e2e=0.1, at=now))  # open mode: no key, lanes only
    for _ in range(3):
        stats.record_refused("short", "over_fair_share", now, key="flood")
    stats.record_refused(None, "rate_limited", now, key="flood")  # the key's own limit
    by_key = stats.keys_window(now - 60, now)
    lanes = stats.window(["short", "long"], now - 60, now).lanes
    assert list(by_key) == ["flood", "quiet"]
    flood, quiet = by_key["flood"], by_key["quiet"]
    assert (flood.count, quiet.count) == (30, 12)
    assert flood.refused == {"over_fair_share": 3, "rate_limited": 1} and quiet.refused == {}
    assert lanes["short"].refused == {"over_fair_share": 3}  # a key's own limit is not the lane's
    assert flood.served == {"short": 600} and quiet.served == {"short": 200, "long": 1000}
    assert flood.shares(lanes) == {"short": pytest.approx(600 / 820)}  # 820: the open one's too
    assert quiet.shares(lanes) == {"short": pytest.approx(200 / 820), "long": 1.0}
    assert quiet.metrics["e2e_s"].percentile(50) == pytest.approx(0.2, rel=0.05)
    env = {**os.environ, "TAILGUARD_REDIS_URL": redis_server}
    run = lambda *a: subprocess.run([sys.executable, "-m", "tailguard.cli", "stats", *a], cwd=ROOT,
                                    env=env, capture_output=True, text=True, check=True).stdout
    out = json.loads(run("--by", "key", "--json"))["keys"]
    assert out["flood"]["refused"] == {"over_fair_share": 3, "rate_limited": 1}
    assert out["quiet"]["share_of_lane"]["long"] == 1.0
    text = run("--by", "key")
    assert "2 keys, 42 finished requests" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("flood"))
    assert "over_fair_share 3, rate_limited 1" in line and "short 73%" in line


def test_stats_math_against_known_data(redis_client):
    stats = StatsStore(redis_client)
    # short: e2e 0.1 .. 1.0 s (100 requests), spread over two minutes; long: 3 slow ones
    for i in range(100):
        stats.record(record(i, "short", e2e=0.01 * (i + 1), at=1_800_000_000.0 + (i % 2) * 60))
    for i, e2e in enumerate((5.0, 7.0, 9.0)):
        stats.record(record(1000 + i, "long", e2e=e2e, queued=e2e * 0.8, prompt=1900, out=512))
    stats.record(record(2000, "short", e2e=0.5, status="expired"))
    w = stats.window(["short", "long", "batch"], 1_800_000_000.0 - 60, 1_800_000_000.0 + 61, top=3)
    short = w.lanes["short"]
    assert short.count == 101 and short.statuses == {"succeeded": 100, "expired": 1}
    e2e = short.metrics["e2e_s"].summary()
    assert e2e["count"] == 101 and e2e["max"] == pytest.approx(1.0)
    assert e2e["avg"] == pytest.approx((sum(0.01 * (i + 1) for i in range(100)) + 0.5) / 101)
    assert e2e["p50"] == pytest.approx(0.5, rel=0.05)
    assert e2e["p99"] == pytest.approx(0.99, rel=0.05)
    assert w.lanes["batch"].count == 0
    assert [s["e2e_s"] for s in w.slowest] == [9.0, 7.0, 5.0]
    apart = w.what_sets_slowest_apart()
    assert apart["prompt_tokens_mean"]["slowest"] == 1900
    assert apart["lanes"]["slowest"] == {"long": 3}
    assert apart["queue_share_of_latency"]["slowest"] == pytest.approx(0.8)


def test_stats_command_prints_the_table_and_json(redis_client, redis_server):
    now_s, _ = redis_client.time()
    stats = StatsStore(redis_client)
    for i in range(20):
        stats.record(record(i, "short", e2e=0.05 * (i + 1), at=float(now_s)))
    Liveness(redis_client).heartbeat(["short"], "short@gpu-a", ttl_s=60)
    env = {**os.environ, "TAILGUARD_REDIS_URL": redis_server}
    run = lambda *a: subprocess.run([sys.executable, "-m", "tailguard.cli", "stats", *a], cwd=ROOT,
                                    env=env, capture_output=True, text=True, check=True).stdout
    out = json.loads(run("--window", "5m", "--json"))
    assert out["lanes"]["short"]["count"] == 20
    assert out["lanes"]["short"]["e2e_s"]["max"] == pytest.approx(1.0)
    assert len(out["slowest"]) == 10
    assert out["workers_per_host"] == {"short": {"gpu-a": 1}, "long": {}, "batch": {}}
    text = run("--window", "5m")
    assert "short" in text and "slowest 10" in text and "what sets the slowest apart" in text
    assert "live workers now, per host: short gpu-a 1; long none; batch none" in text
