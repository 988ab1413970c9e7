"""Prefix affinity (TAILGUARD_PREFIX_AFFINITY, tailguard/jobs/prefix_index.py) against a real Redis:
the API offers a request to the live worker that served its prefix, on that worker's own queue;
a lapsed offer moves to its lane's queue exactly once; the lost-message pass sees offered jobs;
a real Celery worker consumes its own queue ahead of its lane's; off, nothing of it happens."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager

import pytest
from celery.contrib.testing.worker import start_worker, test_worker_started
from kombu import Queue
from waiting import wait_for

from tailguard import settings
from tailguard.engine.host import GenerationResult, OpenAIResult
from tailguard.jobs.liveness import Liveness
from tailguard.jobs.prefix_index import PrefixIndex
from tailguard.jobs.redeliver import Redeliverer
from tailguard.jobs.store import FAILED, QUEUED, JobStore
from tailguard.jobs.stream import DeltaWriter
from tailguard.jobs.task_message import TaskMessages
from tailguard.lanes.affinity import Affinity
from tailguard.redis import keys
from tailguard.worker import runtime as tailguard_worker
from tailguard.worker.runner import GenerationJob, JobRunner
from tasks import app as celery_app

pytestmark = pytest.mark.integration

W1, W2 = "w1@host", "w2@host"
#: long enough for several 16-token blocks of the tiny model's tokenizer
HISTORY = " ".join(f"turn {i}: the user asked about lanes and the engine answered" for i in range(5))


def make_app(tiny_model, redis_server, **extra):
    from app import create_app

    return create_app({"TESTING": True, "TAILGUARD_MODEL": tiny_model,
                       "TAILGUARD_REDIS_URL": redis_server, "TAILGUARD_CONSUME_FINISHED": False,
                       "TAILGUARD_ADMIT_WITHOUT_WORKER": True, "TAILGUARD_REAP_RUNNING": False,
                       settings.PREFIX_AFFINITY.env: True, settings.PREFIX_BLOCK_TOKENS.env: 16,
                       **extra})


@pytest.fixture(scope="module")
def affinity_app(tiny_model, redis_server):
    return make_app(tiny_model, redis_server)


@pytest.fixture(scope="module")
def lapsing_app(tiny_model, redis_server):
    """Its offers lapse at once: the redelivery pass moves them at its next run."""
    return make_app(tiny_model, redis_server, **{settings.PREFIX_AFFINITY_WAIT_S.env: 0.0})


@pytest.fixture
def live(redis_client):
    """W1 and W2 serve the short lane (their heartbeats are fresh)."""
    liveness = Liveness(redis_client)
    for worker in (W1, W2):
        liveness.heartbeat(["short"], worker, 60)
    return liveness


def index(redis_client, wait_s: float = 60) -> PrefixIndex:
    return PrefixIndex(redis_client, Affinity(max_wait_s=wait_s))


def submit(client, prompt: str) -> str:
    reply = client.post("/v1/jobs", json={"prompt": prompt, "max_tokens": 4})
    assert reply.status_code == 202, reply.get_json()
    return reply.get_json()["id"]


def prefixes_of(redis_client, job_id: str) -> list[str]:
    return redis_client.hget(keys.job_key(job_id), "prefixes").decode().split()


def offered_to(app, redis_client, worker: str = W1) -> str:
    """A job the API offered to `worker`: its first turn indexed as served there, its next sent."""
    client = app.test_client()
    first = submit(client, HISTORY)
    index(redis_client).remember(prefixes_of(redis_client, first), worker)
    redis_client.delete("short")  # the first turn's message: not under test
    return submit(client, HISTORY + " and now one more question about affinity")


def test_an_indexed_prefix_is_offered_on_its_holders_own_queue(affinity_app, redis_client, live):
    client = affinity_app.test_client()
    first = submit(client, HISTORY)
    assert redis_client.llen("short") == 1  # nobody served it yet: the lane's queue
    assert len(prefixes_of(redis_client, first)) > 2
    index(redis_client).remember(prefixes_of(redis_client, first), W1)

    job = submit(client, HISTORY + " and now one more question about affinity")
    queue = keys.worker_queue("short", W1)
    assert redis_client.llen(queue) == 1 and redis_client.llen("short") == 1
    message = json.loads(redis_client.lindex(queue, 0))
    assert message["headers"]["id"] == job
    # routed like any message of its lane: kombu's restore puts it back on the lane's queue
    assert message["properties"]["delivery_info"]["routing_key"] == "short"
    assert redis_client.zscore(keys.OFFERS, job) is not None
    assert redis_client.hget(keys.job_key(job), "offered_to") == W1.encode()
    assert int(redis_client.hget(keys.OFFERED, W1)) == 1
    assert index(redis_client).outcomes() == {"made": 1}
    metrics = client.get("/metrics").data.decode()
    assert 'tailguard_prefix_offers_total{outcome="made"} 1.0' in metrics
    assert 'tailguard_prefix_offers_total{outcome="given_up"} 0.0' in metrics


def test_a_dead_workers_index_entries_are_not_used(affinity_app, redis_client, live):
    redis_client.zadd(keys.lane_workers_key("short"), {W1: 1})  # its heartbeat lapsed long ago
    offered_to(affinity_app, redis_client, W1)
    assert redis_client.llen(keys.worker_queue("short", W1)) == 0
    assert redis_client.llen("short") == 1 and redis_client.zcard(keys.OFFERS) == 0


def test_an_overloaded_holder_is_passed_over(affinity_app, redis_client, live):
    redis_client.hset(keys.OFFERED, W1, Affinity().max_extra + 1)  # W2 idles
    offered_to(affinity_app, redis_client, W1)
    assert redis_client.llen(keys.worker_queue("short", W1)) == 0 and redis_client.llen("short") == 1


def test_a_holder_at_its_advertised_limit_is_passed_over(affinity_app, redis_client, live):
    live.heartbeat(["short"], W1, 60, slots={"short": 1})  # the front end's engine: cut to 1
    assert redis_client.hget(keys.lane_worker_slots_key("short"), W1) == b"1"
    redis_client.hset(keys.OFFERED, W1, 1)  # one job offered to it already: it is full
    offered_to(affinity_app, redis_client, W1)
    assert redis_client.llen(keys.worker_queue("short", W1)) == 0 and redis_client.llen("short") == 1


def test_a_lapsed_workers_advertised_limit_is_dropped(redis_client, live):
    live.heartbeat(["short"], W1, 60, slots={"short": 3})
    redis_client.zadd(keys.lane_workers_key("short"), {W1: 1})  # lapsed long ago
    live.heartbeat(["short"], W2, 60, slots={"short": 8})  # a heartbeat drops the lapsed ones
    assert redis_client.hgetall(keys.lane_worker_slots_key("short")) == {W2.encode(): b"8"}
    live.forget(["short"], W2)
    assert redis_client.hlen(keys.lane_worker_slots_key("short")) == 0


def test_a_turn_is_classed_by_what_its_holder_must_compute(affinity_app, redis_client, live):
    """A conversation past the short lane's max_cost (256 in the tests' lanes file) whose
    history a live worker holds goes to the short lane, offered to that worker, its cost
    without the held tokens; with nobody holding it, the same prompt is long."""
    client = affinity_app.test_client()
    history = " ".join([HISTORY] * 3)
    reply = client.post("/v1/jobs", json={"prompt": history, "max_tokens": 16})
    assert reply.status_code == 202 and reply.get_json()["lane"] == "long", reply.get_json()
    full = reply.get_json()
    live.heartbeat(["long"], W1, 60)
    index(redis_client).remember(prefixes_of(redis_client, full["id"]), W1)
    turn = client.post("/v1/jobs", json={"prompt": history + " and one more", "max_tokens": 16})
    body = turn.get_json()
    assert turn.status_code == 202 and body["lane"] == "short", body
    assert body["prompt_tokens"] > full["prompt_tokens"] and body["cost"] < 256 < full["cost"]
    assert redis_client.hget(keys.job_key(body["id"]), "offered_to") == W1.encode()
    # held by a worker with no room: no offer, so its whole prompt counts: long
    redis_client.hset(keys.OFFERED, W1, 4)  # the test lanes' 4 slots
    again = client.post("/v1/jobs", json={"prompt": history + " and another", "max_tokens": 16})
    assert again.get_json()["lane"] == "long"


def test_a_lapsed_offer_moves_to_its_lanes_queue_exactly_once(lapsing_app, redis_client, live):
    job = offered_to(lapsing_app, redis_client)
    queue = keys.worker_queue("short", W1)
    message = redis_client.lindex(queue, 0)
    offers = index(redis_client)
    assert offers.give_up_due() == [job]
    assert redis_client.llen(queue) == 0 and redis_client.lrange("short", 0, -1) == [message]
    assert offers.give_up_due() == [] and redis_client.llen("short") == 1  # no duplicate
    assert offers.taken(job) is False  # the worker that never took it ends nothing
    assert offers.outcomes() == {"made": 1, "given_up": 1}
    assert redis_client.hget(keys.OFFERED, W1) is None
    assert redis_client.hlen(keys.OFFER_MESSAGES) == 0


def test_the_api_processes_loop_moves_lapsed_offers(lapsing_app, redis_client, live):
    job = offered_to(lapsing_app, redis_client)
    stop = threading.Event()
    index(redis_client, wait_s=0).start(stop)
    try:
        wait_for(lambda: redis_client.llen("short") == 1, what="the offer moved to its lane")
    finally:
        stop.set()
    assert json.loads(redis_client.lindex("short", 0))["headers"]["id"] == job
    assert redis_client.llen(keys.worker_queue("short", W1)) == 0


def test_an_offer_the_worker_took_as_it_lapsed_is_not_moved(lapsing_app, redis_client, live):
    job = offered_to(lapsing_app, redis_client)
    # the preferred worker's consumer takes the message (kombu: BRPOP, then unacked) just
    # before the pass runs
    conn = celery_app.connection_for_write()
    try:
        taken = Queue(keys.worker_queue("short", W1), channel=conn.default_channel).get(no_ack=False)
        assert taken is not None and taken.headers["id"] == job
        offers = index(redis_client)
        assert offers.give_up_due() == []
        assert redis_client.llen("short") == 0  # no copy on the lane's queue: no duplicate
        assert offers.outcomes() == {"made": 1, "taken": 1}
        # that worker loses the message with its connection: the lost-delivery pass restores
        # it onto the lane's queue (its routing key), never onto the worker's own
        store = JobStore(redis_client)
        assert Redeliverer(store, celery_app.connection_for_write, after_s=0,
                           offers=offers).run_once() == [job]
        assert redis_client.llen("short") == 1
        assert redis_client.llen(keys.worker_queue("short", W1)) == 0
    finally:
        conn.release()


def test_the_lost_message_pass_sees_jobs_parked_on_a_workers_queue(affinity_app, redis_client,
                                                                   live):
    from tailguard.lanes.table import load_lanes

    job = offered_to(affinity_app, redis_client)
    store = JobStore(redis_client)
    lanes = [load_lanes()["short"]]
    passes = Redeliverer(store, celery_app.connection_for_write, after_s=0, lanes=lanes,
                         confirm_s=0, offers=index(redis_client))
    try:
        for _ in range(3):  # two passes confirm_s apart find a job nowhere: it would fail
            passes.run_once()
        assert store.get(job)["status"] == QUEUED
        # the same passes blind to offers would fail it as lost: what the offers' count prevents
        passes.offers = None
        for _ in range(3):
            passes.run_once()
        assert store.get(job)["status"] == FAILED
    finally:
        passes.close()


class FirstTokenEngine:
    """An in-process engine that reaches its first token, then ends."""

    def generate(self, request_id, prompt, sampling, deadline_s, on_first_token=None,
                 should_cancel=None, on_delta=None, add_special_tokens=True) -> GenerationResult:
        if on_first_token is not None:
            on_first_token()
        if on_delta is not None:
            on_delta("a")
        return GenerationResult("a", 3, 1, "length", 0.01, 0.02)


def test_the_worker_ends_its_offer_and_indexes_the_prefixes_at_its_first_token(
        affinity_app, redis_client, live):
    job = offered_to(affinity_app, redis_client, W1)
    offers = index(redis_client)
    store = JobStore(redis_client)
    runner = JobRunner(lambda: FirstTokenEngine(), store,
                       lambda job_id: DeltaWriter(redis_client, job_id, flush_s=0), worker=W2,
                       offers=offers)
    runner.run(GenerationJob(job, "…", max_tokens=4, sampling={}, deadline_s=5))
    assert offers.outcomes() == {"made": 1, "taken": 1}
    assert redis_client.zcard(keys.OFFERS) == 0 and redis_client.hget(keys.OFFERED, W1) is None
    # W2 served it last: the latest holder of each of its prefixes
    for prefix in prefixes_of(redis_client, job):
        held = redis_client.zrange(keys.prefix_holders_key(prefix), 0, -1)
        assert held[-1] == W2.encode()
        assert redis_client.ttl(keys.prefix_holders_key(prefix)) > 0


class ResponseEngine:
    """An in-process engine that answers a non-streamed OpenAI request whole: no chunk, so no
    first-token callback, as vLLM's serving layer does."""

    def openai(self, request_id, endpoint, request, deadline_s, extra=None, on_first_token=None,
               should_cancel=None, on_chunks=None) -> OpenAIResult:
        return OpenAIResult('{"object": "text_completion"}', 5, 3, "length", 0.01, 0.02)


