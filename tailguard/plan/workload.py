"""What the simulated fleet is asked to do: classes with Poisson arrivals and length distributions.

Three sources, one shape (a list of ``ClassLoad``), and two workloads whose requests share
prefixes, for the prefix cache (`chat_sessions`, `shared_doc_arrivals`; the bench's ``chat``
and ``shared-doc`` in tokens, tailguard/bench/sessions.py):

* flags: ``NAME:RATE:PROMPT_TOKENS:OUTPUT_TOKENS[:PRIORITY]``, fixed lengths;
* a JSONL trace in the bench's format (``{"prompt", "max_tokens", "class"?,
  "arrival_s"?}``, plus ``prompt_tokens`` and ``priority`` if known): the lengths are
  the trace's own; a prompt without ``prompt_tokens`` counts ``len(prompt) /
  CHARS_PER_TOKEN`` tokens (the bench's estimate); the rate is the trace's (with
  ``arrival_s``) or the given total rate split by the classes' shares;
* ``tailguard stats --json``: one class per lane, its rate the lane's count over the
  window, its lengths from the P50/P95/P99/max of the lane's prompt and output tokens.
"""

from __future__ import annotations

import bisect
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailguard.lanes.table import PRIORITY_CLASSES, LaneTable
from tailguard.plan.prefix_cache import Prefix
from tailguard.plan.synthetic import CHARS_PER_TOKEN, poisson_arrivals


@dataclass(frozen=True)
class Lengths:
    """A length distribution as points of its inverse CDF, (quantile, tokens), linear between."""

    points: tuple[tuple[float, float], ...]

    @classmethod
    def fixed(cls, tokens: int) -> Lengths:
        return cls(((0.0, float(tokens)), (1.0, float(tokens))))

    @classmethod
    def from_values(cls, values: Sequence[float]) -> Lengths:
        """The empirical distribution of `values`."""
        vs = sorted(values)
        if not vs:
            raise ValueError("no values")
        if len(vs) == 1:
            return cls.fixed(int(vs[0]))
        return cls(tuple((i / (len(vs) - 1), float(v)) for i, v in enumerate(vs)))

    def sample(self, rng: random.Random) -> int:
        u = rng.random()
        qs = [q for q, _ in self.points]
        i = min(max(bisect.bisect_right(qs, u), 1), len(qs) - 1)
        (q0, v0), (q1, v1) = self.points[i - 1], self.points[i]
        v = v0 if q1 == q0 else v0 + (v1 - v0) * (u - q0) / (q1 - q0)
        return max(1, round(v))

    @property
    def mean(self) -> float:
        """Mean of the piecewise-linear inverse CDF."""
        return sum((q1 - q0) * (v0 + v1) / 2
                   for (q0, v0), (q1, v1) in zip(self.points, self.points[1:]))


@dataclass(frozen=True)
class ClassLoad:
    name: str
    rate: float  # requests per second, Poisson
    prompt: Lengths  # prompt tokens
    output: Lengths  # max_tokens asked (outputs run to it: ignore_eos, as the bench does)
    priority: str = "interactive"

    def scaled(self, factor: float) -> ClassLoad:
        return ClassLoad(self.name, self.rate * factor, self.prompt, self.output, self.priority)


def parse_class(text: str) -> ClassLoad:
    """``NAME:RATE:PROMPT_TOKENS:OUTPUT_TOKENS[:PRIORITY]``, e.g. ``long:0.5:2000:512``."""
    parts = text.split(":")
    if len(parts) not in (4, 5):
        raise ValueError(f"--class wants NAME:RATE:PROMPT_TOKENS:OUTPUT_TOKENS[:PRIORITY], got {text!r}")
    name, rate, prompt, output = parts[:4]
    priority = parts[4] if len(parts) == 5 else "interactive"
    if priority not in PRIORITY_CLASSES:
        raise ValueError(f"priority must be one of {PRIORITY_CLASSES}, got {priority!r}")
    try:
        r, p, o = float(rate), int(prompt), int(output)
    except ValueError:
        raise ValueError(f"--class {text!r}: RATE is a number, the token counts are integers") from None
    if r < 0 or p < 1 or o < 1:
        raise ValueError(f"--class {text!r}: rate >= 0, token counts >= 1")
    return ClassLoad(name, r, Lengths.fixed(p), Lengths.fixed(o), priority)


