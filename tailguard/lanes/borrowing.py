"""Work-conserving lanes: when an idle engine may take another lane's work, and what it gives back.

Pure policy (no Redis, no Celery, no engine), so the decisions are table-tested;
the worker that acts on them reads its engine's load and its queues, asks here,
and carries the answer out. The pattern is *reserved floor + capped
borrowing + reclaim*:

* **borrow** only while the engine's own lanes have nothing queued, at least
  ``headroom`` (R) of its ``max_num_seqs`` slots would stay free after taking one
  more, and fewer than ``max_borrowed`` (B) borrowed requests run. Borrowed
  requests run at a lower vLLM priority (``scheduling_policy="priority"``), so
  the engine's own work is still scheduled first within a step.
* **reclaim** when own work arrives and the free slots drop below R: abort the
  youngest borrowed requests (least output to lose) until R slots are free again,
  and put them back on their lane's queue. vLLM preempts only on KV-cache
  exhaustion, not at ``max_num_seqs``, which is why the headroom is kept at all.

Where borrowed requests run (``engine``): ``"idle"``, in a second engine on the same cores
whose processes run at the kernel's idle CPU priority (``SCHED_IDLE``), so they only get
cycles the own engine leaves unused; or ``"own"``, in the worker's own engine, at a lower
vLLM priority. On a CPU host the own engine's steps are compute-bound: a borrowed long
request in them slowed every short one (docs/cpu-hosts.md, "Borrowing on a CPU host"), while
an idle-priority engine yields the core to them at once. On a GPU the CPU priority means
nothing to the device and two engines would split its memory, so ``"idle"`` is refused
there; ``"own"`` is never measured there either. ``"auto"``, the default, is ``"idle"`` on a
CPU host and no borrowing at all on a GPU: isolation first (`resolve`). Borrowed requests
still count against the own engine's slots in the policy, so R and B mean the same in both.

What a reclaimed request's client sees (the contract the worker implements): its
stream pauses, then continues where it stopped. The requeued job carries the text
generated so far; the engine that takes it next prefills prompt + that text and
generates only the rest of ``max_tokens``. Nothing already streamed is repeated
or lost; the cost is the repeated prefill, counted as wasted tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tailguard.errors import ConfigError


@dataclass(frozen=True)
class BorrowPolicy:
    """What one worker may borrow: from `lanes`, keeping R slots free, at most B at once."""

    lanes: tuple[str, ...]  # other lanes' queues it may consume when idle, in order
    headroom: int = 2  # R: slots kept free for the engine's own lanes
    max_borrowed: int = 4  # B: borrowed requests running at once
    engine: str = "auto"  # where they run: one of ENGINES

    def __post_init__(self) -> None:
        if self.headroom < 0 or self.max_borrowed < 0:
            raise ValueError("headroom and max_borrowed must be >= 0")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")


#: where borrowed requests run: the worker's own engine, or one at idle CPU priority;
#: "auto" is "idle" on a CPU host and nothing borrowed on a GPU (`resolve`)
ENGINES = ("auto", "own", "idle")


def engine_for(policy: BorrowPolicy, device: str) -> str:
    """Where `policy`'s borrowed requests would run on a `device` ("cpu" or "cuda") host:
    "auto" as the CPU host's "idle", else the GPU's "own". Workers borrow as `resolve`
    says, which on a GPU borrows nothing for "auto"."""
    if policy.engine != "auto":
        return policy.engine
    return "idle" if device == "cpu" else "own"


def resolve(policy: BorrowPolicy, device: str, worker: str = "") -> BorrowPolicy:
    """What a worker on a `device` ("cpu" or "cuda") host borrows: `policy` with its engine
    resolved; on a GPU "auto" borrows nothing (the short engine keeps its device to itself)
    and "idle" is refused (ConfigError): it would be a second engine on the same GPU that the
    idle CPU priority does not hold back."""
    if not policy.lanes:
        return policy
    if device != "cpu" and policy.engine == "idle":
        raise ConfigError(
            f"worker {worker or '?'}: borrow_engine = \"idle\" runs borrowed jobs in a second "
            "engine at idle CPU priority, which holds nothing back on a GPU (and the two "
            'engines would split its memory): use "own" (measured on a CPU host only) or '
            '"auto" (no borrowing on a GPU)', field="borrow_engine")
    if device != "cpu" and policy.engine == "auto":
        return replace(policy, lanes=(), engine="own")
    return replace(policy, engine=engine_for(policy, device))


@dataclass(frozen=True)
class EngineLoad:
    """An engine's slots right now, as the worker sees them."""

    slots: int  # max_num_seqs
    own_running: int  # requests of its own lanes in the engine
    borrowed_running: int  # borrowed requests in the engine
    own_queued: int  # messages waiting on its own lanes' queues

    @property
    def free(self) -> int:
        return self.slots - self.own_running - self.borrowed_running


def may_borrow(policy: BorrowPolicy, load: EngineLoad) -> bool:
    """Whether the worker may take one more request from a lane it borrows from, now."""
    return (bool(policy.lanes) and load.own_queued == 0
            and load.borrowed_running < policy.max_borrowed
            and load.free - 1 >= policy.headroom)


def reclaim_count(policy: BorrowPolicy, load: EngineLoad, arriving: int = 0) -> int:
    """How many borrowed requests to abort so that, with `arriving` own requests admitted,
    at least R slots are free again (never more than are borrowed)."""
    free_after = load.free - arriving
    return max(0, min(load.borrowed_running, policy.headroom - free_after))


def youngest(borrowed: Sequence[tuple[str, float]], n: int) -> list[str]:
    """The `n` borrowed requests to reclaim, `(job_id, started_at)` each: the latest started
    first, since they have the least output to redo the prefill for."""
    return [job for job, _ in sorted(borrowed, key=lambda b: (-b[1], b[0]))[:max(0, n)]]


@dataclass
class BorrowStats:
    """What a borrowing worker did, for /metrics and `celery inspect engine_stats`."""

    borrowed: Counter = field(default_factory=Counter)  # lane -> jobs taken from its queue
    running: int = 0  # borrowed jobs on the engine now
    reclaimed: int = 0  # borrowed jobs given back to their lane's queue
    wasted_tokens: int = 0  # the KV cache reclaims threw away (prefilled again later)

    def to_dict(self) -> dict[str, Any]:
        return {"borrowed": dict(self.borrowed), "borrowed_running": self.running,
                "reclaimed": self.reclaimed, "reclaim_wasted_tokens": self.wasted_tokens}
