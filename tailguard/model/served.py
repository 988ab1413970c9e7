"""Which model this deployment serves, as local files: TAILGUARD_MODEL resolved (a directory,
the Hugging Face cache, or a download), else the default model, converted once.

Every process resolves it the same way (`tailguard up` once, before it starts anything, and
hands its children the local path), and a model built here (the default model, a demo
model) is built under a lock, so processes that start at once build it once.
"""

from __future__ import annotations

import fcntl
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tailguard import settings
from tailguard.model import bundled
from tailguard.model.hub import resolve_model

DEMO_NOTICE = ("serving a random-weight demo model: its text is noise. Leave TAILGUARD_MODEL "
               f"empty to serve {bundled.SERVED_NAME}, or point it at a model directory or a "
               "Hugging Face id.")


def _stderr(line: str) -> None:
    print(f"tailguard: {line}", file=sys.stderr, flush=True)


def build_once(path: Path, is_current: Callable[[Path], bool], build: Callable[[Path], object]
               ) -> Path:
    """`path` once it holds a current build: built by `build(tmp)` into a fresh sibling
    directory and moved into place, unless `is_current(path)` already.

    An exclusive lock beside it makes processes that start at once build it once (the
    others wait, then find it current); an interrupted build leaves `path` as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_current(path):
            return path
        fresh, stale = (path.parent / f".{path.name}.{what}" for what in ("building", "stale"))
        for leftover in (fresh, stale):
            shutil.rmtree(leftover, ignore_errors=True)
        fresh.mkdir()
        build(fresh)
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            path.rename(stale)
        fresh.rename(path)
        shutil.rmtree(stale, ignore_errors=True)
    return path


def demo_model_dir(size: str | None = None) -> Path:
    return settings.home() / "models" / f"demo-{size or settings.DEMO_SIZE.get()}"


def ensure_demo_model(size: str | None = None) -> Path:
    """The random-weight demo model of `size` (TAILGUARD_DEMO_SIZE), built unless it is there."""
    from tailguard.model.demo import build_demo_model, is_demo_model

    size = size or settings.DEMO_SIZE.get()
    return build_once(demo_model_dir(size), lambda p: is_demo_model(p, size),
                      lambda fresh: build_demo_model(fresh, size=size))


def bench_model() -> str:
    """What `tailguard bench` and `tailguard plan --profile-out` run by default: TAILGUARD_MODEL
    (resolved to local files), else the random-weight demo model, whose latency is a real
    model's and whose fixed output lengths the synthetic workloads ask for."""
    if settings.MODEL.get():
        return prepare_served_model().path
    return str(ensure_demo_model())


def bundled_model_dir() -> Path:
    return settings.home() / "models" / bundled.SERVED_NAME


def ensure_bundled_model(path: Path | None = None,
                         say: Callable[[str], None] = _stderr) -> Path:
    """The default model converted for this host in `path` (bundled_model_dir()): converted
    when missing, or when its record says it was built from something else."""
    source = bundled.gguf_source()
    dtype = bundled.serving_dtype_for(bundled.cpu_flags(), bundled.cuda_engine_installed())
    wanted = bundled.wanted_record(source, dtype)
    return build_once(path or bundled_model_dir(), lambda p: bundled.built_from(p) == wanted,
                      lambda fresh: bundled.build(fresh, source, dtype, say))


@dataclass(frozen=True)
class ServedModel:
    """The model every process of a deployment serves."""

    path: str  # a local directory
    is_demo: bool  # random weights: its text is noise
    #: the name clients use when it is not the path's own (a hub id, resolved to the cache)
    name: str | None = None

    def env(self) -> dict[str, str]:
        """What the API and the workers are started with, so they serve exactly this."""
        env = {settings.MODEL.env: self.path}
        if self.name:
            env[settings.SERVED_MODEL_NAME.env] = self.name
        return env


def prepare_served_model(say: Callable[[str], None] = _stderr) -> ServedModel:
    """The served model as local files (downloaded or converted first if need be); a
    ConfigError when it cannot be had."""
    from tailguard.model.demo import MARKER_FILE as DEMO_MARKER

    configured = settings.MODEL.get()
    if not configured:
        return ServedModel(str(ensure_bundled_model(say=say)), is_demo=False)
    path = resolve_model(configured, say)
    from_hub = not Path(configured).expanduser().is_dir()
    name = configured if from_hub and not settings.SERVED_MODEL_NAME.get() else None
    return ServedModel(str(path) if from_hub else configured,
                       is_demo=(path / DEMO_MARKER).is_file(), name=name)


def served_model(say: Callable[[str], None] = _stderr) -> tuple[str, bool]:
    """(local directory, is_demo) of the served model: prepare_served_model's."""
    served = prepare_served_model(say)
    return served.path, served.is_demo
