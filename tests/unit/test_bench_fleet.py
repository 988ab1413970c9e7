"""The `fleet` peer: a tuned vLLM server per engine behind vllm-router (tailguard/bench/fleet.py)."""

import socket
import tomllib

import pytest
from lanes_shapes import partitioned_default

from tailguard.bench.fleet import POLICIES, FleetSpec, fleet_specs
from tailguard.bench.run import BenchConfig, _specs, build_workload
from tailguard.bench.topology import (
    DEFAULT_TOPOLOGIES,
    FLEET,
    FLEET_P2,
    TOPOLOGIES,
    VLLM_SERVER_MODULE,
    lanes_spec,
)
from tailguard.lanes.table import parse_lanes


@pytest.fixture
def table():
    return parse_lanes(tomllib.loads(partitioned_default()))


def test_fleet_topologies_are_known_and_run_by_default():
    assert {FLEET, FLEET_P2} <= set(DEFAULT_TOPOLOGIES) <= set(TOPOLOGIES)
    assert POLICIES == {FLEET: "cache_aware", FLEET_P2: "power_of_two"}


def test_a_replica_per_engine_on_its_cores_with_its_slots_and_the_tuned_flags(table):
    engines = lanes_spec(table, "", cores=[0, 1]).workers  # short on core 0, long on core 1
    fleet, p2 = fleet_specs(engines, table, (1024, 256), max_model_len=2048, dtype="float32",
                            cpus=(0, 1), frontend=(1,))
    assert (fleet.name, fleet.policy, p2.name, p2.policy) == (FLEET, "cache_aware", FLEET_P2,
                                                              "power_of_two")
    assert fleet.replicas == p2.replicas and fleet.cpus == (1,)  # the router on the front end
    assert [r.name for r in fleet.replicas] == ["replica-0", "replica-1"]
    assert [r.pin.cores for r in fleet.replicas] == [(0,), (1,)]
    # each engine's own batch slots (short 16, long 8); every replica takes any request
    assert fleet.engine_slots() == {"replica-0": 16, "replica-1": 8}
    assert {r.max_model_len for r in fleet.replicas} == {2048}
    r0 = fleet.replicas[0]
    argv = list(r0.argv("/m", 8101, python="py"))
    assert argv[:3] == ["py", "-m", VLLM_SERVER_MODULE]
    opt = dict(zip(argv[3::2], argv[4::2]))
    assert (opt["--port"], opt["--max-num-seqs"], opt["--dtype"]) == ("8101", "16", "float32")
    assert argv[argv.index("--scheduling-policy") + 1] == "priority"
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "1024"
    assert argv[argv.index("--long-prefill-token-threshold") + 1] == "256"
    env = r0.env()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert fleet.replicas[1].env()["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    # every server on the front-end core, as tailguard's API and worker threads run; its vLLM
    # processes are moved to its own cores once up (RunningFleet)
    assert [r.cpus for r in fleet.replicas] == [(1,), (1,)]
    assert [w.to_dict()["cores"] for w in fleet.workers] == [[0], [1]]
    d = fleet.to_dict()
    assert d["router"] == "vllm-router" and d["policy"] == "cache_aware" and len(d["replicas"]) == 2
    # the engine on the front-end core runs at the engine nice, as tailguard's engine there does
    assert fleet.engine_nice(fleet.replicas[1], 10) == 10
    assert fleet.engine_nice(r0, 10) == 0 and fleet.engine_nice(fleet.replicas[1], 0) == 0


def test_a_tuned_setting_vllm_would_refuse_is_refused_before_anything_starts(table):
    engines = lanes_spec(table, "", cores=[0, 1]).workers
    with pytest.raises(ValueError, match="max-num-seqs"):
        fleet_specs(engines, table, (8, 8))


def test_the_router_fronts_every_replica_with_its_policy():
    spec = FleetSpec(FLEET_P2, (), policy="power_of_two")
    argv = list(spec.router_argv(8100, [8101, 8102], 8199, router="vllm-router"))
    assert argv[0] == "vllm-router"
    i = argv.index("--worker-urls")
    assert argv[i + 1:i + 3] == ["http://127.0.0.1:8101", "http://127.0.0.1:8102"]
    opt = dict(zip(argv[1::2], argv[2::2]))
    assert opt["--port"] == "8100" and opt["--host"] == "127.0.0.1"
    assert argv[argv.index("--policy") + 1] == "power_of_two"
    assert argv[argv.index("--prometheus-port") + 1] == "8199"  # not its default 29000
    assert "--balance-abs-threshold" not in argv  # the router's own defaults otherwise


def test_the_run_builds_the_fleets_on_the_lanes_topologys_engines(table):
    cfg = BenchConfig(workload="mixed", topologies=("lanes", FLEET, FLEET_P2),
                      tuned_sweep=((512, 128), (1024, 256)))
    lanes = lanes_spec(table, partitioned_default(), cores=[0, 1])
    specs = _specs(cfg, build_workload(cfg, None, table), table, lanes, "demo-small", 4096,
                   kind="cpu", cores=[0, 1], engines=2)
    assert list(specs) == ["lanes", FLEET, FLEET_P2]
    fleet = specs[FLEET]
    assert isinstance(fleet, FleetSpec)
    assert [r.pin for r in fleet.replicas] == [w.pin for w in lanes.workers]
    args = fleet.replicas[0].extra_args  # the sweep's first setting
    assert args[args.index("--max-num-batched-tokens") + 1] == "512"


def test_a_port_taken_since_it_was_picked_is_picked_again():
    from tailguard.bench.fleet import _still_free

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        other = _still_free(port)
        assert other != port and _still_free(other) == other
