"""Workloads with shared prefixes (tailguard/bench/sessions.py): sessions, history, documents."""

import pytest

from tailguard.bench.run import BenchConfig, build_workload, phases_of
from tailguard.bench.sessions import (
    CHAT,
    SHARED_DOC,
    chat_sessions,
    chat_workload,
    shared_doc_workload,
    turn_prompt,
)
from tailguard.bench.workload import SHORT


def words_x2(text: str) -> int:
    """A stand-in tokenizer: two tokens per word."""
    return 2 * len(text.split())


def test_a_turn_resends_the_conversation_and_begins_with_the_previous_turn_and_answer():
    first = turn_prompt("SYS", ["hi"], [])
    assert first == "SYS\n\nUser: hi\nAssistant:"
    second = turn_prompt("SYS", ["hi", "more"], [" hello there"])
    assert second.startswith(first + " hello there")  # the answer exactly as returned
    assert second.endswith("\nUser: more\nAssistant:")
    with pytest.raises(ValueError):
        turn_prompt("SYS", ["hi", "more"], [])


def test_sessions_have_their_turns_think_times_and_one_system_prompt():
    sessions = chat_sessions(2.0, 100, seed=3, turns=(3, 8), think_s=2.0, system_tokens=100,
                             user_tokens=10, answer_tokens=16, count_tokens=words_x2)
    assert 140 < len(sessions) < 260  # Poisson, 2/s over 100 s
    assert len({s.system for s in sessions}) == 1
    assert abs(words_x2(sessions[0].system) - 100) <= 2
    assert {len(s.turns) for s in sessions} == set(range(3, 9))
    assert [s.arrival_s for s in sessions] == sorted(s.arrival_s for s in sessions)
    thinks = [t.think_s for s in sessions for t in s.turns[1:]]
    assert all(s.turns[0].think_s == 0 for s in sessions) and min(thinks) > 0
    assert 1.6 < sum(thinks) / len(thinks) < 2.4  # exponential of mean 2 s
    assert all(t.max_tokens == 16 for s in sessions for t in s.turns)


def test_chat_is_deterministic_under_its_seed():
    kw = {"turns": (3, 5), "system_tokens": 50, "user_tokens": 8, "count_tokens": words_x2}
    a, b = chat_workload(1.0, 60, seed=1, **kw), chat_workload(1.0, 60, seed=1, **kw)
    assert a == b and a.sessions == b.sessions
    assert a.sessions != chat_workload(1.0, 60, seed=2, **kw).sessions
    # a session is the same whatever the other sessions are (each has its own stream)
    longer = chat_workload(1.0, 120, seed=1, **kw)
    assert longer.sessions[: len(a.sessions)] == a.sessions


def test_chat_plans_one_request_per_turn_with_the_history_growing():
    wl = chat_workload(2.0, 60, seed=0, turns=(3, 8), think_s=1.0, system_tokens=60,
                       user_tokens=8, answer_tokens=20, count_tokens=words_x2)
    assert wl.name == CHAT and wl.classes == [SHORT] and wl.long_class is None
    assert len(wl.requests) == sum(len(s.turns) for s in wl.sessions)
    assert wl.params["session_rate"] == pytest.approx(2.0 / 5.5)  # requests/s offered
    for s in wl.sessions:
        turns = sorted((r for r in wl.requests if r.session == s.id), key=lambda r: r.turn)
        assert [r.turn for r in turns] == list(range(len(s.turns)))
        assert turns[0].arrival_s == s.arrival_s
        for prev, nxt in zip(turns, turns[1:]):
            assert nxt.prompt.startswith(prev.prompt)  # the whole conversation, resent
            grown = words_x2(nxt.prompt) - words_x2(prev.prompt)
            assert grown >= 20 + 8  # at least the answer and the next user turn
            assert nxt.arrival_s > prev.arrival_s
        assert turns[0].prompt.startswith(s.system)


def test_chat_cuts_at_whole_sessions():
    wl = chat_workload(2.0, 60, seed=0, max_requests=20, system_tokens=20, user_tokens=4,
                       count_tokens=words_x2)
    assert 20 - 8 < len(wl.requests) <= 20
    assert len(wl.requests) == sum(len(s.turns) for s in wl.sessions)


def test_shared_doc_asks_questions_over_a_few_documents():
    wl = shared_doc_workload(3.0, 60, seed=2, docs=3, doc_tokens=200, question_tokens=10,
                             answer_tokens=16, count_tokens=words_x2)
    assert wl.name == SHARED_DOC and wl.classes == [SHORT] and not wl.sessions
    heads = {r.prompt.split("\n\nQuestion:")[0] for r in wl.requests}
    assert len(heads) == 3 and all(abs(words_x2(h) - 200) <= 2 for h in heads)
    assert {r.session for r in wl.requests} == {0, 1, 2}  # the document, by index
    assert len({r.prompt for r in wl.requests}) == len(wl.requests)  # each question its own
    assert wl == shared_doc_workload(3.0, 60, seed=2, docs=3, doc_tokens=200,
                                     question_tokens=10, answer_tokens=16,
                                     count_tokens=words_x2)


@pytest.mark.parametrize("name", [CHAT, SHARED_DOC])
def test_the_bench_builds_them_as_one_phase(name):
    cfg = BenchConfig(workload=name, rate=1.0, duration_s=30, chat_turns=(3, 4),
                      system_prompt_tokens=40, user_tokens=6, docs=2, doc_tokens=80)
    wl = build_workload(cfg, words_x2)
    assert wl.name == name and wl.requests
    assert list(phases_of(wl, baseline=True)) == ["mixed"]

