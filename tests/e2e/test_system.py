"""End to end through the native job API: results by id, lanes, batching, deadlines.
The session's workers come from tests/e2e_fixtures.py. A worker's warm shutdown is tested
where a worker of its own already runs: tests/faults/test_redis_faults.py (last) and
tests/multihost/test_netns.py.
"""

from __future__ import annotations

import pytest
from e2e_support import engine_stats, wait_job

pytestmark = pytest.mark.e2e


def run(api, workers, timeout=120, **body) -> dict:
    job = api.post("/v1/jobs", json=body)
    assert job.status_code == 202, job.get_json()
    return wait_job(api, job.get_json()["id"], workers.check, timeout)


def test_result_comes_back_by_id(api, workers, redis_client_noflush):
    done = run(api, workers, prompt="解释什么是Transformer", max_tokens=16, ignore_eos=True)
    assert done["status"] == "succeeded", done
    assert done["lane"] == "short" and done["worker"].startswith("short@")
    assert isinstance(done["result"]["text"], str) and done["result"]["text"]
    assert done["result"]["completion_tokens"] == 16
    assert done["result"]["finish_reason"] == "length"
    t = done["timing"]
    assert 0 <= t["queued_s"] <= t["ttft_s"] <= t["e2e_s"]
    assert 0 < t["engine_ttft_s"] <= t["ttft_s"]
    # the API's token count (tokenizer only) is what the engine saw
    record = redis_client_noflush.hgetall(f"tailguard:job:{done['id']}")
    assert int(record[b"engine_prompt_tokens"]) == done["prompt_tokens"]


def test_costly_request_runs_on_the_long_worker(api, workers):
    done = run(api, workers, prompt="word " * 200, max_tokens=8, ignore_eos=True)
    assert done["status"] == "succeeded", done
    assert done["lane"] == "long" and done["worker"].startswith("long@")
    assert done["result"]["completion_tokens"] == 8


def test_each_worker_consumes_only_its_own_lanes(workers):
    from tailguard.redis import keys
    from tasks import app

    inspect = app.control.inspect(timeout=5)
    active = inspect.active_queues()
    lanes = {"short": ["short"], "long": ["long", "batch"]}
    # each lane's queue just behind the worker's own one of that lane's jobs offered to it
    # (prefix affinity, on by default: docs/lanes.md)
    assert {node: [q["name"] for q in qs] for node, qs in active.items()} == {
        node: [q for lane in lanes[node.split("@")[0]] for q in (keys.worker_queue(lane, node), lane)]
        for node in active}
    exchanges = {q["name"]: q["exchange"]["name"] for qs in active.values() for q in qs
                 if q["name"] in ("short", "long", "batch")}
    assert exchanges == {"short": "short", "long": "long", "batch": "batch"}
    # concurrency = the lanes' max_num_seqs, whether given by `tailguard worker` (-c)
    # or derived by the worker itself from -Q (the plain `celery worker` entry point)
    pools = {node.split("@")[0]: s["pool"]["max-concurrency"] for node, s in inspect.stats().items()}
    assert pools == {"short": 4, "long": 4}


def test_concurrent_requests_are_batched_in_one_engine(api, workers):
    ids = [api.post("/v1/jobs", json={"prompt": f"请求 {i}", "max_tokens": 64, "ignore_eos": True})
           .get_json()["id"] for i in range(4)]
    done = [wait_job(api, i, workers.check) for i in ids]
    assert [d["status"] for d in done] == ["succeeded"] * 4
    assert {d["worker"].split("@")[0] for d in done} == {"short"}
    stats = engine_stats("short")
    # all four were inside the one engine at the same time: continuous batching is alive
    assert stats["peak_in_flight"] >= 3, stats
    assert stats["peak_decoding"] >= 2, stats  # and produced tokens side by side
    assert stats["in_flight"] == 0


def test_deadline_aborts_the_engine_request(api, workers):
    # batch.deadline_s is 1 s in tests/lanes.test.toml; 1,500 tokens take ~2 s on the tiny model
    done = run(api, workers, prompt="写一篇1000字的人工智能文章", max_tokens=1500, ignore_eos=True,
               priority="batch")
    assert done["lane"] == "batch" and done["status"] == "succeeded", done
    assert done["result"]["finish_reason"] == "deadline"
    assert 0 < done["result"]["completion_tokens"] < 1500
    stats = engine_stats("long")
    assert stats["engine_unfinished"] == 0 and stats["in_flight"] == 0, stats
    assert stats["aborted"] >= 1
