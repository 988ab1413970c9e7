"""The lanes file's engine tables: parsed and kept without vLLM, checked against vLLM's own
EngineArgs where vLLM may be imported, and turned into the engine's arguments."""

import dataclasses
import importlib.util
import tomllib
from typing import Any, Literal

import pytest

from tailguard.engine.host import EngineConfig, engine_args, with_model_defaults
from tailguard.errors import ConfigError
from tailguard.lanes.engine_options import check_against, describe, value_fits
from tailguard.lanes.table import default_lanes_path, load_lanes, parse_lanes

LANES = """
[lanes.short]
max_cost = 256
max_tokens = 64
dedicated = true

[lanes.long]
max_tokens = 512
"""
WORKERS = """
[[workers]]
name = "short"
lanes = ["short"]
{short}
[[workers]]
name = "long"
lanes = ["long"]
{long}
"""


def table(short: str = "", long: str = "", top: str = ""):
    return parse_lanes(tomllib.loads(top + LANES + WORKERS.format(short=short, long=long)))


def test_a_worker_engine_table_merges_over_the_files_and_is_kept_as_written():
    t = table(short="engine = {tensor_parallel_size = 2, enforce_eager = true}",
              top="[engine]\ngpu_memory_utilization = 0.8\nenforce_eager = false\n")
    short, long = t.workers
    assert short.engine == {"gpu_memory_utilization": 0.8, "enforce_eager": True,
                            "tensor_parallel_size": 2}
    assert long.engine == {"gpu_memory_utilization": 0.8, "enforce_eager": False}
    assert (short.devices_per_engine, long.devices_per_engine) == (2, 1)
    assert t.engine_tables == (
        ("engine", {"gpu_memory_utilization": 0.8, "enforce_eager": False}),
        ("workers[0].engine", {"tensor_parallel_size": 2, "enforce_eager": True}))


def test_the_shipped_file_has_no_engine_table_to_check():
    assert load_lanes(default_lanes_path()).engine_tables == ()


@pytest.mark.parametrize("short,top,field,message", [
    ("engine = 2", "", "workers[0].engine", "must be a table"),
    ("engine = {max_num_seqs = 64}", "", "workers[0].engine.max_num_seqs",
     "tailguard sets max_num_seqs itself; set it with the lanes' max_num_seqs"),
    ("", "[engine]\nmodel = \"x\"\n", "engine.model", "TAILGUARD_MODEL"),
    ("engine = {max_model_len = 8192}", "", "workers[0].engine.max_model_len", "max_model_len"),
    ("engine = {dtype = \"half\"}", "", "workers[0].engine.dtype", "TAILGUARD_DTYPE"),
    ("engine = {scheduling_policy = \"fcfs\"}", "", "workers[0].engine.scheduling_policy",
     "the worker's lanes"),
    ("engine = {tensor_parallel_size = 0}", "", "workers[0].engine.tensor_parallel_size",
     "integer >= 1"),
    ("engine = {tensor_parallel_size = \"2\"}", "", "workers[0].engine.tensor_parallel_size",
     "integer >= 1"),
    ("devices = [0]\nengine = {tensor_parallel_size = 2}", "", "workers[0].devices",
     "names 1 GPU(s), but its engine takes 2"),
    ("devices = [0, 0]", "", "workers[0].devices", "names a GPU twice"),
    ("devices = [-1]", "", "workers[0].devices", "GPU numbers >= 0"),
    ("devices = []", "", "workers[0].devices", "non-empty list"),
    ("gpu = true", "", "workers[0].gpu", "a GPU number"),
    ("gpu = 0\ndevices = [0]", "", "workers[0].gpu", "not both"),
    ("devices = [0]\nreplicas = 2", "", "workers[0].replicas", "replicas must be 1"),
    ("replicas = 0", "", "workers[0].replicas", 'integer >= 1 or "fill"'),
    ("replicas = \"all\"", "", "workers[0].replicas", 'integer >= 1 or "fill"'),
])
def test_what_the_lanes_file_can_refuse_without_vllm_is_refused_at_load(short, top, field,
                                                                       message):
    with pytest.raises(ConfigError) as err:
        table(short=short, top=top)
    assert err.value.field == field and message in err.value.message


