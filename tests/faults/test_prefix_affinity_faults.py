"""Prefix affinity survives faults (issue 44): kill -9 of the worker that served a prompt's
prefix sends its requests to the other worker, each within the offer's bounded wait.

Two real workers serve lane long (started at once, one per core, as test_worker_kill.py starts
its two), each with its vLLM engine on the tiny model, prefix affinity on for them and for the
API (in-process, its reaper and its offers' give-up thread running as in production):

* before the fault, a request with a long shared prefix is served by one worker, A (whichever
  takes it from the lane's queue); the index names A for its prefix, and the next request
  with that prefix is offered to A and taken by it;
* kill -9 of A's process group (its engine included, as benchmarks/soak_faults.py's
  worker_kill): while A's heartbeat has not lapsed yet, requests with the prefix are still
  offered to A; each offer lapses after TAILGUARD_PREFIX_AFFINITY_WAIT_S and moves to the
  lane's queue (given_up), and B serves the request: none stuck on A's own queue, none lost,
  none run twice;
* once A's heartbeat has lapsed (A absent from liveness), a request whose deepest prefix the
  index names A alone for is not offered to A at all: B serves it.

How long the offered requests took to start is printed as a `FAULT-FIGURE {...}` line (run
with -s), as fault_system.py's tests print theirs.
"""

from __future__ import annotations

import socket

import pytest
from fault_system import figure
from fault_workers import (
    START_TIMEOUT_S,
    Worker,
    api_with_reaper,
    finished_jobs,
    lane_workers,
    own_database,
)
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for

from tailguard import settings
from tailguard.jobs.store import SUCCEEDED, TERMINAL, JobStore
from tailguard.redis import keys

pytestmark = pytest.mark.faults

LANE = "long"
#: the offer's wait: long beside a submit's round trip, short beside the test
WAIT_S = 2.0
#: 64-token blocks: the prompts below have 4 (the shared prefix) and 6 (the prefix, then a
#: tail only worker A serves) full ones, every depth indexed (tailguard/lanes/affinity.py)
BLOCK_TOKENS = 64
#: the settings, as the API's config (typed) and as the workers' environment (text)
AFFINITY = {settings.PREFIX_AFFINITY.env: True, settings.PREFIX_AFFINITY_WAIT_S.env: WAIT_S,
            settings.PREFIX_BLOCK_TOKENS.env: BLOCK_TOKENS}
AFFINITY_ENV = {name: str(value) for name, value in AFFINITY.items()}
#: ~280 tokens of the tiny model's tokenizer: past the CPU engine's 128-token cache blocks, and
#: past lane short's max_cost (256), so every request here is lane long's
SHARED = " ".join(f"Clause {i}: the tenant keeps the lanes clear and the engine warm."
                  for i in range(9))
#: ~115 more: two more blocks that only A serves before it dies
TAIL = " ".join(f"Rider {i}: the landlord answers within the hour, or the tenant may leave."
                for i in range(4))
#: Redis's clock writes %.6f: the rounding of a start `WAIT_S` after the submit
CLOCK_EPSILON_S = 1e-5
JOB_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def db(redis_server):
    """A Redis database of this file's own."""
    yield from own_database(redis_server, 7)


@pytest.fixture(scope="module")
def api(db, tiny_model):
    yield from api_with_reaper(db[0], tiny_model, **AFFINITY)


@pytest.fixture(scope="module")
def two_workers(db, api, tiny_model, tmp_path_factory):
    """Two workers of lane long, by Celery node name; both serving. (Not `workers`: that is
    the e2e tier's session fixture, which an autouse check calls on.)"""
    logs = tmp_path_factory.mktemp("affinity-fault-logs")
    pair = {f"{name}@{socket.gethostname()}": Worker(name, db[0], tiny_model, logs, core=core,
                                                     env=AFFINITY_ENV)
            for core, name in enumerate(("affinity-a", "affinity-b"))}
    try:
        wait_for(lambda: lane_workers(api, LANE) == 2 or _exited(pair), START_TIMEOUT_S,
                 "both workers serving lane long")
        assert not _exited(pair), "\n".join(w.tail() for w in pair.values())
        yield pair
    finally:
        for worker in pair.values():
            worker.stop()


def _exited(pair: dict[str, Worker]) -> bool:
    return any(w.proc.poll() is not None for w in pair.values())


def submit(api, prompt: str) -> str:
    resp = api.post("/v1/jobs", json={"prompt": prompt, "max_tokens": 8})
    assert resp.status_code == 202, resp.get_json()
    assert resp.get_json()["lane"] == LANE, resp.get_json()
    return resp.get_json()["id"]


