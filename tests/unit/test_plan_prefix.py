"""The prefix cache in tailguard plan: the LRU (tailguard/plan/prefix_cache.py), the simulator's
hit accounting and affinity dispatch (tailguard/plan/sim.py), the prefixed workloads
(tailguard/plan/workload.py) and the table (tailguard/plan/prefix.py)."""

import pytest

from tailguard.lanes.affinity import Affinity
from tailguard.lanes.table import Lane, default_lanes_path, load_lanes
from tailguard.plan.prefix import AFFINITY, ANY_FREE, compare, render
from tailguard.plan.prefix_cache import PrefixCache
from tailguard.plan.sim import FLEET, EngineGroup, Simulation
from tailguard.plan.stepmodel import StepModel
from tailguard.plan.workload import (
    ChatSession,
    ClassLoad,
    Lengths,
    PrefixedArrival,
    chat_sessions,
    shared_doc_arrivals,
)

# a step costs 1 s plus 1 s per 100 prompt tokens prefilled: a hit shows in the time
MODEL = StepModel(a_s=1.0, decode_s=0.0, prefill_s=0.01, max_batched_tokens=10_000)


def test_the_cache_finds_the_longest_prefix_held_up_to_its_length():
    c = PrefixCache(1000)
    c.put("system", 300)
    c.put("chat/1", 500)
    assert c.lookup([("system", 300), ("chat/1", 700)]) == 500  # held at 500 only
    assert c.lookup([("system", 300), ("chat/2", 700)]) == 300
    assert c.lookup([("doc", 900)]) == 0
    c.put("chat/1", 400)  # never shorter than held
    assert c.lookup([("chat/1", 700)]) == 500 and c.tokens == 800


def test_the_least_recently_used_go_first_once_past_the_capacity():
    c = PrefixCache(1000)
    for name in ("a", "b", "c"):
        c.put(name, 400)  # c pushes a out
    assert "a" not in c and "b" in c and c.tokens == 800
    c.lookup([("b", 400)])  # b used: c is the oldest now
    c.put("d", 400)
    assert "c" not in c and {"b", "d"} <= set(c.entries)
    c.put("huge", 5000)  # more than it holds: nothing of it stays
    assert "huge" not in c and c.tokens <= 1000
    with pytest.raises(ValueError):
        PrefixCache(-1)


def _fleet(engines: int, affinity: Affinity | None = None, kv: int = 10_000,
           slots: int = 4) -> Simulation:
    lane = Lane(name="only", max_tokens=1000, deadline_s=1e9, queue_ttl_s=1e9,
                max_model_len=1 << 20, max_num_seqs=slots)
    classes = [ClassLoad(n, 0.0, Lengths.fixed(1), Lengths.fixed(1)) for n in ("doc", "chat")]
    return Simulation(classes, [lane], [EngineGroup(("only",), engines, slots, dispatch=FLEET)],
                      MODEL, prefix_cache_tokens=kv, prefix_block_tokens=1, affinity=affinity)


def test_a_hit_skips_its_prefill_and_is_counted():
    s = _fleet(1)
    s.add_prefixed([PrefixedArrival(0.0, "doc", 1040, 2, (("doc/0", 1000),)),
                    PrefixedArrival(100.0, "doc", 1040, 2, (("doc/0", 1000),))])
    s.run()
    first, second = sorted(s.done, key=lambda r: r.arrival)
    assert (first.cached, second.cached) == (0, 1000)
    assert (s.prefix_queries, s.prefix_hits) == (2080, 1000)
    # the first prefilled 1,040 tokens in its step (1 + 10.4 s), the second 40 (1 + 0.4 s)
    assert first.first - first.arrival == pytest.approx(11.4)
    assert second.first - second.arrival == pytest.approx(1.4)


def test_a_whole_prompt_held_still_computes_its_last_token():
    s = _fleet(1)
    s.add_prefixed([PrefixedArrival(t, "doc", 500, 1, (("doc/0", 500),)) for t in (0.0, 50.0)])
    s.run()
    assert max(r.cached for r in s.done) == 499


def test_a_hit_counts_whole_blocks_only():
    s = _fleet(1)
    s.block = 128  # vLLM's CPU backend's
    s.add_prefixed([PrefixedArrival(t, "doc", 1040, 2, (("doc/0", 1000),)) for t in (0.0, 50.0)])
    s.run()
    assert max(r.cached for r in s.done) == 896  # 7 blocks of the 1,000 tokens held


def test_a_conversations_next_turn_follows_its_answer_and_think_time():
    s = _fleet(1)
    session = ChatSession(0.0, "chat/0", ("chat/system", 100), ((20, 3, 0.0), (20, 3, 5.0),
                                                                 (20, 3, 5.0)), cls="chat")
    s.add_sessions([session])
    s.run()
    turns = sorted(s.done, key=lambda r: r.arrival)
    assert [r.prompt for r in turns] == [120, 143, 166]  # the previous prompt + 3 out + 20
    for prev, nxt in zip(turns, turns[1:]):
        assert nxt.arrival == pytest.approx(prev.end + 5.0)
        assert nxt.cached == prev.prompt + prev.out  # the whole previous turn, held