def test_fill_belongs_to_one_entry_and_replica_names_are_the_entrys():
    with pytest.raises(ConfigError, match='only one .* replicas = "fill"'):
        table(short='replicas = "fill"', long='replicas = "fill"')
    t = table(long="replicas = 3")
    assert [t.worker(n).name for n in ("long", "long-2", "long-3")] == ["long"] * 3
    for missing in ("long-4", "short-2", "long-1", "long-x"):
        with pytest.raises(ConfigError, match="no worker named"):
            t.worker(missing)
    clash = tomllib.loads(LANES + WORKERS.format(short="", long='replicas = "fill"')
                          + '[[workers]]\nname = "long-2"\nlanes = ["long"]\n')
    with pytest.raises(ConfigError, match="'long-2' takes the name of a replica of 'long'"):
        parse_lanes(clash)


# --- against EngineArgs (a stand-in dataclass with vLLM's kinds of annotations) ------------

@dataclasses.dataclass
class FakeEngineArgs:
    model: str = ""
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    quantization: str | None = None
    kv_cache_dtype: Literal["auto", "fp8", "bfloat16"] = "auto"
    max_num_batched_tokens: int | None = None
    cudagraph_capture_sizes: list[int] | None = None
    hf_overrides: dict[str, Any] | None = None
    compilation_config: "SomeVllmConfig" = None  # noqa: F821 - unresolvable: unchecked
    _private: int = 0


def test_an_unknown_engine_field_is_refused_with_its_file_and_the_closest_names(tmp_path):
    path = tmp_path / "lanes.toml"
    path.write_text(LANES + WORKERS.format(short="engine = {tensor_paralel_size = 2}", long=""))
    t = load_lanes(path)  # pure load: kept, not yet checked
    with pytest.raises(ConfigError) as err:
        check_against(t, FakeEngineArgs)
    assert err.value.field == "workers[0].engine.tensor_paralel_size"
    assert err.value.message.startswith(f"{path}: workers[0].engine.tensor_paralel_size: "
                                        "not one of vLLM's engine arguments; closest: "
                                        "tensor_parallel_size")
    with pytest.raises(ConfigError, match="no engine argument has a close name"):
        check_against(table(top="[engine]\nzzz = 1\n"), FakeEngineArgs)
    with pytest.raises(ConfigError, match="not one of vLLM's"):
        check_against(table(long="engine = {_private = 1}"), FakeEngineArgs)


@pytest.mark.parametrize("options", [
    "{tensor_parallel_size = 2, gpu_memory_utilization = 1}",  # an int is a float
    '{quantization = "awq", kv_cache_dtype = "fp8", enforce_eager = true}',
    "{max_num_batched_tokens = 8192, cudagraph_capture_sizes = [1, 2, 4]}",
    '{hf_overrides = {rope_theta = 1e6}, compilation_config = {level = 3}}',
])
def test_engine_tables_that_fit_the_annotations_pass(options):
    check_against(table(short=f"engine = {options}"), FakeEngineArgs)


@pytest.mark.parametrize("options,message", [
    ('{gpu_memory_utilization = "high"}', "vLLM takes a number, got 'high'"),
    ("{enforce_eager = 1}", "vLLM takes true or false, got 1"),
    ('{kv_cache_dtype = "fp4"}', "vLLM takes one of 'auto', 'fp8', 'bfloat16', got 'fp4'"),
    ("{max_num_batched_tokens = 1.5}", "vLLM takes an integer, got 1.5"),
    ('{cudagraph_capture_sizes = [1, "2"]}', "vLLM takes a list of an integer"),
    ("{quantization = 4}", "vLLM takes a string, got 4"),
    ("{hf_overrides = 3}", "vLLM takes a table"),
])
def test_a_value_the_annotation_rules_out_is_refused(options, message):
    with pytest.raises(ConfigError, match="workers\\[0\\].engine.") as err:
        check_against(table(short=f"engine = {options}"), FakeEngineArgs)
    assert message in err.value.message


@pytest.mark.parametrize("value,hint,fits", [
    (True, bool, True), (1, bool, False), (True, int, False), (2, float, True),
    ("x", int | None, False), (3, int | None, True), ("fp8", Literal["auto", "fp8"], True),
    (True, Literal[1, 8], False), (1, Literal[1, 8], True), ([1, 2], tuple[int, ...], True),
    ([1, "a"], list[int], False), ({"a": 1}, dict, True), ([], dict, False),
    ({}, FakeEngineArgs, None), ("x", str | FakeEngineArgs, True), (3, str | FakeEngineArgs, None),
])
def test_value_fits_says_yes_no_or_cannot_tell(value, hint, fits):
    assert value_fits(value, hint) is fits


