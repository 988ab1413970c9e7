"""Prefix affinity: which engine a request is offered to first. Pure rule, no I/O.

vLLM's prefix cache skips the prefill of the prompt blocks an engine has computed before, but
only on that engine: a conversation's next turn, or a question over a document, is cheap where
its prefix was served last and a full prefill anywhere else (with N engines and no affinity,
about 1 time in N on the right one). The rule:

* ``holders``: the engines an index of recently served prefixes names for the longest of the
  request's prefixes it knows (a conversation so far before a shared system prompt): the last
  ``Affinity.holders`` engines that served it (``remember``), so a prefix every request shares
  (a document all questions are about) has several homes;
* ``offer_to``: the request is offered first to the one of them with the most free slots
  among those that may serve the request's lane and have room for it (its load, requests
  running and offered to it, under its limit for the lane) within ``Affinity.max_extra`` of
  the least loaded engine's that may serve the lane. Otherwise no offer: any free engine takes it from
  its lane's queue, as without affinity (load beats affinity, as vllm-router's ``cache_aware``
  policy balances once the busiest replica has ``--balance-abs-threshold`` more requests than
  the idlest). A full holder is never waited for: a request parked behind it would wait while
  another engine has a free slot, which costs more than the prefill the cache would skip. The
  second bound is relative: a holder with free slots is still passed over while other engines
  are idler, or a hot prefix (one document every request asks about) would pile its requests
  onto one engine's batch while the others idle;
* ``offer_wait_s``: an offer waits at most ``Affinity.max_wait_s``, and no longer than its
  lane's wait promise; past it the request goes to its lane's queue for any engine.
  An offer goes only to an engine with room, so the wait is the engine's pick-up, not a queue;
* ``cached_tokens``: the prompt tokens a live holder has in its prefix cache, which the
  request's cost leaves out when its lane is chosen (a conversation's next turn is classed by
  what its engine must compute: its new tokens and its output, not its whole history).

The simulator (tailguard/plan/sim.py) runs this rule, and so do the API and the workers when
TAILGUARD_PREFIX_AFFINITY is on (tailguard/jobs/prefix_index.py keeps the index in Redis).

A prefix is named as vLLM's prefix cache names its blocks (``block_hashes``): the hash of block j
is the hash of block j-1's and block j's tokens, for full blocks only, so two prompts share a
name exactly where they share every token up to it. The index keeps only some depths
(``indexed_depths``) to bound Redis work per request.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: blocks indexed at every depth up to this many; deeper, at powers of two only
DENSE_BLOCKS = 8


@dataclass(frozen=True)
class Affinity:
    """The rule's bounds: how much more loaded than the least loaded engine a holder may be, in
    requests, and how long an offer waits at most."""

    max_extra: int = 4
    max_wait_s: float = 0.5
    holders: int = 4  # engines remembered per prefix

    def __post_init__(self) -> None:
        if self.max_extra < 0 or self.max_wait_s < 0 or self.holders < 1:
            raise ValueError("affinity: max_extra and max_wait_s >= 0, holders >= 1")


def holders(prefixes: Sequence[str], index: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """The engines `index` (prefix -> the engines that served it last, the latest last) names
    for the longest of `prefixes` (shortest first) it holds; none when it holds none."""
    for key in reversed(prefixes):
        engines = index.get(key)
        if engines:
            return tuple(engines)
    return ()


def remember(engines: Sequence[str], engine: str, policy: Affinity) -> tuple[str, ...]:
    """A prefix's index entry once `engine` has served it: `engine` the latest, the last
    `policy.holders` kept."""
    kept = [e for e in engines if e != engine] + [engine]
    return tuple(kept[-policy.holders:])


def offer_to(candidates: Sequence[str], load: Mapping[str, int], slots: Mapping[str, int],
             policy: Affinity) -> str | None:
    """The engine to offer a request to first: of `candidates` (its prefix's holders) among the
    engines of `load` (those that may serve the request's lane, each with its requests running
    and offered to it), those whose load is under its `slots` (its limit for the lane) and
    within `policy.max_extra` of the least of all; of them the one with the most free slots
    (ties: the latest holder); else None. Free slots, not load alone: an engine whose limit is
    cut (one that shares its cores with the front end) is the slower one, and is chosen only
    once the other holders are that much busier."""
    least = min(load.values(), default=0)
    roomy = [e for e in reversed(candidates)
             if e in load and load[e] < slots.get(e, 0) and load[e] <= least + policy.max_extra]
    return max(roomy, key=lambda e: slots[e] - load[e], default=None)


def offer_wait_s(policy: Affinity, lane_wait_s: float | None) -> float:
    """How long an offer of a request of a lane with wait promise `lane_wait_s` (None: none)
    waits for its engine at most."""
    return policy.max_wait_s if lane_wait_s is None else min(policy.max_wait_s, lane_wait_s)


def cached_tokens(prefixes: Sequence[str], depths: Sequence[int], held: Sequence[str],
                  block_size: int) -> int:
    """The prompt tokens in some live engine's prefix cache: the longest of `prefixes` (with
    their `depths` in blocks, as ``prefix_depths`` gives them) that is in `held`, in tokens."""
    known = set(held)
    for key, depth in zip(reversed(prefixes), reversed(depths), strict=True):
        if key in known:
            return depth * block_size
    return 0


def engine_block_tokens(engine: Mapping[str, object], device: str) -> int:
    """Tokens per prefix-cache block of the engines: the lanes file's engine ``block_size`` if
    set, else vLLM's default for the device (128 on a CPU, 16 on a GPU: docs/benchmarks.md)."""
    size = engine.get("block_size")
    if isinstance(size, int) and size > 0:
        return size
    return 128 if device == "cpu" else 16


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[str]:
    """The chained hash of each full block of `token_ids` (vLLM's prefix-cache rule: a block's
    hash covers its parent's hash and its own tokens; a partial last block is never cached)."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    parent = b""
    out = []
    for end in range(block_size, len(token_ids) + 1, block_size):
        block = array("q", token_ids[end - block_size:end]).tobytes()
        parent = hashlib.blake2b(parent + block, digest_size=12).digest()
        out.append(parent.hex())
    return out


def indexed_depths(blocks: int, dense: int = DENSE_BLOCKS) -> list[int]:
    """Which prefix depths (in blocks, 1-based, ascending) of a prompt with `blocks` full blocks
    the index keeps: every one up to `dense`, then the powers of two, then the whole prompt (a
    conversation's next turn repeats all of this one)."""
    depths = list(range(1, min(blocks, dense) + 1))
    power = 2 * dense
    while power < blocks:
        depths.append(power)
        power *= 2
    if blocks > dense:
        depths.append(blocks)
    return depths


def prefix_depths(token_ids: Sequence[int], block_size: int) -> list[tuple[str, int]]:
    """A prompt's indexed prefixes (the names ``holders`` reads), shortest first, each with its
    depth in blocks."""
    hashes = block_hashes(token_ids, block_size)
    return [(hashes[d - 1], d) for d in indexed_depths(len(hashes))]


@dataclass(frozen=True)
class Holdings:
    """What the index holds for one prompt, read at submit: its indexed prefixes (shortest
    first) with their depths in blocks, each lane's live engines with their load and limit, and
    each prefix's live holders (oldest first)."""

    prefixes: tuple[str, ...]
    depths: tuple[int, ...]
    engines: Mapping[str, Mapping[str, tuple[int, int]]]  # lane -> engine -> (load, slots)
    held: Mapping[str, tuple[str, ...]]

    def offer_to(self, lane: str, policy: Affinity) -> str | None:
        """The engine of `lane` to offer the request to first (``offer_to``), or None."""
        engines = self.engines.get(lane, {})
        index = {p: tuple(e for e in held if e in engines) for p, held in self.held.items()}
        return offer_to(holders(self.prefixes, index), {e: n for e, (n, _) in engines.items()},
                        {e: s for e, (_, s) in engines.items()}, policy)

    def cached_tokens(self, block_size: int) -> int:
        """The prompt tokens some live engine holds (``cached_tokens``)."""
        return cached_tokens(self.prefixes, self.depths,
                             [p for p, held in self.held.items() if held], block_size)
