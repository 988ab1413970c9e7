"""One fleet, every lane: a real worker started as the card does it (`celery -A tasks worker
-Q short,long,batch`) on one engine takes every lane in order, each within its per-engine
limit (tests/lanes.fleet.test.toml: long and batch one at a time, short up to four), and
starts a job only once the prompts before it are prefilled (its prefill bound: one token).

What is checked is the order and the overlap of the jobs' own records (when each started
and ended, on Redis's clock), never how long anything took."""

import pytest
from conftest import ROOT
from fault_workers import START_TIMEOUT_S, Worker, api_with_reaper, own_database, wait_serving
from waiting import wait_for

from tailguard.jobs.store import TERMINAL, JobStore

pytestmark = pytest.mark.e2e

FLEET_LANES = ROOT / "tests" / "lanes.fleet.test.toml"
ENDED = ("succeeded_at", "failed_at", "expired_at", "cancelled_at")


@pytest.fixture(scope="module")
def db(redis_server):
    yield from own_database(redis_server, 6)


@pytest.fixture(scope="module")
def api(db, tiny_model):
    # the tiny model does hundreds of tokens a second per sequence: a prior near that, so the
    # long jobs queued behind long's limit of one are admitted
    yield from api_with_reaper(db[0], tiny_model, TAILGUARD_LANES=str(FLEET_LANES),
                               TAILGUARD_PRIOR_TOKENS_PER_S=300.0)


@pytest.fixture(scope="module")
def fleet_worker(db, api, tiny_model, tmp_path_factory):
    worker = Worker("engine", db[0], tiny_model, tmp_path_factory.mktemp("fleet-logs"),
                    queues="short,long,batch", core=1,
                    env={"TAILGUARD_LANES": str(FLEET_LANES)})
    try:
        wait_serving(api, worker, lane="short")
        yield worker
    finally:
        worker.stop()


def _submit(api, **body) -> str:
    resp = api.post("/v1/jobs", json={"prompt": "fleet", "ignore_eos": True, **body})
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()["id"]


def _records(db, ids: list[str]) -> dict[str, dict]:
    store = JobStore(db[1])
    wait_for(lambda: all(store.get(i)["status"] in TERMINAL for i in ids), START_TIMEOUT_S,
             "every job ended")
    return {i: store.get(i) for i in ids}


def _span(record: dict) -> tuple[float, float]:
    return record["running_at"], next(record[k] for k in ENDED if record.get(k) is not None)


def test_every_lane_on_one_engine_in_order_within_each_lanes_limit(api, db, fleet_worker):
    longs = [_submit(api, max_tokens=1500) for _ in range(3)]
    batch = _submit(api, max_tokens=200, priority="batch")
    # the first long job is running, the other two wait behind long's limit of one
    wait_for(lambda: JobStore(db[1]).get(longs[0])["status"] == "running", START_TIMEOUT_S)
    shorts = [_submit(api, max_tokens=16) for _ in range(3)]
    records = _records(db, [*longs, batch, *shorts])
    assert all(records[i]["status"] == "succeeded" for i in [*longs, batch, *shorts]), \
        {i: (r["status"], r.get("error")) for i, r in records.items()}
    assert all(r["worker"].startswith(f"{fleet_worker.name}@") for r in records.values())
    # long: one at a time on the engine, in arrival order
    spans = sorted(_span(records[i]) for i in longs)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])), spans
    assert [records[i]["running_at"] for i in longs] == sorted(records[i]["running_at"]
                                                               for i in longs)
    # short: each started while the first long job still ran (a slot was kept for it), not
    # behind the long jobs queued before it
    first_long_end = _span(records[longs[0]])[1]
    assert all(records[i]["running_at"] < first_long_end for i in shorts), (
        [records[i]["running_at"] for i in shorts], first_long_end)
    # batch: only once no long job waited (long's last one started before it)
    assert records[batch]["running_at"] >= max(records[i]["running_at"] for i in longs)


def test_a_job_starts_only_once_the_prompts_before_it_are_prefilled(api, db, fleet_worker):
    ids = [_submit(api, max_tokens=16) for _ in range(4)]
    records = _records(db, ids)
    assert all(r["status"] == "succeeded" for r in records.values()), records
    # a job's first token comes ttft_s after it started (the engine's clock starts later than
    # running_at); the next job starts only after that, though short has four slots
    spans = sorted((float(r["running_at"]), float(r["running_at"]) + float(r["ttft_s"]))
                   for r in records.values())
    assert all(first <= start for (_, first), (start, _) in zip(spans, spans[1:])), spans