def test_describe_reads_as_a_person_would():
    assert describe(int | None) == "an integer"
    assert describe(Literal[tuple(range(12))]).endswith(", ...")


def test_the_real_engine_args_refuse_the_issues_typo_and_pass_real_options():
    """vLLM's own EngineArgs (importing it takes seconds: this is the one test that does)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    from vllm.engine.arg_utils import AsyncEngineArgs

    with pytest.raises(ConfigError, match="closest: tensor_parallel_size"):
        check_against(table(short="engine = {tensor_paralel_size = 2}"), AsyncEngineArgs)
    with pytest.raises(ConfigError, match="kv_cache_dtype: vLLM takes one of 'auto'"):
        check_against(table(short='engine = {kv_cache_dtype = "fp9"}'), AsyncEngineArgs)
    check_against(table(
        short="engine = {tensor_parallel_size = 2, enforce_eager = true}",
        top='[engine]\ngpu_memory_utilization = 0.85\nkv_cache_dtype = "fp8"\n'
            'quantization = "fp8"\nmax_num_batched_tokens = 8192\ntrust_remote_code = true\n'
            'generation_config = "vllm"\nenable_prefix_caching = true\n'), AsyncEngineArgs)
    # every field tailguard derives is one of vLLM's: the refusals name real arguments
    from tailguard.lanes.engine_options import DERIVED, PARALLEL_SIZES

    names = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    assert set(DERIVED) <= names and set(PARALLEL_SIZES) <= names
    assert set(engine_args(EngineConfig(model="m"), "cpu")) <= names


# --- the engine's arguments ---------------------------------------------------------------

def test_cuda_graphs_on_a_gpu_and_eager_mode_on_a_cpu():
    config = EngineConfig(model="m", max_num_seqs=4, max_model_len=1024)
    assert engine_args(config, "cuda")["enforce_eager"] is False  # vLLM's default: CUDA graphs
    assert engine_args(config, "cpu")["enforce_eager"] is True
    eager = dataclasses.replace(config, extra={"enforce_eager": True, "seed": 7})
    assert engine_args(eager, "cuda")["enforce_eager"] is True  # the lanes file says so
    assert engine_args(eager, "cuda")["seed"] == 7
    assert {k: engine_args(config, "cuda")[k] for k in ("model", "max_num_seqs", "max_model_len")} \
        == {"model": "m", "max_num_seqs": 4, "max_model_len": 1024}


def test_a_workers_engine_table_reaches_its_engine(tiny_model, monkeypatch):
    from tailguard.worker.engine_config import engine_config

    monkeypatch.setenv("TAILGUARD_MODEL", str(tiny_model))
    t = table(short="engine = {tensor_parallel_size = 2, gpu_memory_utilization = 0.5}")
    options = t.worker("short").engine
    config = engine_config([t["short"], t["long"]], options)
    args = engine_args(config, "cuda")
    assert (args["tensor_parallel_size"], args["gpu_memory_utilization"]) == (2, 0.5)
    assert args["scheduling_policy"] == "priority"  # several lanes in it: tailguard's own
    assert "scheduling_policy" not in engine_args(engine_config([t["short"]], options), "cuda")


@pytest.mark.parametrize("request_kwargs,expected", [
    # nothing set: every model default
    ({"max_tokens": 8}, {"max_tokens": 8, "temperature": 0.6, "top_p": 0.9,
                         "repetition_penalty": 1.1}),
    # set, even to vLLM's neutral value: the request's own
    ({"max_tokens": 8, "temperature": 1.0, "repetition_penalty": 1.0},
     {"max_tokens": 8, "temperature": 1.0, "top_p": 0.9, "repetition_penalty": 1.0}),
])
def test_the_models_sampling_defaults_fill_only_what_a_request_leaves_out(request_kwargs,
                                                                          expected):
    defaults = {"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.1,
                "max_tokens": 4096}  # max_tokens: the lane's, never the model's
    assert with_model_defaults(request_kwargs, defaults) == expected
