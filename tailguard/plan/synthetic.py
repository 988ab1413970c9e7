"""Synthetic requests both tools make, pure: the article's prompts, random text of a given
length in tokens, and seeded Poisson arrivals, one random stream per class.

`tailguard bench` sends them (tailguard/bench/workload.py builds its workloads from these);
the planner profiles an engine with them (``profile``) and replays a bench run's arrivals
(``validate``). Owned here, where both may import it: the bench may import the planner,
never the other way round.
"""

from __future__ import annotations

import random
from collections.abc import Callable

#: The article's prompts (also the demo model's, so its tokenizer has merges for them).
SEED_PROMPTS = (
    "解释什么是Transformer",
    "讲一下深度学习的发展史",
    "写一篇1000字的人工智能文章",
    "解释KV Cache",
)

#: Filler for long prompts. Each long prompt is a fresh random draw, so no two share
#: a prefix and vLLM's prefix cache cannot make their prefill free.
_FILLER = (
    "the transformer model reads a long document about attention layers and key value caches "
    "while a scheduler decides which request runs next on the engine and how many tokens fit "
    "in one batch so that short questions are answered quickly and long reports still finish "
    "a queue holds work until a worker is free and every lane has its own policy for deadlines "
    "深度学习 人工智能 大语言模型 连续批处理 尾部延迟 注意力机制 推理引擎 吞吐量"
).split()

#: Rough characters per token, used only when no tokenizer is given.
CHARS_PER_TOKEN = 4.0


def poisson_arrivals(rate: float, duration_s: float, rng: random.Random,
                     max_count: int | None = None) -> list[float]:
    """Arrival offsets of a Poisson process of `rate` per second in [0, duration_s)."""
    if rate < 0 or duration_s < 0:
        raise ValueError("rate and duration must be >= 0")
    out: list[float] = []
    if rate == 0:
        return out
    t = rng.expovariate(rate)
    while t < duration_s and (max_count is None or len(out) < max_count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def class_stream(seed: int, name: str) -> random.Random:
    """An independent, reproducible random stream per class."""
    return random.Random(f"tailguard-bench/{seed}/{name}")


def long_prompt(target_tokens: int, rng: random.Random,
                count_tokens: Callable[[str], int] | None = None) -> str:
    """A random text of about `target_tokens` tokens (exact to a few with `count_tokens`)."""
    if target_tokens <= 0:
        raise ValueError("target_tokens must be > 0")

    def words(n: int) -> list[str]:
        return [rng.choice(_FILLER) for _ in range(n)]

    mean_chars = sum(len(w) + 1 for w in _FILLER) / len(_FILLER)
    text = words(max(1, round(target_tokens * CHARS_PER_TOKEN / mean_chars)))
    if count_tokens is None:
        return " ".join(text)
    for _ in range(8):  # converge: scale by the measured ratio, then trim or pad
        n = count_tokens(" ".join(text))
        if abs(n - target_tokens) <= 2:
            break
        want = max(1, round(len(text) * target_tokens / max(n, 1)))
        if want == len(text):
            want += 1 if n < target_tokens else -1
        text = text[:want] if want < len(text) else text + words(want - len(text))
        if len(text) == 1 and n > target_tokens:
            break
    return " ".join(text)


#: Words tried, in order, to add exactly one token at the end of a prompt (byte-level BPE and
#: SentencePiece vocabularies both have these as single tokens after a space).
_ONE_TOKEN_WORDS = ("a", "I", "x", "0", "1", "2", "the", "of", "and", ".")


def exact_prompt(target_tokens: int, rng: random.Random,
                 count_tokens: Callable[[str], int]) -> tuple[str, int]:
    """A random text of `target_tokens` tokens as `count_tokens` counts them, and its count.

    `long_prompt` gets within a few tokens; then whole words come off the end until the
    count is at most the target, and one-token words go on until it is the target. A
    tokenizer where no word adds exactly one token leaves it short: the count says so."""
    words = long_prompt(target_tokens, rng, count_tokens).split()
    n = count_tokens(" ".join(words))
    while n > target_tokens and len(words) > 1:
        words.pop()
        n = count_tokens(" ".join(words))
    while n < target_tokens:
        for word in _ONE_TOKEN_WORDS:
            if count_tokens(" ".join([*words, word])) == n + 1:
                words.append(word)
                n += 1
                break
        else:
            break
    return " ".join(words), n
