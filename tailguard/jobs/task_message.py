"""A lane's Celery task message, built the way kombu's Redis transport stores it.

Why not ``app.send_task``: the API stores the job record and queues its message in ONE Redis
call (``tailguard/redis/lua/create_job.lua`` pushes the string this module builds onto the lane's
list). Celery's publish path put a second step on every request's way to its first token,
on the front end's core: kombu's producer (a new redis-py client per publish), the push, and
the task-sent event (a second publish). It also made a second step that could fail after the
first: a record without a message. Now a message exists exactly when its record does.

The message is still Celery's: its headers, properties and body come from Celery's own
protocol-2 code (``app.amqp.create_task_message``, what ``send_task`` calls), serialized by
kombu, wrapped as ``kombu.transport.virtual.Channel.prepare_message`` and ``basic_publish``
wrap it (base64 body, delivery info, delivery tag). A test compares it field by field with
what ``send_task`` writes (tests/integration/test_task_message_on_redis.py), and every
integration test's worker consumes it.

Valid where tailguard's Celery config holds: the broker is the job store's Redis (the API
gives its producer the store's URL), JSON serialization, no key prefix, priority 0 (the
queue's list is named like the lane's queue), direct exchanges (Celery sends on the anonymous
exchange with the queue as routing key).
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

from kombu import serialization
from kombu.utils.json import dumps

from tailguard.errors import ConfigError

#: task arguments that hold a client's text: never in the message's preview (`kwargs_repr`)
PRIVATE_KWARGS = ("prompt",)


def kwargs_repr(kwargs: dict[str, Any]) -> str:
    """The preview of a task's arguments that Celery puts in the message (``kwargsrepr``) and that
    Flower, worker logs and ``inspect`` show: the prompt's length, the stop strings' count and
    an OpenAI request's size, never their text (Celery's default previews the first 1 KB of
    the prompt)."""
    shown = {k: f"<{len(v)} characters>" if k in PRIVATE_KWARGS and isinstance(v, str) else v
             for k, v in kwargs.items()}
    sampling = shown.get("sampling")
    if isinstance(sampling, dict) and sampling.get("stop"):
        shown["sampling"] = {**sampling, "stop": f"<{len(sampling['stop'])} strings>"}
    openai = shown.get("openai")
    if isinstance(openai, dict) and "request" in openai:  # the client's body: its size only
        shown["openai"] = {**openai, "request": f"<{len(dumps(openai['request']))} characters>"}
    return repr(shown)


class TaskMessages:
    """Builds lanes' task messages with a Celery app's protocol code; ``control`` is the
    app's (revoking a queued job's task)."""

    def __init__(self, app: Any) -> None:  # a celery.Celery configured from celeryconfig
        conf = app.conf
        # What Celery's publish would do differently from the message built here: refuse at
        # startup rather than queue messages a worker reads otherwise.
        unsupported = {
            "task_protocol": conf.task_protocol != 2,
            "task_compression": bool(conf.task_compression),
            "task_default_priority": bool(conf.task_default_priority),
            "broker_transport_options.global_keyprefix":
                bool((conf.broker_transport_options or {}).get("global_keyprefix")),
        }
        bad = [name for name, is_bad in unsupported.items() if is_bad]
        if bad:
            raise ConfigError(f"the API queues Celery messages itself (tailguard/jobs/task_message.py) "
                              f"and supports Celery's defaults only for: {', '.join(bad)}",
                              field=bad[0])
        self.app = app
        self.control = app.control

    def build(self, name: str, *, task_id: str, queue: str, kwargs: dict[str, Any],
              expires_s: float) -> str:
        """The message for task `name` with `kwargs`, expiring `expires_s` from now, as it
        goes onto the Redis list named `queue` (LPUSH: workers pop from the other end)."""
        app = self.app
        headers, properties, body, _ = app.amqp.create_task_message(
            task_id, name, (), kwargs, expires=expires_s, reply_to=app.thread_oid,
            # The job record is the result (tailguard/jobs/store.py): Celery stores none.
            ignore_result=True, kwargsrepr=kwargs_repr(kwargs))
        content_type, content_encoding, payload = serialization.dumps(
            body, serializer=app.conf.task_serializer)
        if isinstance(payload, str):
            payload = payload.encode(content_encoding)
        return dumps({
            "body": base64.b64encode(payload).decode("ascii"),
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": headers,
            "properties": {
                **properties,
                "delivery_mode": 2,  # persistent: the default of Celery's queues
                # Celery's per-message TTL (milliseconds), which AMQP brokers honour; the
                # worker itself reads the `expires` header.
                "expiration": str(int(expires_s * 1000)),
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        })