def finish(store: JobStore, ids: list[str]) -> dict[str, dict]:
    """Each job's record once all are terminal."""
    wait_for(lambda: all(store.status(j) in TERMINAL for j in ids), JOB_TIMEOUT_S,
             f"jobs {ids} terminal")
    return {j: store.get(j) for j in ids}


def holders(redis_client, prefix: str) -> set[str]:
    """The workers the index names for `prefix`."""
    return {w.decode() for w in redis_client.zrange(keys.prefix_holders_key(prefix), 0, -1)}


def prefixes(job: dict) -> list[str]:
    return str(job.get("prefixes") or "").split()


def offers(api) -> dict[str, float]:
    """tailguard_prefix_offers_total by outcome, as the API exports it."""
    text = api.get("/metrics").data.decode()
    return {s.labels["outcome"]: s.value for family in text_string_to_metric_families(text)
            if family.name == "tailguard_prefix_offers" for s in family.samples}


def test_kill_9_of_the_preferred_worker(db, api, two_workers):
    _url, redis_client = db
    store = JobStore(redis_client)

    # before the fault: A serves the prefix, and the next request with it is offered to A
    id0 = submit(api, SHARED + " Question 0.")
    job0 = finish(store, [id0])[id0]
    assert job0["status"] == SUCCEEDED, job0
    a = job0["worker"]
    (b,) = set(two_workers) - {a}
    assert prefixes(job0) and all(holders(redis_client, p) == {a} for p in prefixes(job0))
    id1 = submit(api, SHARED + " " + TAIL + " Question 1.")
    job1 = finish(store, [id1])[id1]
    assert (job1["status"], job1.get("offered_to"), job1["worker"]) == (SUCCEEDED, a, a), job1
    assert offers(api) == {"made": 1, "taken": 1, "given_up": 0}
    tail_only = [p for p in prefixes(job1) if p not in prefixes(job0)]
    assert tail_only and all(holders(redis_client, p) == {a} for p in tail_only)

    two_workers[a].stop()  # kill -9 of its process group: the worker and its engine

    # A's heartbeat has not lapsed yet (3 periods): the first request at least is offered to
    # it; each such offer lapses and moves to the lane's queue, where B takes it
    ids = [submit(api, SHARED + f" Question {i}.") for i in (2, 3, 4)]
    after = finish(store, ids)
    assert [after[j]["status"] for j in ids] == [SUCCEEDED] * 3, after
    assert [after[j]["worker"] for j in ids] == [b] * 3, after
    to_a = [j for j in ids if after[j].get("offered_to") == a]
    assert to_a[:1] == ids[:1], after
    # none started before its offer lapsed: B took it from the lane's queue, not A's
    assert all(after[j]["running_at"] - after[j]["submitted_at"] >= WAIT_S - CLOCK_EPSILON_S
               for j in to_a), after
    # each offer ended once, and none of the dead worker's as taken
    counts = offers(api)
    assert counts["made"] == 1 + sum(1 for j in ids if after[j].get("offered_to")), counts
    assert counts["made"] == counts["taken"] + counts["given_up"], counts
    assert counts["given_up"] >= len(to_a), counts
    figure(fault="prefix_affinity_worker_kill", wait_s=WAIT_S, offered_to_dead=len(to_a),
           started_after_s=[round(after[j]["running_at"] - after[j]["submitted_at"], 3)
                            for j in ids], offers=counts)

    # A absent from liveness: the index still names it alone for the tail, but a request
    # with the tail is offered to B, the live holder of the shared prefix under it
    wait_for(lambda: lane_workers(api, LANE) == 1, 30, "A's heartbeat lapsed")
    assert all(holders(redis_client, p) == {a} for p in tail_only)
    id5 = submit(api, SHARED + " " + TAIL + " Question 5.")
    job5 = finish(store, [id5])[id5]
    assert set(tail_only) <= set(prefixes(job5)), job5
    assert (job5["status"], job5.get("offered_to"), job5["worker"]) == (SUCCEEDED, b, b), job5

    # nothing left on the dead worker's queue or among the offers; each job ended once
    assert redis_client.llen(keys.worker_queue(LANE, a)) == 0
    assert redis_client.zcard(keys.OFFERS) == 0
    assert redis_client.hget(keys.OFFERED, a) is None
    assert sorted(finished_jobs(redis_client)) == sorted([id0, id1, *ids, id5])
