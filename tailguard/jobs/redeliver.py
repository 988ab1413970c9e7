"""Puts back on its lane's queue a message that a worker took but lost before starting it.

kombu's Redis transport emulates acknowledgements: a message a worker consumes moves
to the ``unacked`` hash (with its delivery time in the ``unacked_index`` sorted set)
until the worker acks it. When a worker's broker connection drops (Redis stalled past
the socket timeout, or restarted), Celery forgets the messages it had reserved but not
started, and kombu puts them back only if it can reach Redis at that very moment
(``restore_at_shutdown``); during the outage it cannot, so they wait in ``unacked``
for the visibility timeout (hours here: tailguard sets it above the longest lane
wait), their jobs "queued" until the queue TTL expires them.

A worker starts what it takes at once (prefetch = concurrency, threads pool), so a
message delivered more than ``after_s`` ago whose job is still queued was lost. A
pass puts it back with kombu's own restore (one WATCH/MULTI transaction, so two
passes racing restore it once). If its worker did still hold it, the two copies
race for the job's queued -> running compare-and-set and the loser is a no-op
(tailguard/worker/runner.py), so a false positive costs a skipped message, never a job run
twice. A message whose job already ended (its ack was lost with the connection) is
dropped the same way kombu drops an acked one.

A message can also vanish outright: a worker's BRPOP takes it off the list and the
connection drops before kombu records it in ``unacked``. Its job is still queued
and its message is nowhere. A pass notices when a lane has more jobs queued for
longer than ``after_s`` than messages in its list and in ``unacked``, and only then
reads the list; a job found nowhere by two passes ``confirm_s`` apart (a message is
between the two for a moment while it is delivered) fails as ``message_lost``. The
prompt lives only in the message, so it cannot be sent again: the client reads why
and may resubmit, instead of waiting out the queue TTL.

Delivery times are the consuming worker's wall clock, compared with this process's:
hosts of one deployment keep their clocks in sync (NTP) or this waits longer.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from tailguard.errors import MessageLost
from tailguard.jobs.store import FAILED, QUEUED, TERMINAL, JobStore
from tailguard.lanes.table import Lane
from tailguard.redis import keys

log = logging.getLogger("tailguard.redeliver")


class Redeliverer:
    """Restores lost deliveries; `run_once` is one pass (one Redeliverer per loop).

    `connect` returns a kombu Connection to the broker (a Celery app's
    ``connection_for_write``); it is opened on the first pass and again after an error.
    """

    def __init__(self, store: JobStore, connect: Callable[[], Any], after_s: float,
                 lanes: Sequence[Lane] = (), confirm_s: float = 1.0) -> None:
        self.store = store
        self.connect = connect
        self.after_s = after_s
        self.lanes = list(lanes)  # whose lost messages this pass looks for
        self.confirm_s = confirm_s
        self._connection: Any = None
        self._suspects: dict[str, float] = {}  # job id -> when a pass first found it nowhere

    def run_once(self) -> list[str]:
        """One pass; returns the ids of the jobs whose message it put back on a queue (the
        ones it failed as message_lost are logged)."""
        try:
            return self._pass()
        except Exception:
            # The next pass reconnects; the caller logs the error.
            self.close()
            raise

    def _pass(self) -> list[str]:
        if self._connection is None:
            self._connection = self.connect()
        channel = self._connection.default_channel
        qos, client = channel.qos, channel.client
        restored = []
        for tag in client.zrangebyscore(qos.unacked_index_key, "-inf", time.time() - self.after_s):
            raw = client.hget(qos.unacked_key, tag)
            if raw is None:
                continue  # acked meanwhile
            job_id = _task_id(raw)[0]
            state = self.store.status(job_id) if job_id else None
            if state == QUEUED:
                qos.restore_by_tag(tag, client)
                restored.append(job_id)
                log.warning("job %s: its message was delivered to a worker %.0f s ago and never "
                            "started (the worker lost its broker connection); put back on its "
                            "queue", job_id, self.after_s)
            elif state in TERMINAL:
                client.pipeline().zrem(qos.unacked_index_key, tag) \
                    .hdel(qos.unacked_key, tag).execute()
        self._fail_lost(client, qos)
        return restored

    def _fail_lost(self, client: Any, qos: Any) -> list[str]:
        """Fail the jobs whose message two passes found nowhere (see the module docstring)."""
        if not self.lanes:
            return []
        unacked: dict[str, set[str]] = {}  # queue -> job ids delivered, not acked
        for raw in client.hvals(qos.unacked_key):
            job_id, queue = _task_id(raw)
            if job_id and queue:
                unacked.setdefault(queue, set()).add(job_id)
        now = self.store.redis.time()
        now_s = now[0] + now[1] / 1e6
        nowhere: set[str] = set()
        for lane in self.lanes:
            # members "<cost> <job key>" scored by expires_at = submitted_at + queue_ttl_s
            old = {m.decode().split(" ", 1)[1] if isinstance(m, bytes) else m.split(" ", 1)[1]
                   for m in self.store.redis.zrangebyscore(
                       keys.lane_queued_key(lane.name), now_s,
                       now_s + lane.queue_ttl_s - self.after_s)}
            delivered = unacked.get(lane.queue, set())
            if len(old) <= client.llen(lane.queue) + len(delivered):
                continue  # every old job may still have its message: nothing to look for
            listed = {_task_id(raw)[0] for raw in client.lrange(lane.queue, 0, -1)}
            nowhere |= {keys.job_id_of(k) for k in old} - listed - delivered
        mono = time.monotonic()
        earlier = self._suspects
        self._suspects = {j: earlier.get(j, mono) for j in nowhere}
        failed = []
        for job_id, since in list(self._suspects.items()):
            if job_id not in earlier or mono - since < self.confirm_s:
                continue  # not yet seen missing by two passes confirm_s apart
            moved, _ = self.store.transition(job_id, {QUEUED}, FAILED, {"error": MessageLost(
                "the request's queue message was lost in a broker outage before any worker "
                "started it; nothing ran, resubmit it").to_dict()})
            del self._suspects[job_id]
            if moved:
                failed.append(job_id)
                log.warning("job %s failed: its queue message was lost (a broker outage)", job_id)
        return failed

    def close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.release()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close too
                pass
            self._connection = None


def _task_id(raw: bytes | str) -> tuple[str | None, str | None]:
    """(Celery task id = tailguard's job id, routing key) of a queued message (JSON) or of an
    ``unacked`` entry (JSON ``[message, exchange, routing_key]``); the id is in the headers."""
    try:
        value = json.loads(raw)
        message, routing_key = (value[0], value[2]) if isinstance(value, list) else (value, None)
        task_id = message["headers"]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None, None
    return (task_id if isinstance(task_id, str) else None), routing_key
