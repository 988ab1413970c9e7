"""What can be read about a model from its files alone (no torch, no vLLM)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path


def resolve_model_dir(model: str) -> Path | None:
    """A local directory for `model`: the path itself, or the Hugging Face cache (offline)."""
    path = Path(model)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, no hub library: the caller decides
        return None


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
    """The dtype to give vLLM: the configured one, else what a demo model records, else auto."""
    if configured:
        return configured
    from tailguard.model.demo import MARKER_FILE  # torch is imported only when building

    try:
        meta = json.loads((Path(model) / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return "auto"
    return meta.get("dtype") or "auto"


DEMO_SERVED_NAME = "tailguard-demo"


def served_model_names(model: str, configured: str = "") -> list[str]:
    """Names a client may put in `model`: the public one first, then the model itself."""
    if configured:
        public = configured
    else:
        folder = Path(model)
        from tailguard.model.demo import MARKER_FILE  # torch is imported only when building

        public = DEMO_SERVED_NAME if (folder / MARKER_FILE).is_file() else model
    return [public] if public == model else [public, model]
