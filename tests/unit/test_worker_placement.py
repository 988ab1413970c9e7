"""Where `tailguard up` places its workers: every GPU of a host, or disjoint CPU cores.

Table-driven on fake hosts (a list of visible GPUs, a list of cores): place_workers is pure.
"""

import tomllib

import pytest

from tailguard.errors import ConfigError
from tailguard.host.devices import parse_visible, visible_gpus
from tailguard.lanes.table import WorkerSpec, default_lanes_path, load_lanes, parse_lanes
from tailguard.launch.worker_placement import place_workers

TWO = (WorkerSpec("short", ("short",)), WorkerSpec("long", ("long", "batch")))
LANES = """
[lanes.short]
max_cost = 256
max_tokens = 64
dedicated = true

[lanes.long]
max_tokens = 512
"""


def lanes(workers: str, engine: str = "") -> tuple[WorkerSpec, ...]:
    """The [[workers]] of a lanes file made of LANES, `engine` (its [engine] table) and `workers`."""
    return parse_lanes(tomllib.loads(engine + LANES + workers)).workers


#: the shipped file's shape: short on one GPU, long on every GPU left
SHIPPED = """
[[workers]]
name = "short"
lanes = ["short"]

[[workers]]
name = "long"
lanes = ["long"]
replicas = "fill"
"""
TP2 = "[engine]\ntensor_parallel_size = 2\n"


def plan(workers, gpus) -> list[tuple[str, tuple[int, ...]]]:
    return [(w.name, w.devices) for w in place_workers(workers, "cuda", gpus=gpus).workers]


@pytest.mark.parametrize("engine,gpus,expected", [
    # TP 1: short on the first GPU, long and its replicas on every other one
    ("", 2, [("short", (0,)), ("long", (1,))]),
    ("", 4, [("short", (0,)), ("long", (1,)), ("long-2", (2,)), ("long-3", (3,))]),
    ("", 8, [("short", (0,))] + [("long", (1,))] + [(f"long-{k}", (k,)) for k in range(2, 8)]),
    # TP 2 for every worker ([engine]): aligned pairs
    (TP2, 4, [("short", (0, 1)), ("long", (2, 3))]),
    (TP2, 8, [("short", (0, 1)), ("long", (2, 3)), ("long-2", (4, 5)), ("long-3", (6, 7))]),
])
def test_every_gpu_of_the_host_serves_a_worker(engine, gpus, expected):
    placement = place_workers(lanes(SHIPPED, engine), "cuda", gpus=gpus)
    assert [(w.name, w.devices) for w in placement.workers] == expected
    assert placement.idle == () and placement.notes() == []
    assert [w.pin.gpus for w in placement.workers] == [tuple(map(str, d)) for _, d in expected]


@pytest.mark.parametrize("engine,gpus", [("", 1), (TP2, 1), (TP2, 2), (TP2, 3)])
def test_too_few_gpus_are_refused_with_what_each_worker_needs(engine, gpus):
    with pytest.raises(ConfigError, match=r"too few GPUs: the workers need \d+ .*short 1 x "
                                          r"\d, long 1 x \d.* this process sees " + str(gpus)):
        place_workers(lanes(SHIPPED, engine), "cuda", gpus=gpus)


