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
twice. A message whose job already ended (its ack was lost with the connection), or whose
job has no record any more, is dropped the same way kombu drops an acked one.

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

The work is bounded. Every API and worker process runs the loop, but a pass runs only in
the process that holds the redelivery lease (``keys.REDELIVER_LEASE``, renewed by each of
its passes, taken over by another process within ``lease_s`` once it stops). A pass reads
kombu's index of deliveries by score, so only those older than ``after_s`` are
candidates, and reads a candidate's message (which holds the prompt) once: its job id and
queue are kept for later passes, which then read only the job's state. The lanes' lists
and the other deliveries are read only when a lane's counts say a message may be missing.
A job held in fair order (tailguard/redis/lua/fair_release.lua) has its message in its key's
held list: counted as found; and each pass releases what fits of the held jobs, the backstop
for a slot freed without a job transition. With prefix affinity on (`offers`), a job offered to
one worker first has its message on that worker's own queue: counted as found too; and each pass
moves the offers past their deadline to their lanes' queues (tailguard/jobs/prefix_index.py).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tailguard.errors import MessageLost
from tailguard.jobs.prefix_index import PrefixIndex
from tailguard.jobs.store import FAILED, QUEUED, TERMINAL, JobStore
from tailguard.lanes.table import Lane
from tailguard.redis import keys
from tailguard.redis.lease import Lease

log = logging.getLogger("tailguard.redeliver")


#: The shortest redelivery lease, in seconds (it is 3 passes' gaps, `confirm_s`, when longer).
LEASE_MIN_S = 3.0

#: A delivery's job id and queue, as its message names them (None: not a tailguard message).
Delivery = tuple[str | None, str | None]


