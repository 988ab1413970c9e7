"""Celery's side of a tailguard worker: its signals and its remote-control command.

Each handler adapts one Celery event to tailguard/worker/runtime.py, which owns the
worker's engine, heartbeat and lane gate.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import signals
from celery.worker.control import inspect_command

from tailguard.lanes.table import engine_settings_for, load_lanes, slots_for
from tailguard.worker.runtime import (
    attached,
    engine_stats_of,
    exit_worker,
    lanes_for_queue_names,
    setup,
    teardown,
)

log = logging.getLogger("tailguard.worker")


@signals.celeryd_init.connect
def _set_concurrency(sender=None, conf=None, options=None, **_: Any) -> None:
    """`celery -A tasks worker -Q short`: run as many threads as the lane batches requests."""
    options = options or {}
    queues = options.get("queues")
    if not queues or options.get("concurrency"):
        return
    names = queues.split(",") if isinstance(queues, str) else list(queues)
    table = load_lanes()
    names = [n.strip() for n in names if n.strip()]
    lanes = lanes_for_queue_names(table, names)
    conf.worker_concurrency = engine_settings_for(lanes)[0]


@signals.worker_ready.connect
def _on_worker_ready(sender=None, **_: Any) -> None:
    """Set up from the queues this worker actually consumes, then start the engine.

    Celery logs and swallows a signal handler's exception, which would leave a worker
    consuming with nothing to run its tasks: a worker that cannot set up exits instead.
    """
    try:
        queues = [q.name for q in sender.task_consumer.queues]
        runtime = setup(sender.app, sender.hostname, queues, consumer=sender)
        # one message per engine slot (the pool may have been given more threads: -c)
        _set_prefetch(sender, slots_for(runtime.lanes))
    except Exception:
        log.critical("this worker cannot set up, so it exits", exc_info=True)
        exit_worker()


@signals.task_received.connect
def _on_received(sender=None, request=None, **_: Any) -> None:
    """A message reached this worker (consumer thread): its lane's per-engine limit counts it."""
    runtime = attached(sender.app) if sender is not None else None
    if runtime is not None and runtime.gate is not None and request is not None:
        runtime.gate.received(request.id, request.name,
                              int((request.kwargs or {}).get("prefill_tokens") or 0))


@signals.task_revoked.connect
def _on_revoked(sender=None, request=None, expired: bool = False, **_: Any) -> None:
    """Celery drops a message whose `expires` passed before it was received: record why."""
    runtime = attached(sender.app) if sender is not None else None
    if runtime is not None and request is not None:
        if runtime.gate is not None:
            runtime.gate.ended(request.id)
        if expired:
            runtime.runner.expire(request.id, only_if_overdue=False)


@signals.worker_shutdown.connect
def _on_worker_shutdown(sender=None, **_: Any) -> None:
    teardown(sender.app)


def _set_prefetch(consumer: Any, slots: int) -> None:
    """Reserve `slots` messages at most (late acks: one per job in flight), in the consumer's
    thread; Celery's own prefetch is the pool's size. Also what a broker reconnect starts the
    consumer's QoS at again (`initial_prefetch_count`; celeryconfig turns off the reduction
    that would otherwise grow it back to the pool's size, larger for a worker that may move)."""
    consumer.initial_prefetch_count = slots
    consumer.qos.value = slots
    consumer.qos.update()


# --- `celery -A tasks inspect engine_stats` ------------------------------------------------

@inspect_command()
def engine_stats(state, **_: Any) -> dict:
    """What this worker's engine host observed: in-flight, peak, aborted, still unfinished."""
    runtime = attached(state.consumer.app)
    if runtime is None:
        return {"ready": False}
    return {"ready": runtime.serving, "engine": runtime.keeper.state,
            "restarts": runtime.keeper.restarts, "lanes": runtime.lane_names, "pid": os.getpid(),
            **engine_stats_of(runtime).to_dict(),
            **({"engine_core_away": runtime.roamer.away,
                "engine_core_moves_away": runtime.roamer.moves_away}
               if runtime.roamer is not None else {}),
            **({"running_by_lane": dict(runtime.gate.running())} if runtime.gate else {})}