def test_a_tensor_parallel_engine_table_on_four_gpus_plans_two_workers():
    """The issue's case: engine = {tensor_parallel_size = 2} on a 4-GPU host."""
    workers = lanes('[[workers]]\nname = "short"\nlanes = ["short"]\n'
                    'engine = {tensor_parallel_size = 2}\n'
                    '[[workers]]\nname = "long"\nlanes = ["long"]\n'
                    'engine = {tensor_parallel_size = 2}\n')
    assert plan(workers, 4) == [("short", (0, 1)), ("long", (2, 3))]
    assert [w.pin.env() for w in place_workers(workers, "cuda", gpus=4).workers] == [
        {"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]


def fill_only(engine: str = "") -> tuple[WorkerSpec, ...]:
    """One lane, one [[workers]] entry with replicas = "fill"."""
    return parse_lanes(tomllib.loads('[lanes.long]\nmax_tokens = 512\n[[workers]]\n'
                                     f'lanes = ["long"]\nreplicas = "fill"\n{engine}')).workers


@pytest.mark.parametrize("gpus,expected", [
    (1, [("long", (0,))]),
    (2, [("long", (0,)), ("long-2", (1,))]),
    (4, [("long", (0,)), ("long-2", (1,)), ("long-3", (2,)), ("long-4", (3,))]),
    (8, [("long", (0,))] + [(f"long-{k + 1}", (k,)) for k in range(1, 8)]),
])
def test_fill_takes_every_gpu_tp1(gpus, expected):
    assert plan(fill_only(), gpus) == expected


@pytest.mark.parametrize("gpus,expected", [
    (2, [("long", (0, 1))]),
    (4, [("long", (0, 1)), ("long-2", (2, 3))]),
    (8, [("long", (0, 1)), ("long-2", (2, 3)), ("long-3", (4, 5)), ("long-4", (6, 7))]),
])
def test_fill_takes_every_gpu_tp2(gpus, expected):
    assert plan(fill_only("engine = {tensor_parallel_size = 2}\n"), gpus) == expected


def test_fill_gets_at_least_one_worker():
    with pytest.raises(ConfigError, match="too few GPUs"):
        place_workers(fill_only("engine = {tensor_parallel_size = 2}\n"), "cuda", gpus=1)


def test_fixed_replicas_and_the_gpus_left_over_are_said():
    workers = lanes('[[workers]]\nname = "short"\nlanes = ["short"]\n'
                    '[[workers]]\nname = "long"\nlanes = ["long"]\nreplicas = 2\n')
    placement = place_workers(workers, "cuda", gpus=4)
    assert [(w.name, w.devices) for w in placement.workers] == [
        ("short", (0,)), ("long", (1,)), ("long-2", (2,))]
    assert placement.idle == (3,)
    assert placement.notes() == ['GPU 3 serves no worker: no [[workers]] entry takes it '
                                 '(`replicas`, `replicas = "fill"` or `devices` would)']


def test_a_tp2_fill_after_a_tp1_worker_takes_aligned_pairs_and_says_what_is_left():
    workers = lanes('[[workers]]\nname = "short"\nlanes = ["short"]\n'
                    '[[workers]]\nname = "long"\nlanes = ["long"]\nreplicas = "fill"\n'
                    "engine = {tensor_parallel_size = 2}\n")
    placement = place_workers(workers, "cuda", gpus=4)
    assert [(w.name, w.devices) for w in placement.workers] == [("short", (0,)), ("long", (2, 3))]
    assert placement.idle == (1,) and "GPU 1 serves no worker" in placement.notes()[0]


def test_named_devices_first_then_the_lowest_free_ones():
    workers = lanes('[[workers]]\nname = "short"\nlanes = ["short"]\ngpu = 3\n'
                    '[[workers]]\nname = "long"\nlanes = ["long"]\nreplicas = "fill"\n')
    assert plan(workers, 4) == [("short", (3,)), ("long", (0,)), ("long-2", (1,)),
                                ("long-3", (2,))]


def test_a_gpu_past_the_visible_ones_is_refused():
    workers = lanes('[[workers]]\nname = "short"\nlanes = ["short"]\ndevices = [4, 5]\n'
                    "engine = {tensor_parallel_size = 2}\n"
                    '[[workers]]\nname = "long"\nlanes = ["long"]\n')
    with pytest.raises(ConfigError, match=r"'short' is given GPU 4, 5, but this process sees 4 "
                                          r"\(numbered 0-3, within CUDA_VISIBLE_DEVICES\)"):
        place_workers(workers, "cuda", gpus=4)


SHARING = ('[[workers]]\nname = "short"\nlanes = ["short"]\ndevices = [0]\n{short}'
           '[[workers]]\nname = "long"\nlanes = ["long"]\ndevices = [0]\n{long}')


@pytest.mark.parametrize("short,long,error", [
    ("", "", r"GPU 0 is named by workers 'short', 'long': .* 'short', 'long' set none"),
    ("engine = {gpu_memory_utilization = 0.3}\n", "",
     r"GPU 0 is named by workers 'short', 'long': .*gpu_memory_utilization.* 'long' set none"),
    ("engine = {gpu_memory_utilization = 0.6}\n", "engine = {gpu_memory_utilization = 0.5}\n",
     r"add up to 1.1: more than the whole GPU"),
])
def test_overlapping_devices_are_refused_unless_each_sizes_its_share(short, long, error):
    with pytest.raises(ConfigError, match=error):
        place_workers(lanes(SHARING.format(short=short, long=long)), "cuda", gpus=1)


def test_a_one_gpu_host_runs_both_workers_on_shares_of_it():
    workers = lanes(SHARING.format(short="engine = {gpu_memory_utilization = 0.3}\n",
                                   long="engine = {gpu_memory_utilization = 0.6}\n"))
    assert plan(workers, 1) == [("short", (0,)), ("long", (0,))]


def test_cuda_visible_devices_numbers_the_gpus_and_its_entries_pin_them():
    """CUDA_VISIBLE_DEVICES=4,5,6,7: the process sees 4 GPUs, 0-3; worker 'long' on devices
    2,3 is told CUDA_VISIBLE_DEVICES=6,7 (and vLLM numbers those 0, 1 in it)."""
    visible = visible_gpus({"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert visible == ("4", "5", "6", "7")
    placed = place_workers(lanes(SHIPPED, TP2), "cuda", gpus=visible).workers
    assert [(w.devices, w.pin.env()["CUDA_VISIBLE_DEVICES"]) for w in placed] == [
        ((0, 1), "4,5"), ((2, 3), "6,7")]
    assert placed[1].label() == "GPUs 6,7 (devices 2,3 of CUDA_VISIBLE_DEVICES)"
    uuids = place_workers(TWO, "cuda", gpus=("GPU-aa", "GPU-bb")).workers
    assert [w.pin.gpus for w in uuids] == [("GPU-aa",), ("GPU-bb",)]


@pytest.mark.parametrize("value,visible", [
    ("0,1", ("0", "1")), (" 2, 3 ", ("2", "3")), ("", ()), ("1,-1,2", ("1",)),
    ("GPU-8f2a,MIG-1c3d", ("GPU-8f2a", "MIG-1c3d")),
])
def test_visible_gpus_read_as_cuda_reads_the_variable(value, visible):
    assert parse_visible(value) == visible
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": value}) == visible


def test_no_visible_gpu_on_a_cuda_host_is_refused():
    with pytest.raises(ConfigError, match="no GPU is visible"):
        place_workers(TWO, "cuda", gpus=())


# --- CPU hosts ---------------------------------------------------------------------------

@pytest.mark.parametrize("cores,expected", [
    ([0, 1], [(0,), (1,)]),
    ([0, 1, 2, 3, 4], [(0, 1, 2), (3, 4)]),
    ([4, 6], [(4,), (6,)]),
    ([0], [(0,), (0,)]),  # fewer cores than engines: shared, not refused
])
def test_cpu_cores_are_split_disjointly(cores, expected):
    assert [p.cores for p in place_workers(TWO, "cpu", cores=cores).pins] == expected


def test_on_a_cpu_host_fill_is_one_worker_and_replicas_split_the_cores():
    assert [w.name for w in place_workers(lanes(SHIPPED), "cpu", cores=[0, 1]).workers] == \
        ["short", "long"]
    workers = lanes('[[workers]]\nname = "short"\nlanes = ["short"]\ngpu = 1\n'
                    '[[workers]]\nname = "long"\nlanes = ["long"]\nreplicas = 2\n')
    placement = place_workers(workers, "cpu", cores=[0, 1, 2, 3, 4, 5])
    assert [(w.name, w.pin.cores) for w in placement.workers] == [
        ("short", (0, 1)), ("long", (2, 3)), ("long-2", (4, 5))]
    assert placement.notes() == ["devices of short ignored: this is a CPU host (the cores are "
                                 "split between the workers)"]


def test_the_shipped_files_fill_a_gpu_host_and_run_one_engine_per_core_on_a_cpu_host():
    from tailguard.lanes.table import cpu_lanes_path

    shipped = load_lanes(default_lanes_path()).workers
    assert [w.name for w in place_workers(shipped, "cpu", cores=[0, 1]).workers] == ["engine"]
    assert plan(shipped, 4) == [("engine", (0,)), ("engine-2", (1,)), ("engine-3", (2,)),
                                ("engine-4", (3,))]
    cpu = load_lanes(cpu_lanes_path()).workers
    assert [(w.name, w.pin.cores) for w in place_workers(cpu, "cpu", cores=[0, 1]).workers] == \
        [("engine", (0,)), ("engine-2", (1,))]


def test_up_checks_the_engine_tables_against_vllm_before_it_places_anything(tmp_path):
    """`tailguard up`'s plan: the issue's typo stops it with the field, its file and the
    closest name; without an engine table vLLM is not even imported."""
    import importlib.util

    from tailguard.launch.worker_placement import plan_workers

    assert [w.name for w in plan_workers(load_lanes(default_lanes_path()), "cpu").workers] == \
        ["engine"]
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    path = tmp_path / "lanes.toml"
    path.write_text(LANES + SHIPPED.replace('replicas = "fill"',
                                            "engine = {tensor_paralel_size = 2}"))
    with pytest.raises(ConfigError, match=f"^{path}: workers\\[1\\].engine.tensor_paralel_size: "
                                          "not one of vLLM's engine arguments; closest: "
                                          "tensor_parallel_size"):
        plan_workers(load_lanes(path), "cuda")
