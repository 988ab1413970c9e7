"""Every Lua script compiles on a real Redis, and the job store names its arguments."""

import pytest
from conftest import ROOT

from tailguard.jobs.store import CANCELLED, QUEUED, JobStore
from tailguard.redis import keys

pytestmark = pytest.mark.integration

# what each script is run as (the preludes first: clock where the script stamps times,
# lane_counts where it reads a lane's load, live_count where it counts live workers)
PRELUDES = {"clock", "lane_counts", "live_count", "fair_release"}
SCRIPTS = {"create_job": ("clock", "lane_counts", "fair_release", "create_job"),
           "transition_job": ("clock", "fair_release", "transition_job"),
           "release_held": ("clock", "fair_release", "release_held"),
           "heartbeat": ("clock", "heartbeat"), "live_workers": ("clock", "live_count", "live_workers"),
           "live_members": ("clock", "live_members"),
           "record_stats": ("record_stats",), "lane_load": ("clock", "lane_counts", "live_count", "lane_load"),
           "record_served": ("record_served",), "take_tokens": ("clock", "take_tokens"),
           "append_delta": ("append_delta",), "hold_lease": ("hold_lease",),
           "release_lease": ("release_lease",),
           "set_batch_status": ("clock", "set_batch_status"),
           "finish_batch_line": ("finish_batch_line",),
           "prefix_lookup": ("clock", "prefix_lookup"), "take_offer": ("take_offer",),
           "give_up_offers": ("clock", "give_up_offers")}


def test_every_script_file_is_listed_here():
    files = {p.stem for p in (ROOT / "tailguard" / "redis" / "lua").glob("*.lua")} - PRELUDES
    assert files == set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script_compiles(redis_client, name):
    from tailguard.redis import lua

    sha = redis_client.script_load(lua.source(*SCRIPTS[name]))
    assert redis_client.script_exists(sha) == [True]


def test_a_terminal_transition_ends_both_streams_in_one_step(redis_client):
    store = JobStore(redis_client)
    job_id = "ab" * 16
    store.create(job_id, {"lane": "short", "prompt": "你好"}, queue_ttl_s=60)
    assert store.transition(job_id, {QUEUED}, CANCELLED, {"error": {"code": "cancelled"}}) == (
        True, QUEUED)
    assert store.get(job_id)["prompt"] == "你好"
    assert redis_client.xlen(keys.FINISHED_STREAM) == 1
    assert redis_client.xlen(keys.job_stream_key(job_id)) == 1


def test_a_job_created_only_if_new_leaves_an_existing_one_as_it_is(redis_client):
    from tailguard.errors import JobStateConflict
    from tailguard.jobs.store import RUNNING

    store = JobStore(redis_client)
    job_id = "ef" * 16
    store.create(job_id, {"lane": "batch", "cost": 10}, queue_ttl_s=60, only_new=True)
    store.transition(job_id, {QUEUED}, RUNNING, {"worker": "long@h"})
    with pytest.raises(JobStateConflict):
        store.create(job_id, {"lane": "batch", "cost": 10}, queue_ttl_s=60, only_new=True)
    assert store.get(job_id)["status"] == RUNNING


def test_a_batch_moves_only_from_the_statuses_named(redis_client):
    from tailguard.redis import lua

    script = lua.Script(redis_client, "clock", "set_batch_status")
    key = keys.batch_key("batch_" + "a" * 32)
    redis_client.hset(key, "status", "in_progress")
    assert script([key], **{"from": ["validating"], "to": "failed", "fields": {}}) == 0
    assert script([key], **{"from": ["in_progress"], "to": "cancelling", "fields": {"x": "1"}}) == 1
    got = redis_client.hgetall(key)
    assert got[b"status"] == b"cancelling" and got[b"x"] == b"1"
    assert abs(int(got[b"cancelling_at"]) - int(redis_client.time()[0])) <= 1
    assert script([keys.batch_key("batch_" + "b" * 32)], **{"from": ["in_progress"], "to": "x",
                                                           "fields": {}}) == 0


