"""The task message the API pushes with a job's record (tailguard/jobs/task_message.py) against the
one Celery's own `send_task` writes to the same Redis, and the record and message as one step."""

import base64
import json
from datetime import datetime

import pytest

from tailguard.jobs.store import BacklogMoved, JobStore
from tailguard.lanes.admission import BacklogLimits
from tailguard.redis import keys

pytestmark = pytest.mark.integration

KWARGS = {"job_id": "f" * 32, "prompt": "解释什么是Transformer", "max_tokens": 16,
          "sampling": {"temperature": 0.5}, "deadline_s": 30}


@pytest.fixture
def producer(redis_server):
    """A producer-only Celery app configured like the API's (app/gateway_ext.py)."""
    from celery import Celery

    app = Celery("tailguard-api", set_as_current=False)
    app.config_from_object("celeryconfig")
    app.conf.update(broker_url=redis_server, result_backend=redis_server)
    yield app
    app.close()


def pop_all(redis_client, queue):
    """The queue's messages, oldest first (workers pop from the right)."""
    return [json.loads(m) for m in reversed(redis_client.lrange(queue, 0, -1))]


def test_the_message_is_the_one_send_task_writes(producer, redis_client):
    from tailguard.jobs.task_message import TaskMessages, kwargs_repr

    task_id = "a" * 32
    # send_task given the same preview of the arguments (Flower's; no prompt text in it)
    producer.send_task("tailguard.generate.short", task_id=task_id, queue="short", expires=60,
                       kwargs=KWARGS, ignore_result=True, kwargsrepr=kwargs_repr(KWARGS))
    redis_client.lpush("short", TaskMessages(producer).build(
        "tailguard.generate.short", task_id=task_id, queue="short", kwargs=KWARGS, expires_s=60))
    celerys, ours = pop_all(redis_client, "short")

    # the fields that differ per publish: a fresh delivery tag, the expiry from the clock
    tags = celerys["properties"].pop("delivery_tag"), ours["properties"].pop("delivery_tag")
    assert tags[0] != tags[1] and len(tags[1]) == 36
    expires = [datetime.fromisoformat(m["headers"].pop("expires")) for m in (celerys, ours)]
    assert expires[0].tzinfo is not None and expires[1].tzinfo is not None
    assert abs((expires[1] - expires[0]).total_seconds()) < 5
    # send_task also copies the option it was given into the properties, where no one reads it
    assert celerys["properties"].pop("kwargsrepr") == ours["headers"]["kwargsrepr"]
    assert ours == celerys
    assert KWARGS["prompt"] not in ours["headers"]["kwargsrepr"]
    assert "<16 characters>" in ours["headers"]["kwargsrepr"]
    # and what a worker reads from it
    args, kwargs, embed = json.loads(base64.b64decode(ours["body"]))
    assert (args, kwargs) == ([], KWARGS)
    assert ours["headers"]["task"] == "tailguard.generate.short"
    assert ours["headers"]["ignore_result"] is True
    assert ours["properties"]["delivery_info"] == {"exchange": "", "routing_key": "short"}


def test_the_message_goes_in_with_the_record_or_not_at_all(redis_client):
    store = JobStore(redis_client)
    fields = {"lane": "short", "cost": 50, "deadline_s": 30}
    store.create("1" * 32, fields, queue_ttl_s=60, message=("short", '{"m": 1}'))
    assert redis_client.hget(keys.job_key("1" * 32), "status") == b"queued"
    assert redis_client.lrange("short", 0, -1) == [b'{"m": 1}']
    # past the lane's backlog bound: neither the record nor the message
    with pytest.raises(BacklogMoved):
        store.create("2" * 32, fields, queue_ttl_s=60, limits=BacklogLimits(after=60),
                     message=("short", '{"m": 2}'))
    assert not redis_client.exists(keys.job_key("2" * 32))
    assert redis_client.lrange("short", 0, -1) == [b'{"m": 1}']


@pytest.mark.parametrize("setting", [{"task_protocol": 1}, {"task_compression": "gzip"},
                                     {"task_default_priority": 5},
                                     {"broker_transport_options": {"global_keyprefix": "x:"}}])
def test_a_celery_setting_the_message_does_not_follow_is_refused_at_startup(producer, setting):
    from tailguard.errors import ConfigError
    from tailguard.jobs.task_message import TaskMessages

    TaskMessages(producer)  # celeryconfig as shipped
    producer.conf.update(setting)
    with pytest.raises(ConfigError, match=next(iter(setting))):
        TaskMessages(producer)