def test_a_non_streamed_request_indexes_its_prefixes_once_answered(affinity_app, redis_client,
                                                                     live):
    job = offered_to(affinity_app, redis_client, W1)
    offers = index(redis_client)
    runner = JobRunner(lambda: ResponseEngine(), JobStore(redis_client),
                       lambda job_id: DeltaWriter(redis_client, job_id, flush_s=0), worker=W2,
                       offers=offers)
    spec = {"endpoint": "completion", "capped": False, "prompt_tokens": 5,
            "request": {"model": "m", "prompt": "hi", "max_tokens": 3, "stream": False}}
    runner.run(GenerationJob(job, "", max_tokens=3, sampling={}, deadline_s=5, openai=spec))
    assert offers.outcomes() == {"made": 1, "taken": 1}
    for prefix in prefixes_of(redis_client, job):
        assert redis_client.zrange(keys.prefix_holders_key(prefix), 0, -1)[-1] == W2.encode()


@pytest.fixture(scope="module")
def off_app(tiny_model, redis_server):
    return make_app(tiny_model, redis_server, **{settings.PREFIX_AFFINITY.env: False})


def test_off_nothing_is_indexed_or_offered(off_app, redis_client, live):
    """TAILGUARD_PREFIX_AFFINITY=0 (it is on by default)."""
    client = off_app.test_client()
    index(redis_client).remember(["ab" * 12], W1)  # even an index written by someone else
    job = submit(client, HISTORY)
    assert redis_client.hget(keys.job_key(job), "prefixes") is None
    assert redis_client.llen("short") == 1
    assert [k for k in redis_client.keys("*") if b"offers" in k or b".w." in k] == []
    assert "tailguard_prefix_offers" not in client.get("/metrics").data.decode()
    store = JobStore(redis_client)
    runner = JobRunner(lambda: FirstTokenEngine(), store,
                       lambda job_id: DeltaWriter(redis_client, job_id, flush_s=0), worker=W1)
    runner.run(GenerationJob(job, "…", max_tokens=4, sampling={}, deadline_s=5))
    assert [k for k in redis_client.keys(f"{keys.PREFIX}:prefix:*")] == [
        keys.prefix_holders_key("ab" * 12).encode()]


