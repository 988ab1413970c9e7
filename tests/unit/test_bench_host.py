"""Benchmark host watch: CPU used by processes outside the benchmark's tree."""

import os

from tailguard.bench.host import Watch, descendants, is_engine, others_cpu, own_cpu
from tailguard.host.procfs import Proc, parse_stat


def test_parse_stat_with_a_strange_command_name():
    line = "4242 (VLLM::Engine (x) 1) S 17 4242 4242 0 -1 4194560 0 0 0 0 250 50 0 0 20 0 3 0"
    assert parse_stat(line, ticks=100) == Proc(4242, 17, "VLLM::Engine (x) 1", 3.0, 0.0)
    reaped = line.replace(" 250 50 0 0 ", " 250 50 700 100 ")
    assert parse_stat(reaped, ticks=100).children_cpu_s == 8.0


def procs(*rows):
    return {pid: Proc(pid, ppid, comm, cpu) for pid, ppid, comm, cpu in rows}


def test_others_cpu_leaves_out_our_tree():
    before = procs((1, 0, "init", 1.0), (10, 1, "bench", 5.0), (11, 10, "celery", 1.0),
                   (12, 11, "VLLM::EngineCore", 2.0), (20, 1, "pytest", 3.0))
    after = procs((1, 0, "init", 1.1), (10, 1, "bench", 9.0), (11, 10, "celery", 8.0),
                  (12, 11, "VLLM::EngineCore", 40.0), (20, 1, "pytest", 13.0),
                  (21, 20, "VLLM::EngineCore", 4.0), (30, 1, "reused", 0.5))
    after[40] = Proc(40, 2, "kworker/0:1", 3.0)  # a kernel thread: not counted
    assert descendants(after, 10) == {10, 11, 12}
    cpu, heaviest = others_cpu(before, after, root=10)
    assert round(cpu, 3) == round(0.1 + 10.0 + 4.0 + 0.5, 3)
    assert heaviest == [("pytest", 10.0), ("VLLM::EngineCore", 4.0), ("reused", 0.5)]


def test_watch_reports_this_machine():
    h = Watch().stop()
    assert set(h) >= {"wall_s", "others_cpu_s", "others_share", "disturbed", "others_heaviest"}
    if os.path.isdir("/proc"):
        assert h["others_cpu_s"] >= 0


def test_others_cpu_counts_a_run_that_started_and_ended_within_the_phase():
    """A test run started by a shell and finished before the second snapshot is in neither
    snapshot: its time shows in the shell's reaped-children time."""
    before = {10: Proc(10, 1, "bench", 1.0), 50: Proc(50, 1, "bash", 0.2, 1.0),
              60: Proc(60, 50, "pytest", 4.0)}  # running at the start, ends within the phase
    after = {10: Proc(10, 1, "bench", 9.0),
             # bash reaped pytest (4 s before + 2 s within) and a run of 30 s within the phase
             50: Proc(50, 1, "bash", 0.2, 1.0 + 6.0 + 30.0)}
    cpu, heaviest = others_cpu(before, after, root=10)
    assert round(cpu, 3) == 32.0  # 2 s of the first run, 30 s of the second
    assert heaviest == [("bash", 32.0)]


def test_own_cpu_splits_the_engines_from_the_front_end():
    """The engine-core and model-runner processes (vLLM's titles, cut to 15 characters by the
    kernel) are the engines; the bench itself, Redis, the API and the workers the front end."""
    before = procs((10, 1, "bench", 5.0), (11, 10, "redis-server", 1.0), (12, 10, "celery", 3.0),
                   (13, 12, "VLLM::EngineCor", 10.0), (14, 13, "VLLM::Worker", 50.0),
                   (15, 10, "celery", 2.0), (16, 15, "VLLM::EngineCor", 4.0),
                   (17, 16, "VLLM::Worker_TP", 20.0), (20, 1, "pytest", 3.0))
    after = procs((10, 1, "bench", 9.0), (11, 10, "redis-server", 2.5), (12, 10, "celery", 6.0),
                  (13, 12, "VLLM::EngineCor", 15.0), (14, 13, "VLLM::Worker", 100.0),
                  (15, 10, "celery", 2.5), (16, 15, "VLLM::EngineCor", 6.0),
                  (17, 16, "VLLM::Worker_TP", 30.0), (20, 1, "pytest", 50.0))
    frontend, engine = own_cpu(before, after, root=10)
    assert round(frontend, 3) == 4.0 + 1.5 + 3.0 + 0.5  # pytest is not ours
    assert round(engine, 3) == 5.0 + 50.0 + 2.0 + 10.0
    assert [is_engine(p) for p in after.values()] == [False] * 3 + [True] * 2 + [False] + [True] * 2 + [False]


def test_own_cpu_counts_an_ended_engine_once_under_its_parent():
    """A model runner that ends within the phase: its time since the first snapshot lands in
    its parent's reaped-children time, and stays the engines'."""
    before = {10: Proc(10, 1, "bench", 1.0), 13: Proc(13, 10, "VLLM::EngineCor", 2.0),
              14: Proc(14, 13, "VLLM::Worker", 30.0)}
    after = {10: Proc(10, 1, "bench", 2.0), 13: Proc(13, 10, "VLLM::EngineCor", 3.0, 36.0)}
    assert own_cpu(before, after, root=10) == (1.0, 1.0 + 6.0)


def test_watch_splits_its_own_tree():
    h = Watch().stop()
    assert h["frontend_cpu_s"] >= 0 and h["engine_cpu_s"] == 0  # no engine below a test


def test_front_end_cpu_by_process_leaves_the_engines_out():
    from tailguard.bench.host import Proc, frontend_heaviest
    P = 10**7
    before = {P: Proc(P, 0, "python", 1.0), P + 1: Proc(P + 1, P, "gunicorn", 2.0),
              P + 2: Proc(P + 2, P, "VLLM::EngineCor", 5.0)}
    after = {P: Proc(P, 0, "python", 1.5), P + 1: Proc(P + 1, P, "gunicorn", 4.0),
             P + 2: Proc(P + 2, P, "VLLM::EngineCor", 50.0)}
    assert frontend_heaviest(before, after, P) == [("gunicorn", 2.0), ("python", 0.5)]


def test_a_model_runner_not_yet_named_counts_as_its_engines():
    from tailguard.bench.host import Proc, frontend_heaviest, own_cpu
    P = 10**7
    # the worker (P) builds an engine: its core has its name, its model runner is still `python`
    before = {P: Proc(P, 0, "[celeryd: short", 1.0),
              P + 1: Proc(P + 1, P, "VLLM::EngineCor", 1.0), P + 2: Proc(P + 2, P + 1, "python", 0.0)}
    after = {P: Proc(P, 0, "[celeryd: short", 2.0),
             P + 1: Proc(P + 1, P, "VLLM::EngineCor", 3.0), P + 2: Proc(P + 2, P + 1, "python", 5.0)}
    assert own_cpu(before, after, P) == (1.0, 7.0)
    assert frontend_heaviest(before, after, P) == [("[celeryd: short", 1.0)]


def test_a_tree_without_engines_is_idle_at_once():
    import os

    from tailguard.bench.host import engines_idle
    assert engines_idle(os.getpid(), interval_s=0.05)
