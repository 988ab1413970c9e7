"""Per-engine limits per lane on a Celery worker that consumes every lane it serves.

A worker consumes its lanes' queues in priority order (``-Q short,long,batch``, kombu's
``queue_order_strategy = "priority"``) and reserves one message per engine slot. Celery's
prefetch is per consumer, not per queue, and a reserved message cannot be handed back
(celery#2564), so without more a burst of long jobs could take every slot. The gate keeps the
consumed queues to what tailguard/lanes/dispatch.py's ``consumable`` allows: a lane whose jobs
on this engine reach its limit (or, with ``max_ahead``, whose lanes ahead reach that) stops
being consumed the moment the message that reaches it arrives, and is consumed again when one
of those jobs ends, in the lane order. kombu's Redis transport reads a queue added back only
once the BRPOP in flight on the others returns: ``polling_interval`` in celeryconfig.py bounds
that at 0.1 s (kombu's default, 1 s, left a slot idle that long while its lane had jobs).

Counting starts when Celery receives a message (``received``, in the consumer's thread, before
the message reaches the pool) and ends when its task ends or is revoked (``ended``, any
thread). Queue changes run in the consumer's thread: at once from ``received``, through
``call_soon`` (which wakes the consumer's event loop) from anywhere else. The change is
level-triggered: each one compares what the consumer consumes with what the rule allows, so a
broker reconnect or a lost step is mended by the next one. A message that arrives for a lane
already at its limit, or at an engine at its prefill bound (a delivery racing a cancel), is
``over``: its task gives it back to its queue without running it.

With a prefill bound (the worker entry's ``max_prefill_tokens``), each job's prompt tokens to
prefill (``prefill_tokens`` in its message: what the API counted) also count from its receipt
until its first token (``prefilled``, from its task's thread) or its end; at the bound a lane's
queue closes, and those of the lanes after it (tailguard/lanes/dispatch.py), until one is out.

With prefix affinity on, a worker has its own queue per lane (``own``: the jobs offered to it
first, tailguard/jobs/prefix_index.py), consumed just ahead of the lane's shared queue whenever
that lane is: its messages are the lane's tasks, so they count as the lane's.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from tailguard.lanes.dispatch import LaneLimit, consumable

log = logging.getLogger("tailguard.worker")

_TASK_PREFIX = "tailguard.generate."


def lane_of_task(task_name: str) -> str | None:
    """The lane of a generation task's name (`tailguard.generate.<lane>`); None for others."""
    return task_name[len(_TASK_PREFIX):] if task_name.startswith(_TASK_PREFIX) else None


class LaneGate:
    """Which of `lanes` (in priority order) a worker consumes now. `consumer` is Celery's
    Consumer (``cancel_task_queue``, ``add_task_queue``, ``call_soon``, ``task_consumer``)."""

    def __init__(self, lanes: Sequence[LaneLimit], consumer: Any,
                 own: Mapping[str, str] | None = None, max_prefill_tokens: int = 0) -> None:
        self.lanes = list(lanes)
        self.consumer = consumer
        self._names = {l.name for l in self.lanes}
        #: lane -> this worker's own queue of it (prefix affinity; empty: off)
        self.own = dict(own or {})
        self._queues = self._names | set(self.own.values())
        self._lock = threading.Lock()
        self._jobs: dict[str, str] = {}  # task id -> lane, from receipt to end
        self._over: set[str] = set()
        #: task id -> (lane, prompt tokens to prefill), from receipt to its first token (or end)
        self._prefill: dict[str, tuple[str, int]] = {}
        self.max_prefill_tokens = max_prefill_tokens
        self._consumer_thread: int | None = None

    def running(self) -> Counter[str]:
        with self._lock:
            return Counter(self._jobs.values())

    def prefilling(self) -> Counter[str]:
        """Per lane, the prompt tokens its jobs not yet at their first token have to prefill."""
        with self._lock:
            return self._prefilling()

    def _prefilling(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for lane, tokens in self._prefill.values():
            out[lane] += tokens
        return out

    def received(self, task_id: str, task_name: str, prefill_tokens: int = 0) -> None:
        """Celery received a task message (consumer thread): count it, and stop consuming a lane
        that reached its limit with it (or its lane and those after it, once `prefill_tokens` of
        it reach ``max_prefill_tokens``)."""
        lane = lane_of_task(task_name)
        if lane not in self._names:
            return
        self._consumer_thread = threading.get_ident()
        with self._lock:
            if task_id in self._jobs:
                return
            if lane not in consumable(self.lanes, Counter(self._jobs.values()),
                                      self._prefilling(), self.max_prefill_tokens):
                self._over.add(task_id)
            elif prefill_tokens > 0:
                self._prefill[task_id] = (lane, prefill_tokens)
            self._jobs[task_id] = lane
        self.apply()

    def over(self, task_id: str) -> bool:
        """Whether this task's message arrived past its lane's limit (its task gives it back)."""
        with self._lock:
            return task_id in self._over

    def prefilled(self, task_id: str) -> None:
        """A counted task's first token came (any thread, idempotent): its prefill is done."""
        with self._lock:
            if self._prefill.pop(task_id, None) is None:
                return
        self._apply_soon()

    def ended(self, task_id: str) -> None:
        """A counted task ended or was revoked (any thread, idempotent): its lane may open."""
        with self._lock:
            self._prefill.pop(task_id, None)
            if self._jobs.pop(task_id, None) is None:
                return
            self._over.discard(task_id)
        self._apply_soon()

    def _apply_soon(self) -> None:
        if threading.get_ident() == self._consumer_thread:
            self.apply()
        else:
            self.consumer.call_soon(self.apply)

    def apply(self) -> None:
        """Make the consumed queues what the rule allows now, in lane order (consumer thread)."""
        with self._lock:
            running, prefill = Counter(self._jobs.values()), self._prefilling()
        want = [q for lane in consumable(self.lanes, running, prefill, self.max_prefill_tokens)
                for q in ([self.own[lane]] if lane in self.own else []) + [lane]]
        have = [q.name for q in self.consumer.task_consumer.queues if q.name in self._queues]
        if have == want:
            return
        # kombu consumes queues in the order they were added: to open a lane ahead of others
        # that are consumed, those go and come back after it
        keep = _common_prefix(have, want)
        for name in have[len(keep):]:
            self.consumer.cancel_task_queue(name)
        for name in want[len(keep):]:
            self.consumer.add_task_queue(name)
        log.debug("consuming %s (running %s)", ",".join(want) or "nothing", dict(self.running()))


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> list[str]:
    out = []
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        out.append(x)
    return out

