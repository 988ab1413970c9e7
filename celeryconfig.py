"""Celery settings of tailguard: flat, lowercase, Celery's own names.

Derived from the lanes file (queues, routes, per-lane rate and time limits) and
from the environment (Redis URL; with Sentinels, their settings). Reading this module reads the lanes file but
connects to nothing. ``python -m celeryconfig`` checks it and prints a summary.

Time limits: ``task_annotations`` sets Celery's ``soft_time_limit``/``time_limit``
per lane for pools that honour them (prefork). tailguard workers run the
``threads`` pool, which ignores them (celery#9203), so the lane deadline is
enforced inside the task by aborting the engine request; Celery's hard limit
is a backstop a little past it.
"""

from kombu import Exchange, Queue

from tailguard import settings as _settings
from tailguard.lanes.table import load_lanes as _load_lanes
from tailguard.redis.client import celery_transport_options as _celery_transport_options

_lanes = _load_lanes()

broker_url = _settings.redis_url()
result_backend = _settings.redis_url()
broker_connection_retry_on_startup = True

# JSON only: messages are ids and primitives, and pickle would let anyone who
# can write to Redis run code on the workers.
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
result_accept_content = ["json"]

# One engine per worker process, N requests in flight: the threads pool keeps
# vLLM's continuous batching alive (prefork cannot host vLLM; solo is a batch of 1).
worker_pool = "threads"
# worker_concurrency is left unset on purpose: tasks/worker.py sets it to the
# served lane's max_num_seqs when the worker starts, unless -c/--concurrency is given.

# Late ack + prefetch 1: a worker reserves exactly `concurrency` requests, and a
# request whose worker dies is redelivered rather than lost.
task_acks_late = True
worker_prefetch_multiplier = 1
task_reject_on_worker_lost = True
# After a broker reconnect the consumer starts again at the prefetch tasks/worker.py set (its
# lanes' batch); Celery's reduction would restore it toward the pool's size, which a worker
# that may move between lanes sizes for its largest lane.
worker_enable_prefetch_count_reduction = False

# One direct exchange per lane, named like it, so Flower and `inspect active_queues` read plainly.
task_queues = [Queue(lane.queue, Exchange(lane.queue, type="direct"), routing_key=lane.queue)
               for lane in _lanes]
task_default_queue = _lanes.lanes[0].queue
task_routes = {lane.task_name: {"queue": lane.queue} for lane in _lanes}
task_create_missing_queues = False
task_annotations = {
    lane.task_name: {
        "rate_limit": lane.rate_limit or None,
        "soft_time_limit": lane.deadline_s,
        "time_limit": lane.deadline_s + 30,
    }
    for lane in _lanes
}

# Every Redis call bounded: while Redis is down or stopped, a publish fails (the API answers
# 503) instead of hanging, and a worker drops its connection and reconnects by itself
# (broker_connection_retry, on by default) once Redis is back.
_redis_timeout_s = _settings.REDIS_SOCKET_TIMEOUT_S.get()
broker_connection_timeout = _redis_timeout_s
broker_transport_options = {
    # A late-acked message is redelivered once unacked this long: keep it above
    # the longest legitimate queue wait + engine time of any lane.
    "visibility_timeout": int(_lanes.max_visibility_s) + 600,
    # A worker given `-Q long,batch` drains long before it looks at batch.
    "queue_order_strategy": "priority",
    # kombu's BRPOP keeps the queues it was sent with until it returns (a message, or this
    # timeout; kombu's default 1 s): a lane the worker opens again when a slot frees
    # (tailguard/worker/lane_gate.py) is not read until then, while its jobs wait and the
    # engine idles. Redis 6+ takes a fractional timeout.
    "polling_interval": 0.1,
    "socket_timeout": _redis_timeout_s,
    "socket_connect_timeout": _redis_timeout_s,
    "health_check_interval": 10,
    # A sentinel:// URL: the master's name and how to reach the Sentinels (tailguard's own
    # Redis client follows the same master); nothing for redis:// and rediss://.
    **_celery_transport_options(broker_url, _redis_timeout_s),
}
result_backend_transport_options = {"visibility_timeout": broker_transport_options["visibility_timeout"],
                                    **_celery_transport_options(result_backend, _redis_timeout_s)}
redis_socket_timeout = _redis_timeout_s
redis_socket_connect_timeout = _redis_timeout_s
# A publish retries briefly (a Redis restart), then fails: the API's request answers 503.
task_publish_retry_policy = {"max_retries": 2, "interval_start": 0, "interval_step": 0.5,
                             "interval_max": 1}
result_expires = _settings.JOB_TTL_S.get()
result_extended = True

# Events for Flower (its task list and states come from these events, not from the
# result backend). No task-sent event: the API queues a job's message with its record in one
# Redis call (tailguard/jobs/task_message.py), not through Celery's publish, so a task enters
# Flower's list when a worker receives it; a job still queued is counted on the Broker page.
worker_send_task_events = True
task_send_sent_event = False
# No STARTED write to the result backend before each task runs: nothing reads Celery's
# task state (the job record in tailguard/jobs/store.py says when a job started), and the write
# (with result_extended, the task's arguments: the prompt) sat on every request's path to
# its first token.
task_track_started = False


if __name__ == "__main__":
    print(f"broker_url={_settings.redact_url(broker_url)}")  # never the password
    for lane in _lanes:
        print(f"queue {lane.queue:<10} task {lane.task_name:<28} rate_limit={lane.rate_limit or '-'} "
              f"soft_time_limit={lane.deadline_s}s expires={lane.queue_ttl_s}s")
    print(f"visibility_timeout={broker_transport_options['visibility_timeout']}s")
