"""Fair share of a lane by API key: virtual token counters (VTC; Sheng et al., "Fairness in
Serving Large Language Models", OSDI 2024).

Pure policy, no I/O. Each key has a counter of the service the lane gave it: the cost tokens
(prompt + max_tokens, as placement counts them) of its jobs dispatched, divided by the key's
weight. The next job dispatched is the oldest one of the backlogged key with the least counter.
A key that had nothing queued is lifted, when its next job arrives, to the least counter of the
keys that have work queued (to the counter of the key served last when none has), never
lowered: credit is not saved up while idle to starve the others later. The order only chooses
whom to serve next, so the lane never idles while any key has work, and a key alone gets all of
it. Guarantee (the paper's Theorem 4.4, weighted): over any interval in which two keys are both
backlogged, their service divided by their weights differs by at most twice the largest
cost / weight of one request.

When a lane must refuse (admission), it refuses the keys above their weighted share of what
the lane may hold first (`fair_share`, tailguard/lanes/admission.py's ``admit_fairly``), unless
counter order serves the key next (`served_next`);
`work_ahead` estimates what a key's new request waits for in this order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

#: a key the weights do not name counts as one
DEFAULT_WEIGHT = 1.0


def weight_of(key: str, weights: Mapping[str, float]) -> float:
    return weights.get(key, DEFAULT_WEIGHT)


@dataclass
class VirtualTokenCounters:
    """The keys' counters on one lane (weighted service so far, in cost tokens)."""

    weights: Mapping[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    last_served: str | None = None

    def value(self, key: str) -> float:
        return self.counters.get(key, 0.0)

    def lift(self, key: str, backlogged: Iterable[str]) -> None:
        """`key` had nothing queued and has a job again: raise its counter to the least of the
        backlogged keys' (the last served key's when none is backlogged), never lower it."""
        others = [self.value(k) for k in backlogged if k != key]
        if others:
            floor = min(others)
        elif self.last_served is not None and self.last_served != key:
            floor = self.value(self.last_served)
        else:
            return
        self.counters[key] = max(self.value(key), floor)

    def least(self, backlogged: Iterable[str]) -> str | None:
        """The backlogged key to serve next: the least counter (ties: the name, to be
        deterministic); None when no key is backlogged."""
        return min(backlogged, key=lambda k: (self.value(k), k), default=None)

    def charge(self, key: str, cost: int) -> None:
        """A job of `cost` tokens of `key` was dispatched."""
        self.counters[key] = self.value(key) + cost / weight_of(key, self.weights)
        self.last_served = key


class FairQueue(Generic[T]):
    """One lane's queued jobs, a FIFO per key, dispatched in virtual-token-counter order."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self.counters = VirtualTokenCounters(weights=dict(weights or {}))
        self._queues: dict[str, deque[tuple[T, int]]] = {}

    def push(self, key: str, item: T, cost: int) -> None:
        if not self._queues.get(key):
            self.counters.lift(key, self.backlogged())
        self._queues.setdefault(key, deque()).append((item, cost))

    def pop(self) -> tuple[str, T, int] | None:
        """The next job to dispatch (its key, item and cost), charged to its key; None when
        nothing is queued."""
        key = self.counters.least(self.backlogged())
        if key is None:
            return None
        item, cost = self._queues[key].popleft()
        self.counters.charge(key, cost)
        return key, item, cost

    def queues(self) -> list[deque[tuple[T, int]]]:
        """Each key's queued (item, cost), oldest first."""
        return list(self._queues.values())

    def backlogged(self) -> list[str]:
        return [k for k, q in self._queues.items() if q]

    def backlog_tokens(self) -> dict[str, int]:
        """Each backlogged key's queued cost tokens."""
        return {k: sum(c for _, c in q) for k, q in self._queues.items() if q}

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())


def fair_share(key: str, capacity: float, backlogs: Mapping[str, int],
               weights: Mapping[str, float]) -> float:
    """`key`'s weighted share of `capacity` (cost tokens a lane may hold) among the keys with work
    queued (`backlogs`: cost tokens per key) and itself."""
    active = {k for k, b in backlogs.items() if b > 0} | {key}
    return capacity * weight_of(key, weights) / sum(weight_of(k, weights) for k in active)


def served_next(key: str, backlogs: Mapping[str, int], weights: Mapping[str, float],
                counters: Mapping[str, float]) -> bool:
    """Whether counter order dispatches a new job of `key` before any more of the other
    backlogged keys' work: its counter, once charged for what it already has queued, is still
    below theirs (a key with nothing queued is lifted to their least first: a tie, which goes by
    name, so not surely next). A key served less than the others so far, by more than what it
    has queued, goes next: refusing it as over its share would refuse the key the lane serves
    next."""
    others = [counters.get(k, 0.0) for k, b in backlogs.items() if k != key and b > 0]
    if not others:
        return False
    own = max(0, backlogs.get(key, 0))
    mine = counters.get(key, 0.0) if own else max(counters.get(key, 0.0), min(others))
    return mine + own / weight_of(key, weights) < min(others)


def work_ahead(key: str, backlogs: Mapping[str, int], weights: Mapping[str, float]) -> float:
    """The cost tokens dispatched before a new job of `key` in counter order, estimated with the
    backlogged keys' counters level (a returning key is lifted to the least): its own queued
    work, and of each other key's as much as its weight gets while that is served."""
    own = max(0, backlogs.get(key, 0))
    per_weight = own / weight_of(key, weights)
    return own + sum(min(b, per_weight * weight_of(k, weights))
                     for k, b in backlogs.items() if k != key and b > 0)
