"""An engine's prefix cache as the simulator sees it: an LRU of prefixes, bounded in tokens. Pure.

vLLM keeps the KV blocks of the prompts (and outputs) it computed, and a new request whose
prompt begins with blocks it still holds skips their prefill. Here a prefix is a name (a
shared system prompt, a conversation, a document) with a length in tokens; an engine keeps the
prefixes it served, least recently used first out once their tokens pass its capacity (its KV
cache in tokens). A request's prompt is a chain of prefixes, shortest first (the system prompt,
then the conversation so far, which contains it); its hit is the longest of them the cache
holds, up to the length it holds. Not modelled: block granularity (vLLM caches whole blocks
of 16 tokens), the running requests' own KV taking room from the cache, and a prefix held
under two names (a conversation's entry counts its system prompt again).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

#: a prefix: (its name, its tokens)
Prefix = tuple[str, int]


class PrefixCache:
    """The prefixes one engine holds, by name, least recently used first."""

    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens < 0:
            raise ValueError("a prefix cache's capacity is >= 0 tokens")
        self.capacity = capacity_tokens
        self.entries: OrderedDict[str, int] = OrderedDict()
        self.tokens = 0

    def lookup(self, chain: Sequence[Prefix]) -> int:
        """The tokens of `chain` (shortest first) the cache holds: the longest prefix of it
        held, up to the length held. Every prefix found becomes the most recently used."""
        best = 0
        for name, tokens in chain:
            held = self.entries.get(name)
            if held is not None:
                self.entries.move_to_end(name)
                best = max(best, min(held, tokens))
        return best

    def put(self, name: str, tokens: int) -> None:
        """Hold `name` at `tokens` (never shorter than held already), the most recently used;
        the least recently used go while the cache is over its capacity."""
        old = self.entries.get(name, 0)
        if tokens > old:
            self.entries[name] = tokens
            self.tokens += tokens - old
        if name in self.entries:
            self.entries.move_to_end(name)
        while self.tokens > self.capacity and self.entries:
            _, gone = self.entries.popitem(last=False)
            self.tokens -= gone

    def __contains__(self, name: str) -> bool:
        return name in self.entries
