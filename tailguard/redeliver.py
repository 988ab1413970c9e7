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
(tailguard/runner.py), so a false positive costs a skipped message, never a job run
twice. A message whose job already ended (its ack was lost with the connection) is
dropped the same way kombu drops an acked one.

Delivery times are the consuming worker's wall clock, compared with this process's:
hosts of one deployment keep their clocks in sync (NTP) or this waits longer.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

from tailguard.jobs import QUEUED, TERMINAL, JobStore

log = logging.getLogger("tailguard.redeliver")


class Redeliverer:
    """Restores lost deliveries; `run_once` is one pass (one Redeliverer per loop).

    `connect` returns a kombu Connection to the broker (a Celery app's
    ``connection_for_write``); it is opened on the first pass and again after an error.
    """

    def __init__(self, store: JobStore, connect: Callable[[], Any], after_s: float) -> None:
        self.store = store
        self.connect = connect
        self.after_s = after_s
        self._connection: Any = None

    def run_once(self) -> list[str]:
        """One pass; returns the ids of the jobs whose message it put back on a queue."""
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
            job_id = _task_id(raw)
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
        return restored

    def close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.release()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close too
                pass
            self._connection = None


def _task_id(raw: bytes | str) -> str | None:
    """The Celery task id (= tailguard's job id) of an ``unacked`` entry:
    JSON ``[message, exchange, routing_key]``, the id in the message's headers."""
    try:
        message = json.loads(raw)[0]
        task_id = message["headers"]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return task_id if isinstance(task_id, str) else None