def test_a_worker_starts_a_job_in_one_step_and_gets_its_record(redis_client):
    from tailguard.jobs.store import RUNNING

    store = JobStore(redis_client)
    job_id = "ef" * 16
    store.create(job_id, {"lane": "long", "cost": 100, "deadline_s": 30}, queue_ttl_s=60)
    start = store.start(job_id, "long@h")
    assert start.started and start.state == QUEUED and not start.overdue
    assert start.record["status"] == RUNNING and start.record["worker"] == "long@h"
    assert (start.record["lane"], start.record["deadline_s"]) == ("long", 30.0)
    assert int(redis_client.get(keys.lane_backlog_key("long"))) == 0
    assert store.running() == {job_id: "long@h"}
    again = store.start(job_id, "other@h")  # a redelivered duplicate
    assert (again.started, again.state, again.overdue) == (False, RUNNING, False)
    assert store.start("00" * 16, "long@h") == type(start)(False, None)


def test_a_worker_does_not_start_a_job_past_its_queue_ttl(redis_client):
    import time

    store = JobStore(redis_client)
    job_id = "fe" * 16
    store.create(job_id, {"lane": "short", "cost": 10}, queue_ttl_s=0.01)
    time.sleep(0.05)
    start = store.start(job_id, "short@h")
    assert (start.started, start.state, start.overdue) == (False, QUEUED, True)
    assert store.status(job_id) == QUEUED and store.running() == {}


def test_an_end_keeps_the_record_and_the_text_for_their_own_ttls_and_the_text_once(redis_client):
    from tailguard.jobs.store import RUNNING, SUCCEEDED
    from tailguard.jobs.stream import DeltaWriter

    store = JobStore(redis_client, ttl_s=86400, record_ttl_s=600, output_ttl_s=60)
    job_id = "12" * 16
    store.create(job_id, {"lane": "long", "cost": 10}, queue_ttl_s=60)
    assert redis_client.ttl(keys.job_key(job_id)) > 600  # while live: the live backstop
    store.transition(job_id, {QUEUED}, RUNNING, {"worker": "w@h"})
    writer = DeltaWriter(redis_client, job_id, flush_s=0, ttl_s=86400)
    writer.add("so far and more")
    writer.close()
    assert redis_client.ttl(keys.job_stream_key(job_id)) > 600
    assert store.transition(job_id, {RUNNING}, SUCCEEDED, {"result": {
        "text": "so far and more", "completion_tokens": 4, "finish_reason": "length"}})[0]
    job = store.get(job_id)
    assert job["result"] == {"completion_tokens": 4, "finish_reason": "length"}  # no text here
    assert 590 < redis_client.ttl(keys.job_key(job_id)) <= 600
    assert 50 < redis_client.ttl(keys.job_stream_key(job_id)) <= 60


def test_a_write_after_the_end_neither_lands_nor_stretches_the_stream_s_ttl(redis_client):
    from tailguard.jobs.stream import DeltaWriter

    store = JobStore(redis_client, record_ttl_s=600, output_ttl_s=60)
    job_id = "34" * 16
    store.create(job_id, {"lane": "short"}, queue_ttl_s=60)
    assert store.transition(job_id, {QUEUED}, CANCELLED, {"error": {"code": "cancelled"}})[0]
    late = DeltaWriter(redis_client, job_id, flush_s=0, ttl_s=86400)  # a batch flushed just after
    late.add("late")
    assert late.flush()  # refused as an id below the end event's: counted as done, not retried
    assert redis_client.xlen(keys.job_stream_key(job_id)) == 1
    assert redis_client.ttl(keys.job_stream_key(job_id)) <= 60


def test_the_lease_has_one_holder_until_it_lapses_or_is_released(redis_client):
    import time

    from tailguard.redis.lease import Lease

    lease = Lease(redis_client, keys.REDELIVER_LEASE)
    assert lease.hold("a", 0.2) and lease.holder() == "a"
    assert not lease.hold("b", 0.2)
    assert lease.hold("a", 0.2)  # renewed
    time.sleep(0.3)
    assert lease.hold("b", 0.2)
    assert not lease.release("a")  # lost meanwhile: its successor's is kept
    assert lease.holder() == "b"
    assert lease.release("b") and lease.holder() is None
    assert lease.hold("a", 0.2)  # at once, not after a lapse

