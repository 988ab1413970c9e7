"""A lanes file's engine table and a model's generation config, on a real vLLM engine.

The session's one EngineHost (tests/e2e_fixtures.py's `engine_host`): on a copy of the tiny
demo model whose generation_config.json asks for greedy sampling (temperature 0), built with
the engine table of a lanes file's worker (ENGINE_HOST_LANES). Every assertion is on what the
engine produced.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e

PROMPT = "the quick brown fox"
TOKENS = {"max_tokens": 24, "ignore_eos": True}


def test_the_models_generation_config_is_read(engine_host):
    assert engine_host.sampling_defaults == {"temperature": 0.0}


def test_a_request_without_temperature_samples_as_the_model_says(engine_host):
    """temperature 0 from the model: greedy, so the seed changes nothing."""
    texts = {engine_host.generate(f"greedy-{seed}", PROMPT, {**TOKENS, "seed": seed},
                                  deadline_s=60).text
             for seed in (1, 2, 3)}
    assert len(texts) == 1


def test_a_request_that_sets_temperature_keeps_its_own(engine_host):
    """temperature 1.0 from the client: sampled, so the seed changes the text."""
    texts = {engine_host.generate(f"sampled-{seed}", PROMPT, {**TOKENS, "seed": seed,
                                                              "temperature": 1.0},
                                  deadline_s=60).text
             for seed in (1, 2, 3)}
    assert len(texts) > 1