def _chat_on_two(affinity: Affinity | None) -> Simulation:
    """Two conversations at once on two engines, each turn after the other's has ended."""
    s = _fleet(2, affinity)
    s.add_sessions([ChatSession(t, f"chat/{i}", ("chat/system", 100),
                                ((50, 2, 0.0),) + ((50, 2, 1.0 + 1.7 * i),) * 4, cls="chat")
                    for i, t in enumerate((0.0, 0.0))])
    s.run()
    return s


def test_affinity_sends_a_turn_to_the_engine_holding_its_conversation():
    s = _chat_on_two(Affinity(max_extra=4))
    for key in ("chat/0", "chat/1"):
        turns = sorted((r for r in s.done if r.follow[0].key == key), key=lambda r: r.arrival)
        assert len({r.where.name for r in turns}) == 1  # one engine, turn after turn
        assert all(r.cached == p.prompt + p.out for p, r in zip(turns, turns[1:]))
    assert s.offers["taken"] == 8 and s.offers["not_offered"] == 2  # the first turns
    without = _chat_on_two(None)
    assert s.prefix_hits > without.prefix_hits and without.offers["taken"] == 0


def test_an_overloaded_holder_is_passed_over():
    s = _chat_on_two(Affinity(max_extra=0))
    e0 = s.engines[0]
    e0.reqs.extend([object()] * 3)  # e0 runs three more than e1
    s.index["chat/x"] = (e0.name,)
    r = type(s.done[0])("chat", "only", 0.0, 10, 1, keep="chat/x")
    assert not s.offer(r, 0.0)
    assert s.offers["not_offered"] == 3


def test_a_full_holder_gets_no_offer_and_a_free_engine_takes_it_at_once():
    """One slot per engine: the first holds a 50 s prefill; a request for the document it holds
    is not offered to it (no room) and the idle engine takes it from the lane's queue."""
    s = _fleet(2, Affinity(max_extra=1), slots=1)
    busy, idle = s.engines
    s.arrive(0.0, s.classes[0], 5000, 50)
    assert busy.reqs and not idle.reqs  # the least recently used engine first: the first
    s.index["doc/0"] = (busy.name,)
    s.arrive(0.1, s.classes[0], 1040, 2, (("doc/0", 1000),))
    s.run()
    r = next(r for r in s.done if r.prefix)
    assert r.where is idle and r.start == pytest.approx(0.1)
    assert s.offers == {"taken": 0, "not_offered": 2}


def test_a_holder_with_room_takes_its_request_though_another_engine_is_idler():
    s = _fleet(2, Affinity(max_extra=1), slots=2)
    busy, idle = s.engines
    s.arrive(0.0, s.classes[0], 400, 1)  # 5 s on the first engine
    s.index["doc/0"] = (busy.name,)
    s.arrive(0.1, s.classes[0], 1040, 2, (("doc/0", 1000),))
    r = next(r for r in busy.reqs if r.prefix)
    assert r.start == pytest.approx(0.1) and not idle.reqs and s.offers["taken"] == 1


def test_plan_workloads_are_seeded_and_shaped():
    a, b = chat_sessions(4.0, 60, seed=1), chat_sessions(4.0, 60, seed=1)
    assert a == b and a != chat_sessions(4.0, 60, seed=2)
    assert 30 < len(a) < 60  # 4 / 5.5 sessions a second
    assert {len(s.turns) for s in a} <= set(range(3, 9)) and len({s.system for s in a}) == 1
    assert all(s.turns[0][2] == 0.0 and all(t[2] > 0 for t in s.turns[1:]) for s in a)
    docs = shared_doc_arrivals(5.0, 60, seed=1, docs=3, doc_tokens=1200, question_tokens=40)
    assert {d.prefix for d in docs} == {((f"shared-doc/{i}", 1200),) for i in range(3)}
    assert all(d.prompt == 1240 for d in docs) and docs == shared_doc_arrivals(5.0, 60, seed=1)


def test_the_table_compares_both_dispatches_per_workload():
    table = load_lanes(default_lanes_path())
    gpu = StepModel(a_s=0.008, decode_s=0.0001, prefill_s=0.0001, context_s=2.5e-7,
                    overhead_s=0.02)
    rows = compare(table, gpu, [2], [2.0], duration_s=20, kv_tokens=100_000)
    assert [(r.workload, r.dispatch) for r in rows] == [
        ("chat", ANY_FREE), ("chat", AFFINITY), ("shared-doc", ANY_FREE),
        ("shared-doc", AFFINITY)]
    chat_any, chat_aff = rows[0], rows[1]
    assert chat_any.requests == chat_aff.requests  # the same conversations
    assert chat_aff.hit_rate > chat_any.hit_rate
    assert chat_aff.offers["taken"] > 0 and chat_any.offers == {}
    text = render(rows)
    assert "affinity: taken / not offered" in text
    assert text.count("\n") == 4
