"""Benchmark topologies: same engines, same cores; `shared` is one FCFS lane for everything."""

import tomllib

import pytest
from lanes_shapes import partitioned_default

from tailguard.bench.topology import (
    DIRECT,
    TOPOLOGIES,
    VLLM_SERVER_MODULE,
    class_priorities,
    direct_spec,
    lanes_spec,
    lanes_toml,
    shared_spec,
    worker_spec,
)
from tailguard.host.cores import Pinning
from tailguard.lanes.placement import place
from tailguard.lanes.table import parse_lanes
from tailguard.plan.search import SHARED_LANE, shared_lane


@pytest.fixture
def table():
    return parse_lanes(tomllib.loads(partitioned_default()))


def test_lanes_toml_round_trips(table):
    text = lanes_toml(list(table.lanes), list(table.workers), comment="two\nlines")
    assert text.startswith("# two\n# lines\n")
    again = parse_lanes(tomllib.loads(text))
    assert again.lanes == table.lanes and again.workers == table.workers


def test_shared_lane_takes_everything_interactive(table):
    lane = shared_lane(table)
    assert lane.max_cost is None and lane.priority == "interactive" and not lane.dedicated
    assert lane.max_tokens == max(l.max_tokens for l in table if l.priority == "interactive")
    assert lane.max_num_seqs == 16 and lane.max_model_len == 4096
    for prompt_tokens, max_tokens in ((10, 64), (2000, 512)):
        p = place([lane], priority="interactive", prompt_tokens=prompt_tokens,
                  requested_max_tokens=max_tokens, model_max_len=4096)
        assert p.lane == SHARED_LANE and p.max_tokens == max_tokens and not p.max_tokens_capped


def test_same_engines_same_cores(table):
    shared = shared_spec(table, engines=2, cores=[0, 1])
    lanes = lanes_spec(table, partitioned_default(), cores=[0, 1])
    assert [(w.lanes, w.pin.cores) for w in shared.workers] == [((SHARED_LANE,), (0,)),
                                                                ((SHARED_LANE,), (1,))]
    assert [(w.name, w.lanes, w.pin.cores) for w in lanes.workers] == [
        ("short", ("short",), (0,)), ("long", ("long", "batch"), (1,))]
    assert shared.workers_per_lane() == {SHARED_LANE: 2}
    assert lanes.workers_per_lane() == {"short": 1, "long": 1, "batch": 1}
    assert shared.table.names == [SHARED_LANE]
    assert (lanes.table.lanes, lanes.table.workers) == (table.lanes, table.workers)
    assert {w.name for w in shared.workers} == {"shared-0", "shared-1"}  # distinct Celery nodes
    d = shared.to_dict()
    assert d["engines"][1] == {"name": "shared-1", "lanes": ["shared"], "gpus": [], "cores": [1]}


def test_worker_spec_pins_like_tailguard_up(table):
    w = lanes_spec(table, "", cores=[2, 3, 4, 5]).workers[1]
    spec = worker_spec(w, {"X": "1"}, python="py")
    argv = list(spec.argv)
    assert argv[:6] == ["py", "-m", "tailguard.cli", "worker", "--worker", "long"]
    assert argv[argv.index("--cores") + 1] == "4,5"
    assert spec.name == "worker.long" and spec.env == {"X": "1"}
    gpu = shared_spec(table, engines=2, kind="cuda", gpus=2).workers[1]
    assert list(worker_spec(gpu, {}, python="py").argv)[6:8] == ["--gpu", "1"]


def test_direct_is_one_vllm_server_doing_the_lanes_engines_work(table):
    lanes = lanes_spec(table, "", cores=[0, 1])
    d = direct_spec(Pinning(cores=(0, 1)), lanes.workers, table, max_model_len=2048,
                    dtype="bfloat16")
    # the short engine's 16 slots + the long engine's 8; their KV caches together
    assert (d.max_num_seqs, d.max_model_len, d.kv_cache_gib) == (24, 2048, 2)
    assert direct_spec(Pinning(), lanes.workers, table).max_model_len == 4096  # the largest lane's
    argv = list(d.argv("/m", 8123, python="py"))
    assert argv[:3] == ["py", "-m", VLLM_SERVER_MODULE]
    opt = dict(zip(argv[3::2], argv[4::2]))
    assert opt["--model"] == "/m" and opt["--port"] == "8123" and opt["--max-num-seqs"] == "24"
    assert argv[argv.index("--scheduling-policy") + 1] == "priority"
    assert argv[argv.index("--dtype") + 1] == "bfloat16" and "--enforce-eager" in argv
    env = d.env()
    # compute threads bound to the cores; the server process itself is not pinned
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0,1" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert [w.to_dict() for w in d.workers] == [{"name": "vllm", "lanes": [], "gpus": [],
                                                 "cores": [0, 1]}]
    assert d.to_dict()["scheduling_policy"] == "priority" and d.name == DIRECT in TOPOLOGIES


def test_class_priorities_put_the_short_class_first():
    assert class_priorities(["short", "medium", "long"]) == {"short": 0, "medium": 1, "long": 2}
    assert class_priorities([]) == {}


def test_each_engines_slots_and_the_engines_each_class_may_use(table):
    from tailguard.bench.run import BenchConfig, _class_engines, _Run, build_workload

    lanes = lanes_spec(table, partitioned_default(), cores=[0, 1])
    shared = shared_spec(table, engines=2, cores=[0, 1])
    # the long worker's engine shares the front end's core (the last one): cut to 3 running
    assert lanes.frontend == (1,)
    assert lanes.engine_slots() == {"short": 16, "long": 3}
    assert shared.engine_slots() == {"shared-0": 16, "shared-1": 3}
    cfg = BenchConfig(workload="mixed", duration_s=20)
    wl = build_workload(cfg, None, table)
    run = _Run("m", table, 4096, None, wl, {}, None)
    # the short class's lane on the short worker, the long class's on the long one
    assert _class_engines(lanes, run) == {"short": ["short"], "long": ["long"]}
    assert _class_engines(shared, run) == {"short": ["shared-0", "shared-1"],
                                           "long": ["shared-0", "shared-1"]}
    d = direct_spec(Pinning(cores=(0, 1)), lanes.workers, table)
    assert _class_engines(d, run) is None and d.engine_slots() == {"vllm": 24}
