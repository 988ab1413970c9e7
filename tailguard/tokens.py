"""Counting prompt tokens with the served model's own tokenizer.

The API needs the exact count the engine will see (cost, lane choice, context
check) but must never import torch or vLLM: it loads only the tokenizer.
"""

from __future__ import annotations

import threading
from functools import lru_cache

from tailguard.errors import ConfigError
from tailguard.modelinfo import model_max_len, resolve_model_dir


class PromptCounter:
    """Tokenizer of one model, thread-safe for counting."""

    def __init__(self, model: str) -> None:
        folder = resolve_model_dir(model)
        if folder is None:
            raise ConfigError(f"cannot find model {model!r} locally (a directory, or a Hugging Face "
                              "id already in the local cache)", field="TAILGUARD_MODEL")
        # transformers' tokenizer classes do not import torch; vLLM counts with the same one.
        from transformers import AutoTokenizer

        self.model = model
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.model_max_len = model_max_len(model)
        self._lock = threading.Lock()  # fast tokenizers are not safe to share mid-call

    def count(self, prompt: str) -> int:
        """Prompt tokens as vLLM counts them (special tokens such as BOS included)."""
        with self._lock:
            return len(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])


@lru_cache(maxsize=4)
def counter_for(model: str) -> PromptCounter:
    """One counter per model per process: loading a tokenizer takes a while."""
    return PromptCounter(model)
