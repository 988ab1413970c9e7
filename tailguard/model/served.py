"""Which model this deployment serves: TAILGUARD_MODEL, else the demo model (built once)."""

from __future__ import annotations

import fcntl
from pathlib import Path

from tailguard import settings

DEMO_NOTICE = ("serving the random-weight demo model: its text is noise. Point TAILGUARD_MODEL at a "
               "model directory or a Hugging Face id to serve a real one.")


def demo_model_dir(size: str | None = None) -> Path:
    return settings.home() / "models" / f"demo-{size or settings.DEMO_SIZE.get()}"


def ensure_demo_model(size: str | None = None) -> Path:
    """Build the demo model unless it is there; safe when several processes start at once."""
    from tailguard.model.demo import build_demo_model, is_demo_model

    size = size or settings.DEMO_SIZE.get()
    path = demo_model_dir(size)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".demo-{size}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_demo_model(path, size):
            build_demo_model(path, size=size)
    return path


def served_model() -> tuple[str, bool]:
    """(model, is_demo). Builds the demo model when no model is configured."""
    model = settings.MODEL.get()
    if model:
        return model, False
    return str(ensure_demo_model()), True
