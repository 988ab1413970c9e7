"""Fair order by key on a real Redis: the Lua steps that hold a fair lane's messages per key and
release them onto its Celery list in virtual-token-counter order (tailguard/redis/lua/
fair_release.lua), driven here by the same store calls a worker makes (start, then an end), so
every release is the one a real worker's transition triggers. The system with real workers and
engines: tests/e2e/test_fair_share_e2e.py."""

from __future__ import annotations

import json

import pytest

from tailguard.jobs.store import QUEUED, RUNNING, SUCCEEDED, FairHold, JobStore
from tailguard.lanes.admission import BacklogLimits
from tailguard.redis import keys

pytestmark = pytest.mark.integration

LANE, QUEUE, SLOTS, COST = "short", "short", 4, 100


@pytest.fixture
def store(redis_client):
    return JobStore(redis_client)


def submit(store: JobStore, key: str, n: int, weight: float = 1.0, cost: int = COST,
           limits: BacklogLimits | None = None) -> list[str]:
    ids = []
    for _ in range(n):
        job_id = __import__("uuid").uuid4().hex
        message = json.dumps({"headers": {"id": job_id}, "key": key})
        store.create(job_id, {"lane": LANE, "cost": cost, "api_key": key}, queue_ttl_s=60,
                     limits=limits or BacklogLimits(slots=SLOTS), message=(QUEUE, message),
                     fair=FairHold(key, weight))
        ids.append(job_id)
    return ids


def take(store: JobStore) -> tuple[str, str] | None:
    """A worker's next message (the list's far end, as BRPOP takes it): (job id, key)."""
    raw = store.redis.rpop(QUEUE)
    if raw is None:
        return None
    message = json.loads(raw)
    return message["headers"]["id"], message["key"]


def serve(store: JobStore, n: int) -> list[str]:
    """Run `n` jobs one at a time as a worker does (start, then succeed): the keys served."""
    served = []
    for _ in range(n):
        job_id, key = take(store)
        assert store.start(job_id, "w1@host").started
        assert store.transition(job_id, {RUNNING}, SUCCEEDED, {})[0]
        served.append(key)
    return served


def test_a_key_alone_gets_the_whole_lane_and_the_list_stays_as_deep_as_the_free_slots(store):
    ids = submit(store, "flood", 10)
    assert store.redis.llen(QUEUE) == SLOTS
    assert len(store.held_jobs(LANE)) == 10 - SLOTS
    assert serve(store, 10) == ["flood"] * 10  # work-conserving: nothing idles while it has work
    assert store.redis.llen(QUEUE) == 0 and store.held_jobs(LANE) == []
    assert all(store.get(i)["status"] == SUCCEEDED for i in ids)


def test_a_quiet_key_is_served_at_the_next_free_slot_not_behind_the_flood(store):
    submit(store, "flood", 40)
    serve(store, 6)
    quiet = submit(store, "quiet", 2)
    assert set(quiet) <= set(store.held_jobs(LANE))  # the list is full: it waits for a slot
    # The 4 in the list are the flood's, released before the quiet key came; then the two keys
    # alternate (the quiet one lifted level with the flood's counter; ties go by name), so the
    # quiet key's two wait behind two of the flood's 30 held jobs, not behind all of them.
    order = serve(store, 10)
    assert order[:SLOTS] == ["flood"] * SLOTS
    assert order[SLOTS:SLOTS + 4] == ["flood", "quiet", "flood", "quiet"], order


def test_weights_two_to_one_give_two_to_one_service_while_both_are_backlogged(store):
    submit(store, "heavy", 60, weight=2.0)
    submit(store, "light", 60, weight=1.0)
    order = serve(store, 60)[SLOTS:]  # past what was released before both were held
    assert abs(order.count("heavy") - 2 * order.count("light")) <= 2, order


