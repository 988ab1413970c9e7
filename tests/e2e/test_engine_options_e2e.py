"""A lanes file's engine table and a model's generation config, on a real vLLM engine.

One engine on a copy of the tiny demo model whose generation_config.json asks for greedy
sampling (temperature 0), built with a worker's engine table from a lanes file. Every
assertion is on what the engine produced.
"""

from __future__ import annotations

import json
import shutil
import tomllib

import pytest
from conftest import GPU_SHARE

from tailguard.engine.host import EngineConfig, EngineHost
from tailguard.lanes.table import parse_lanes
from tailguard.model.info import serving_dtype

pytestmark = pytest.mark.e2e

LANES = """
[engine]
max_num_batched_tokens = 2048

[lanes.short]
max_tokens = 64
max_model_len = 1024

[[workers]]
name = "short"
lanes = ["short"]
engine = {enable_prefix_caching = false}
"""
PROMPT = "the quick brown fox"
TOKENS = {"max_tokens": 24, "ignore_eos": True}


@pytest.fixture(scope="module")
def host(tiny_model, tmp_path_factory):
    model = tmp_path_factory.mktemp("models") / "tiny-greedy"
    shutil.copytree(tiny_model, model)
    config_path = model / "generation_config.json"
    generation = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**generation, "temperature": 0.0}))
    options = parse_lanes(tomllib.loads(LANES)).worker("short").engine
    engine = EngineHost(EngineConfig(model=str(model), max_num_seqs=4, max_model_len=1024,
                                     dtype=serving_dtype(str(model)), log_stats=False,
                                     extra={**options, **GPU_SHARE}))
    engine.start()
    yield engine
    engine.shutdown()


def test_the_models_generation_config_is_read(host):
    assert host.sampling_defaults == {"temperature": 0.0}


def test_a_request_without_temperature_samples_as_the_model_says(host):
    """temperature 0 from the model: greedy, so the seed changes nothing."""
    texts = {host.generate(f"greedy-{seed}", PROMPT, {**TOKENS, "seed": seed}, deadline_s=60).text
             for seed in (1, 2, 3)}
    assert len(texts) == 1


def test_a_request_that_sets_temperature_keeps_its_own(host):
    """temperature 1.0 from the client: sampled, so the seed changes the text."""
    texts = {host.generate(f"sampled-{seed}", PROMPT, {**TOKENS, "seed": seed,
                                                       "temperature": 1.0}, deadline_s=60).text
             for seed in (1, 2, 3)}
    assert len(texts) > 1