def from_trace(lines: Iterable[str], rate: float | None = None) -> list[ClassLoad]:
    """Classes of a JSONL trace (see the module docstring)."""
    recs = [json.loads(line) for line in lines if line.strip()]
    if not recs:
        raise ValueError("the trace has no requests")
    by_class: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        by_class.setdefault(r.get("class", "short"), []).append(r)
    timed = all("arrival_s" in r for r in recs)
    if timed:
        times = [r["arrival_s"] for r in recs]
        span = max(times) - min(times)
        if span <= 0:
            raise ValueError("the trace's arrival_s span no time: give --rate")
    elif rate is None:
        raise ValueError("the trace has no arrival_s: give --rate (requests/s in total)")
    out = []
    for name, rs in by_class.items():
        class_rate = len(rs) / span if timed else rate * len(rs) / len(recs)
        prompts = [r.get("prompt_tokens") or max(1, round(len(r["prompt"]) / CHARS_PER_TOKEN))
                   for r in rs]
        out.append(ClassLoad(name, class_rate, Lengths.from_values(prompts),
                             Lengths.from_values([r["max_tokens"] for r in rs]),
                             rs[0].get("priority", "interactive")))
    return out


def from_stats(stats: dict[str, Any], table: LaneTable) -> list[ClassLoad]:
    """Classes of ``tailguard stats --json`` output: one per lane that saw requests.

    Below the median the lengths are taken as the median: the summary has no lower points.
    """
    span = stats["window"]["end"] - stats["window"]["start"]
    out = []
    for lane, s in stats["lanes"].items():
        if not s.get("count"):
            continue

        def dist(m: dict[str, Any]) -> Lengths:
            pts = [(0.0, m["p50"]), (0.5, m["p50"]), (0.95, m["p95"]), (0.99, m["p99"]),
                   (1.0, m["max"])]
            return Lengths(tuple((q, float(v)) for q, v in pts))

        priority = table[lane].priority if lane in table.names else "interactive"
        out.append(ClassLoad(lane, s["count"] / span, dist(s["prompt_tokens"]),
                             dist(s["output_tokens"]), priority))
    if not out:
        raise ValueError("the stats window has no finished requests")
    return out


def load_classes(path: str | Path, table: LaneTable, rate: float | None = None) -> list[ClassLoad]:
    """A trace (.jsonl) or a stats JSON file, told apart by their content."""
    text = Path(path).read_text()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "lanes" in doc and "window" in doc:
        return from_stats(doc, table)
    return from_trace(text.splitlines(), rate)


CHAT, SHARED_DOC = "chat", "shared-doc"


@dataclass(frozen=True)
class ChatSession:
    """A conversation: its turns as (user tokens, max_tokens, think time before it in s)."""

    arrival_s: float
    key: str  # its name in a prefix cache
    system: Prefix  # the system prompt every session shares: (name, tokens)
    turns: tuple[tuple[int, int, float], ...]
    cls: str = CHAT


@dataclass(frozen=True)
class PrefixedArrival:
    """A request whose prompt begins with named prefixes (shortest first)."""

    t: float
    cls: str
    prompt: int
    max_tokens: int
    prefix: tuple[Prefix, ...]
    keep: str | None = None


def chat_sessions(rate: float, duration_s: float, seed: int = 0, *,
                  turns: tuple[int, int] = (3, 8), think_s: float = 3.0,
                  system_tokens: int = 300, user_tokens: int = 40,
                  answer_tokens: int = 64) -> list[ChatSession]:
    """Sessions at `rate` requests/s offered (sessions at `rate` / the mean turns), each of
    `turns` turns (uniform), think times exponential of mean `think_s`: the bench's ``chat``."""
    lo, hi = turns
    if rate <= 0 or not 1 <= lo <= hi or think_s < 0:
        raise ValueError("chat: rate > 0, 1 <= turns low <= high, think time >= 0")
    rng = random.Random(f"tailguard-plan/{seed}/{CHAT}")
    out = []
    for i, t in enumerate(poisson_arrivals(rate / ((lo + hi) / 2), duration_s, rng)):
        n = rng.randint(lo, hi)
        out.append(ChatSession(t, f"{CHAT}/{i}", (f"{CHAT}/system", system_tokens), tuple(
            (user_tokens, answer_tokens, 0.0 if k == 0 or not think_s
             else rng.expovariate(1 / think_s)) for k in range(n))))
    return out


def shared_doc_arrivals(rate: float, duration_s: float, seed: int = 0, *, docs: int = 3,
                        doc_tokens: int = 1200, question_tokens: int = 40,
                        answer_tokens: int = 64) -> list[PrefixedArrival]:
    """Questions over `docs` documents (uniform) at `rate` requests/s: the bench's ``shared-doc``."""
    if rate <= 0 or docs < 1:
        raise ValueError("shared-doc: rate > 0, docs >= 1")
    rng = random.Random(f"tailguard-plan/{seed}/{SHARED_DOC}")
    return [PrefixedArrival(t, SHARED_DOC, doc_tokens + question_tokens, answer_tokens,
                            ((f"{SHARED_DOC}/{rng.randrange(docs)}", doc_tokens),))
            for t in poisson_arrivals(rate, duration_s, rng)]