@contextmanager
def celery_worker(hostname: str):
    """A real worker (threads pool, in a thread, no engine started) with its lane gate."""
    def _setup(sender=None, worker=None, consumer=None, **_):
        tailguard_worker.setup(celery_app, worker.hostname,
                               [q.name for q in consumer.task_consumer.queues],
                               eager_engine=False, consumer=consumer)

    test_worker_started.connect(_setup, weak=False)
    try:
        with start_worker(celery_app, pool="threads", concurrency=2, queues=["long", "batch"],
                          perform_ping_check=False, loglevel="WARNING", hostname=hostname,
                          shutdown_timeout=30) as w:
            wait_for(lambda: tailguard_worker.attached(celery_app) is not None)
            try:
                yield w
            finally:
                tailguard_worker.teardown(celery_app)
    finally:
        test_worker_started.disconnect(_setup)


def test_a_celery_worker_consumes_its_own_queue_ahead_of_its_lanes(redis_client, monkeypatch):
    monkeypatch.setenv(settings.PREFIX_AFFINITY.env, "1")
    hostname = "affinity@localhost"
    with celery_worker(hostname) as worker:
        consumer = worker.consumer
        own = keys.worker_queue("long", hostname)
        wait_for(lambda: [q.name for q in consumer.task_consumer.queues][:2] == [own, "long"],
                 what="its own queue consumed ahead of the lane's")
        names = [q.name for q in consumer.task_consumer.queues]
        assert names.index(keys.worker_queue("batch", hostname)) == names.index("batch") - 1
        # a message offered to it (expired: the worker drops it without an engine) is taken
        # from its own queue
        message = TaskMessages(celery_app).build("tailguard.generate.long", task_id="cd" * 16,
                                                 queue="long", kwargs={}, expires_s=0.001)
        redis_client.lpush(own, message)
        wait_for(lambda: redis_client.llen(own) == 0)


def test_an_openai_chat_is_offered_by_the_tokens_vllm_rendered(affinity_app, redis_client, live):
    client = affinity_app.test_client()
    system = {"role": "system", "content": HISTORY}

    def chat(*messages) -> str:
        resp = client.post("/v1/chat/completions", buffered=False, json={
            "messages": [system, *messages], "max_tokens": 4, "stream": True})
        assert resp.status_code == 200, resp.get_data(as_text=True)[:500]
        resp.close()  # answered once its job is queued: its stream is not under test
        queued = [json.loads(raw)["headers"]["id"] for raw in redis_client.lrange("short", 0, -1)
                  + redis_client.lrange(keys.worker_queue("short", W1), 0, -1)]
        return queued[0]

    first = chat({"role": "user", "content": "hi"})
    assert redis_client.llen("short") == 1 and len(prefixes_of(redis_client, first)) > 2
    index(redis_client).remember(prefixes_of(redis_client, first), W1)
    redis_client.delete("short")
    second = chat({"role": "user", "content": "hello again"})
    assert redis_client.lrange(keys.worker_queue("short", W1), 0, -1)
    assert second != first and redis_client.zscore(keys.OFFERS, second) is not None