def test_a_cancelled_held_job_is_dropped_at_release_and_never_reaches_the_queue(store):
    ids = submit(store, "flood", SLOTS + 2)
    assert store.transition(ids[-1], {QUEUED}, "cancelled", {})[0]
    served = [take(store)[0] for _ in range(SLOTS)]
    assert store.release_held(LANE) == 1  # the backstop release (no transition freed a slot)
    assert take(store)[0] == ids[-2] and take(store) is None
    assert ids[-1] not in served and store.held_jobs(LANE) == []


def test_a_returning_key_is_lifted_to_the_least_backlogged_counter_not_left_below_it(store):
    submit(store, "early", 1)
    serve(store, 1)  # early's counter is 100, then it goes quiet
    submit(store, "flood", 30)
    serve(store, 20)
    submit(store, "early", 10)
    counters = {k.decode(): float(v) for k, v in
                store.redis.hgetall(keys.lane_counters_key(LANE)).items()}
    # early did not keep its old, low counter to starve the flood with: it starts level with it
    assert counters["early"] >= counters["flood"] - COST


def test_past_the_lane_limits_a_key_within_its_share_is_admitted_and_one_over_it_refused(store):
    from tailguard.jobs.store import BacklogMoved

    limits = BacklogLimits(slots=SLOTS, after=2000)  # the lane holds 2,000 cost tokens
    submit(store, "flood", 20, limits=limits)  # the bound: 20 x 100
    with pytest.raises(BacklogMoved):
        submit(store, "flood", 1, limits=limits)  # alone: arrival order's refusal
    submit(store, "quiet", 5, limits=limits)  # within half of 2,000 while the flood holds more
    with pytest.raises(BacklogMoved):
        submit(store, "flood", 1, limits=limits)  # over its share: refused


@pytest.fixture(scope="module")
def fair_app(tiny_model, redis_server, tmp_path_factory):
    """Keys mode, no worker: short promises 10 s at 40 tokens/s (4 slots x 10), so it holds
    about 400 cost tokens of waiting work; what is accepted stays queued."""
    from conftest import TEST_LANES
    from test_admission_on_redis import make_app

    from tailguard import settings

    path = tmp_path_factory.mktemp("fair-lanes") / "lanes.toml"
    path.write_text(TEST_LANES.read_text().replace("dedicated = true",
                                                   "dedicated = true\nmax_wait_s = 10", 1))
    return make_app(tiny_model, redis_server, path, TAILGUARD_ADMIT_WITHOUT_WORKER=True,
                    **{settings.API_AUTH.env: settings.AUTH_KEYS})


def test_a_full_lane_refuses_the_key_over_its_share_and_admits_the_one_within_it(
        fair_app, redis_client):
    from tailguard.gateway.api_keys import ApiKey, ApiKeyStore

    secrets = {name: ApiKeyStore(redis_client).add(ApiKey(name)) for name in ("flood", "quiet")}
    api = fair_app.test_client()

    def post(name):
        return api.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 60},
                        headers={"Authorization": f"Bearer {secrets[name]}"})

    flood = 0
    while (resp := post("flood")).status_code == 202:
        flood += 1
        assert flood < 40, "the lane never filled"
    # alone, the flood is refused as arrival order refuses it
    assert resp.status_code == 429 and resp.get_json()["error"]["code"] == "wait_too_long"
    # the quiet key is admitted past the lane's limit: it holds nothing, under half of it
    quiet = post("quiet")
    assert quiet.status_code == 202, quiet.get_json()
    assert quiet.get_json()["estimated_start_s"] <= 10  # its wait in fair order keeps the promise
    again = post("flood")
    assert again.status_code == 429, again.get_json()
    assert again.get_json()["error"]["code"] == "over_fair_share"
    assert int(again.headers["Retry-After"]) >= 1
    assert "holds more than its share" in again.get_json()["error"]["message"]
    held = JobStore(redis_client).held_work("short").tokens
    assert set(held) == {"flood", "quiet"} and held["flood"] > held["quiet"] > 0


