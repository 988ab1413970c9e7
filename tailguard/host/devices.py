"""What accelerators this host has: the device kind workers are placed on, and its GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.host.cores import GPU_ENV


def gpu_count() -> int:
    """Every GPU nvidia-smi lists (NVML ignores CUDA_VISIBLE_DEVICES); 0 without it."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def parse_visible(value: str) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES's entries as CUDA reads them: up to the first empty or negative
    one (CUDA ignores it and every entry after it)."""
    out: list[str] = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry or entry.startswith("-"):
            break
        out.append(entry)
    return tuple(out)


def visible_gpus(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The GPUs this process may use, in the order vLLM numbers them (0, 1, ...), each as a
    CUDA_VISIBLE_DEVICES entry: that variable's entries when it is set, else every GPU
    nvidia-smi lists, by number."""
    if GPU_ENV in environ:
        return parse_visible(environ[GPU_ENV])
    return tuple(str(i) for i in range(gpu_count()))


def device_kind() -> str:
    """``cuda`` or ``cpu``: TAILGUARD_DEVICE, or on ``auto`` whether a GPU is visible."""
    kind = settings.DEVICE.get()
    if kind not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"{settings.DEVICE.env} must be auto, cpu or cuda, got {kind!r}",
                          field=settings.DEVICE.env)
    if kind == "auto":
        return "cuda" if visible_gpus() else "cpu"
    return kind