class Redeliverer:
    """Restores lost deliveries; `run_once` is one pass (one Redeliverer per loop).

    `connect` returns a kombu Connection to the broker (a Celery app's
    ``connection_for_write``); it is opened on the first pass and again after an error.
    Passes run while this Redeliverer holds the lease (see the module docstring), which
    lapses `lease_s` after its last pass: 3 x `confirm_s` (the gap between the loop's
    passes), at least LEASE_MIN_S.
    """

    def __init__(self, store: JobStore, connect: Callable[[], Any], after_s: float,
                 lanes: Sequence[Lane] = (), confirm_s: float = 1.0,
                 lease_s: float | None = None, offers: PrefixIndex | None = None) -> None:
        self.store = store
        #: prefix affinity's offers (None: off)
        self.offers = offers
        self.connect = connect
        self.after_s = after_s
        # whose lost messages this pass looks for: every lane of the table (one lease, so the
        # process that holds it looks for all of them), whatever lanes its own process serves
        self.lanes = list(lanes)
        self.confirm_s = confirm_s
        self.lease_s = lease_s if lease_s is not None else max(LEASE_MIN_S, 3 * confirm_s)
        self.owner = f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        self._lease = Lease(store.redis, keys.REDELIVER_LEASE)
        self._connection: Any = None
        self._suspects: dict[str, float] = {}  # job id -> when a pass first found it nowhere
        self._deliveries: dict[str, Delivery] = {}  # delivery tag -> what its message names

    def holds_lease(self) -> bool:
        """Take or renew the lease; whether this Redeliverer runs the passes now."""
        return self._lease.hold(self.owner, self.lease_s)

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
        if not self.holds_lease():
            self._suspects.clear()  # another process's passes look for them now
            return []
        if self.offers is not None:
            self.offers.give_up_due()
        if self._connection is None:
            self._connection = self.connect()
        channel = self._connection.default_channel
        qos, client = channel.qos, channel.client
        old = [_text(t) for t in client.zrangebyscore(qos.unacked_index_key, "-inf",
                                                      time.time() - self.after_s)]
        deliveries = self._read_deliveries(client, qos, old)
        # the old deliveries are the ones kept: a delivery stays old until it is acked
        self._deliveries = {tag: deliveries[tag] for tag in old if tag in deliveries}
        candidates = [(tag, job_id) for tag, (job_id, _) in self._deliveries.items() if job_id]
        pipe = self.store.redis.pipeline(transaction=False)
        for _, job_id in candidates:
            pipe.hget(keys.job_key(job_id), "status")
        restored = []
        for (tag, job_id), state in zip(candidates, pipe.execute() if candidates else []):
            state = _text(state) if state is not None else None
            if state == QUEUED:
                qos.restore_by_tag(tag, client)
                restored.append(job_id)
                log.warning("job %s: its message was delivered to a worker %.0f s ago and never "
                            "started (the worker lost its broker connection); put back on its "
                            "queue", job_id, self.after_s)
            elif state in TERMINAL or state is None:
                # ended (its ack lost with a connection) or no record at all (expired, or lost
                # with Redis's last writes): no worker would run it, so it is acked here
                client.pipeline().zrem(qos.unacked_index_key, tag) \
                    .hdel(qos.unacked_key, tag).execute()
        self._fail_lost(client, qos)
        for lane in self.lanes:
            # a slot freed without a job's transition (a worker skipped a cancelled job's
            # message) releases a fair lane's held jobs here, within a pass
            self.store.release_held(lane.name)
        return restored

    def _read_deliveries(self, client: Any, qos: Any, tags: Iterable[str]) -> dict[str, Delivery]:
        """What the messages of `tags` name: from earlier passes, else read (once) from kombu's
        ``unacked`` hash; a tag acked meanwhile is left out."""
        known = {tag: self._deliveries[tag] for tag in tags if tag in self._deliveries}
        unread = [tag for tag in tags if tag not in known]
        if unread:
            for tag, raw in zip(unread, client.hmget(qos.unacked_key, unread)):
                if raw is not None:
                    known[tag] = _task_id(raw)
        return known

    def _fail_lost(self, client: Any, qos: Any) -> list[str]:
        """Fail the jobs whose message two passes found nowhere (see the module docstring)."""
        if not self.lanes:
            return []
        now = self.store.redis.time()
        now_s = now[0] + now[1] / 1e6
        nowhere: set[str] = set()
        in_flight = client.zcard(qos.unacked_index_key)
        unacked: dict[str, set[str]] | None = None  # queue -> job ids delivered, not acked
        # jobs offered to one worker first: their messages are on its own queue (every lane's
        # counted for each lane: a bound, so only more passes skip the lists)
        offered = self.offers.offered_jobs() if self.offers is not None else set()
        for lane in self.lanes:
            # members "<cost> <job key>" scored by expires_at = submitted_at + queue_ttl_s
            old = {_text(m).split(" ", 1)[1] for m in self.store.redis.zrangebyscore(
                keys.lane_queued_key(lane.name), now_s, now_s + lane.queue_ttl_s - self.after_s)}
            # a fair lane's jobs held in front of its queue have their messages there
            listed_count = (client.llen(lane.queue) + self.store.held_count(lane.name)
                            + len(offered))
            if len(old) <= listed_count + in_flight:
                continue  # every old job may still have its message: nothing to look for
            if unacked is None:
                unacked = self._delivered_by_queue(client, qos)
            delivered = unacked.get(lane.queue, set())
            if len(old) <= listed_count + len(delivered):
                continue
            listed = ({_task_id(raw)[0] for raw in client.lrange(lane.queue, 0, -1)}
                      | set(self.store.held_jobs(lane.name)) | offered)
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

    def _delivered_by_queue(self, client: Any, qos: Any) -> dict[str, set[str]]:
        """Every delivery not acked yet, as job ids per queue (the recent ones' messages read
        now, the old ones' known from this pass)."""
        tags = [_text(t) for t in client.zrange(qos.unacked_index_key, 0, -1)]
        by_queue: dict[str, set[str]] = {}
        for job_id, queue in self._read_deliveries(client, qos, tags).values():
            if job_id and queue:
                by_queue.setdefault(queue, set()).add(job_id)
        return by_queue

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


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
