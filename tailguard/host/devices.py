"""What accelerators this host has: the device kind workers are placed on."""

from __future__ import annotations

import shutil
import subprocess

from tailguard import settings
from tailguard.errors import ConfigError


def gpu_count() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def device_kind() -> str:
    kind = settings.DEVICE.get()
    if kind not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"{settings.DEVICE.env} must be auto, cpu or cuda, got {kind!r}",
                          field=settings.DEVICE.env)
    if kind == "auto":
        return "cuda" if gpu_count() > 0 else "cpu"
    return kind
