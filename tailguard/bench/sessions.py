"""Workloads whose requests share prefixes: conversations and questions over documents. Pure.

* ``chat``: sessions of a few turns (uniform in ``turns``). Every session starts with the same
  system prompt; each turn resends the whole conversation (the system prompt, the previous
  user turns and the previous answers *as the server returned them*), so turn k+1's prompt
  begins with turn k's prompt and answer, character for character: what vLLM's prefix cache
  can reuse, on the engine that served turn k. A turn is sent only once the previous answer
  has arrived, after the user's think time (exponential, mean ``think_s``). Sessions arrive
  open-loop (Poisson) at ``rate / mean turns`` per second, so ``rate`` is requests/s offered
  over the run, as for every other workload (the turns of one session come later, each
  after its answer and think time, so the rate at any instant trails it while sessions start).
* ``shared-doc``: many questions over a few long documents: each request is one of ``docs``
  documents (chosen uniformly, ``doc_tokens`` each) with a question of its own appended, at
  Poisson arrivals of ``rate`` requests/s.

The prompts are plain text for ``/v1/completions`` (the route every topology of the bench
serves): a turn is ``"{system}\\n\\nUser: {u1}\\nAssistant:{a1}\\nUser: {u2}\\nAssistant:"``.
``Workload.requests`` holds one request per turn with the answers planned as filler text of
the turn's ``max_tokens`` (what an ``ignore_eos`` answer's length is): its prompt's length
is what the turn will send, to a few tokens, for the checks against the model's context and
for the warm-up. The turns actually sent are built by `turn_prompt` from the real answers
(tailguard/bench/loadgen.py, ``run_sessions``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tailguard.bench.workload import SHORT, BenchRequest, Workload, finish
from tailguard.plan.synthetic import class_stream, long_prompt, poisson_arrivals

CHAT, SHARED_DOC = "chat", "shared-doc"
#: turns per session (uniform, both ends included), mean think time (s), system prompt tokens,
#: tokens of a user turn or a question
CHAT_TURNS = (3, 8)
THINK_S = 3.0
SYSTEM_TOKENS = 300
USER_TOKENS = 40
#: shared-doc: documents and their tokens
DOCS = 3
DOC_TOKENS = 1200


@dataclass(frozen=True)
class Turn:
    user: str  # the user's message
    max_tokens: int
    think_s: float  # the user's pause after the previous answer (0 for the first turn)


@dataclass(frozen=True)
class Session:
    id: int
    arrival_s: float  # its first turn's, from the start of the phase
    system: str
    turns: tuple[Turn, ...]
    cls: str = SHORT


def turn_prompt(system: str, users: Sequence[str], answers: Sequence[str]) -> str:
    """The prompt of the turn that sends `users[-1]`: the conversation so far, each answer
    (one per earlier user turn) exactly as returned, and ``Assistant:`` for the next one."""
    if len(answers) != len(users) - 1:
        raise ValueError("one answer per user turn but the last")
    parts = [f"{system}\n"]
    for i, user in enumerate(users):
        parts.append(f"\nUser: {user}\nAssistant:" + (answers[i] if i < len(answers) else ""))
    return "".join(parts)


def chat_sessions(session_rate: float, duration_s: float, seed: int = 0, *,
                  turns: tuple[int, int] = CHAT_TURNS, think_s: float = THINK_S,
                  system_tokens: int = SYSTEM_TOKENS, user_tokens: int = USER_TOKENS,
                  answer_tokens: int = 64,
                  count_tokens: Callable[[str], int] | None = None) -> list[Session]:
    """Sessions arriving at `session_rate`/s over `duration_s` (the module docstring). The
    system prompt is one draw for every session; each session has its own random stream, so
    a session is the same whatever the others are."""
    lo, hi = turns
    if not 1 <= lo <= hi or think_s < 0 or min(system_tokens, user_tokens, answer_tokens) < 1:
        raise ValueError("chat: 1 <= turns low <= high, think time >= 0, token counts >= 1")
    system = long_prompt(system_tokens, class_stream(seed, f"{CHAT}/system"), count_tokens)
    starts = poisson_arrivals(session_rate, duration_s, class_stream(seed, f"{CHAT}/arrivals"))
    out = []
    for i, t in enumerate(starts):
        rng = class_stream(seed, f"{CHAT}/session/{i}")
        out.append(Session(i, t, system, tuple(
            Turn(long_prompt(user_tokens, rng, count_tokens), answer_tokens,
                 0.0 if k == 0 else rng.expovariate(1 / think_s) if think_s else 0.0)
            for k in range(rng.randint(lo, hi)))))
    return out


def planned_requests(session: Session, filler: Callable[[int], str]) -> list[BenchRequest]:
    """One request per turn of `session`, each earlier answer `filler(its max_tokens)`, due
    at the session's start plus the think times so far (the answers' own time unknown)."""
    out, users, answers, t = [], [], [], session.arrival_s
    for k, turn in enumerate(session.turns):
        t += turn.think_s
        users.append(turn.user)
        out.append(BenchRequest(session.cls, turn_prompt(session.system, users, answers),
                                turn.max_tokens, t, session=session.id, turn=k))
        answers.append(filler(turn.max_tokens))
    return out


def chat_workload(rate: float, duration_s: float, seed: int = 0, *,
                  turns: tuple[int, int] = CHAT_TURNS, think_s: float = THINK_S,
                  system_tokens: int = SYSTEM_TOKENS, user_tokens: int = USER_TOKENS,
                  answer_tokens: int = 64, count_tokens: Callable[[str], int] | None = None,
                  max_requests: int | None = None) -> Workload:
    """The chat workload at `rate` requests/s offered (sessions at `rate` / mean turns)."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError("chat: --rate and --duration must be > 0")
    mean_turns = (turns[0] + turns[1]) / 2
    sessions = chat_sessions(rate / mean_turns, duration_s, seed, turns=turns, think_s=think_s,
                             system_tokens=system_tokens, user_tokens=user_tokens,
                             answer_tokens=answer_tokens, count_tokens=count_tokens)
    if max_requests is not None:  # whole sessions, as many as fit
        kept, n = [], 0
        for s in sessions:
            if n + len(s.turns) > max_requests:
                break
            kept.append(s)
            n += len(s.turns)
        sessions = kept
    rng = class_stream(seed, f"{CHAT}/filler")
    fillers: dict[int, str] = {}

    def filler(tokens: int) -> str:
        if tokens not in fillers:
            fillers[tokens] = long_prompt(tokens, rng, count_tokens)
        return fillers[tokens]

    requests = [r for s in sessions for r in planned_requests(s, filler)]
    n_turns = len(requests)
    wl = finish(CHAT, requests, None, long_class=None, params={
        "rate": rate, "duration_s": duration_s, "seed": seed, "session_rate": rate / mean_turns,
        "sessions": len(sessions), "turns": list(turns), "think_s": think_s,
        "system_tokens": system_tokens, "user_tokens": user_tokens,
        "answer_tokens": answer_tokens,
        "described": f"chat: {len(sessions)} sessions ({rate / mean_turns:.3g}/s for "
                     f"{duration_s:g} s) of {turns[0]}-{turns[1]} turns, {n_turns} turns in all, "
                     f"a {system_tokens}-token system prompt shared by all, {user_tokens}-token "
                     f"user turns, {answer_tokens}-token answers, think time exponential with "
                     f"mean {think_s:g} s; each turn resends the conversation"})
    return replace(wl, sessions=tuple(sessions))


