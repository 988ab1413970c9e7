"""Counting prompt tokens with the served model's own tokenizer.

The API needs the count the engine will see (cost, lane choice, context check)
but must never import torch or vLLM, and transformers' AutoTokenizer imports
torch. So this loads the model's `tokenizer.json` with the bare `tokenizers`
library and applies what transformers would add on top: a BOS token when
tokenizer_config.json asks for one and the post-processor does not add it.
The end-to-end tests check this count against the engine's own.
"""

from __future__ import annotations

import json
from functools import lru_cache

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.model.info import model_max_len, resolve_model_dir


class PromptCounter:
    """Tokenizer of one model. `tokenizers` encodes are thread-safe and release the GIL."""

    def __init__(self, model: str) -> None:
        from tokenizers import Tokenizer

        folder = resolve_model_dir(model)
        if folder is None or not (folder / "tokenizer.json").is_file():
            raise ConfigError(f"cannot find a tokenizer.json for model {model!r} locally (a "
                              "directory, or a Hugging Face id already in the local cache)",
                              field=settings.MODEL.env)
        self.model = model
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.model_max_len = model_max_len(model)
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.tokenizer_config = config
        self._bos_id = self._forced_bos_id(config)

    def _forced_bos_id(self, config: dict) -> int | None:
        """The BOS id to prepend, when the config wants one that the post-processor omits."""
        if not config.get("add_bos_token"):
            return None
        bos = config.get("bos_token")
        if isinstance(bos, dict):
            bos = bos.get("content")
        bos_id = self.tokenizer.token_to_id(bos) if bos else None
        if bos_id is None or self.tokenizer.encode("a").ids[:1] == [bos_id]:
            return None
        return bos_id

    def encode(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids as vLLM's tokenizer produces them (with special tokens such as BOS,
        unless the prompt is a rendered chat template)."""
        ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self._bos_id is not None:
            return [self._bos_id, *ids]
        return ids

    def count(self, prompt: str, add_special_tokens: bool = True) -> int:
        return len(self.encode(prompt, add_special_tokens))


@lru_cache(maxsize=4)
def counter_for(model: str) -> PromptCounter:
    """One counter per model per process: loading a tokenizer takes a while."""
    return PromptCounter(model)