def test_held_jobs_are_not_lost_messages_and_the_redelivery_pass_releases_them(store):
    """The redelivery pass compares a lane's queued jobs with the messages it finds: a held job's
    message is in its key's list, so it is never failed as message_lost; and the pass releases
    what fits, the backstop for a slot freed without a transition (a message taken off the list
    and skipped)."""
    from tailguard.jobs.redeliver import Redeliverer
    from tailguard.lanes.table import load_lanes
    from tailguard.observe.metrics import queue_depth
    from tasks import app

    ids = submit(store, "flood", SLOTS + 3)
    assert queue_depth(store.redis, QUEUE, LANE) == SLOTS + 3  # listed and held alike
    passes = Redeliverer(store, app.connection_for_write, after_s=0,
                         lanes=[lane for lane in load_lanes().lanes if lane.name == LANE],
                         confirm_s=0)
    passes.run_once()
    passes.run_once()  # two passes: what they found nowhere twice would fail now
    assert all(store.status(i) == QUEUED for i in ids)
    store.redis.rpop(QUEUE)  # taken and skipped: no transition frees its place
    passes.run_once()
    assert store.redis.llen(QUEUE) == SLOTS and store.held_count(LANE) == 2
    passes.close()


def test_what_a_key_runs_counts_toward_its_share_when_no_work_is_held(store):
    """A lane whose promise is shorter than a slot's turnover holds no queue: the flood's jobs
    all run. The quiet key is still admitted past the lane's limits (its share counts the
    flood's running work); the flood's next one is refused. The running tokens follow the jobs'
    states in the same Redis steps."""
    from tailguard.jobs.store import BacklogMoved

    limits = BacklogLimits(slots=SLOTS, wait_tokens=50)  # the promise: 50 tokens of waiting work
    # the worker serves the lane (a live member of its workers), so its jobs take its slots
    now = store.redis.time()[0]
    store.redis.zadd(keys.lane_workers_key(LANE), {"w1@host": now + 60})
    flood = submit(store, "flood", SLOTS, limits=limits)  # each has a free slot
    for job_id, _ in [take(store) for _ in range(SLOTS)]:
        assert store.start(job_id, "w1@host").started
    assert store.held_work(LANE).running == {"flood": SLOTS * COST}
    with pytest.raises(BacklogMoved):
        submit(store, "flood", 1, limits=limits)  # alone, and no slot: arrival order's refusal
    quiet = submit(store, "quiet", 1, limits=limits)  # 100 of its half of 450
    with pytest.raises(BacklogMoved):
        submit(store, "flood", 1, limits=limits)  # 500 of 225
    assert store.transition(flood[0], {RUNNING}, SUCCEEDED, {})[0]
    assert store.held_work(LANE).running == {"flood": (SLOTS - 1) * COST}
    assert take(store) == (quiet[0], "quiet")  # released at the freed slot


def test_a_job_that_ends_after_its_lanes_fair_hash_lapsed_leaves_the_running_tokens(store):
    """The fair hash lapses `queue_ttl_s + 60` after the last job was held; a job that started
    before and ends after (a lull in arrivals, a long job) is still taken out of what its key
    runs: the job itself says it was counted, so the count returns to zero."""
    now = store.redis.time()[0]
    store.redis.zadd(keys.lane_workers_key(LANE), {"w1@host": now + 60})
    [job_id] = submit(store, "flood", 1)
    assert take(store) == (job_id, "flood")
    assert store.start(job_id, "w1@host").started
    assert store.held_work(LANE).running == {"flood": COST}
    store.redis.delete(keys.lane_fair_key(LANE))  # the lull: its TTL passed
    assert store.transition(job_id, {RUNNING}, SUCCEEDED, {})[0]
    assert store.held_work(LANE).running == {}
    assert not store.redis.exists(keys.lane_running_tokens_key(LANE))