def doc_question_prompt(doc: str, question: str) -> str:
    return f"{doc}\n\nQuestion: {question}\nAnswer:"


def shared_doc_workload(rate: float, duration_s: float, seed: int = 0, *, docs: int = DOCS,
                        doc_tokens: int = DOC_TOKENS, question_tokens: int = USER_TOKENS,
                        answer_tokens: int = 64,
                        count_tokens: Callable[[str], int] | None = None,
                        max_requests: int | None = None) -> Workload:
    """Questions over `docs` documents at `rate` requests/s (the module docstring)."""
    if rate <= 0 or duration_s <= 0 or docs < 1 or min(doc_tokens, question_tokens) < 1:
        raise ValueError("shared-doc: --rate and --duration > 0, --docs >= 1, token counts >= 1")
    texts = [long_prompt(doc_tokens, class_stream(seed, f"{SHARED_DOC}/doc/{d}"), count_tokens)
             for d in range(docs)]
    rng = class_stream(seed, SHARED_DOC)
    requests = []
    for t in poisson_arrivals(rate, duration_s, rng):
        d = rng.randrange(docs)
        requests.append(BenchRequest(SHORT, doc_question_prompt(
            texts[d], long_prompt(question_tokens, rng, count_tokens)), answer_tokens, t,
            session=d))
    return finish(SHARED_DOC, requests, max_requests, long_class=None, params={
        "rate": rate, "duration_s": duration_s, "seed": seed, "docs": docs,
        "doc_tokens": doc_tokens, "question_tokens": question_tokens,
        "answer_tokens": answer_tokens,
        "described": f"shared-doc: questions ({question_tokens} tokens, {answer_tokens} out) "
                     f"over {docs} documents of {doc_tokens} tokens at {rate:g} req/s for "
                     f"{duration_s:g} s"})
