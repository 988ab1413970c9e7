"""A model named by TAILGUARD_MODEL, as a local directory: a path, the Hugging Face cache, or
a download.

Why before anything starts: the API and every worker need the same files. A hub id that
each process resolves on its own makes each worker download it (or, offline, exit and be
restarted toward a crash loop) while the API's tokenizer finds nothing; one resolution up
front gives them a local path, or gives the operator one error and starts nothing.

The Hugging Face environment (HF_HUB_CACHE, HF_HOME, HF_HUB_OFFLINE, HF_ENDPOINT) is read
when asked, not when huggingface_hub was imported, with huggingface_hub's precedence.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tailguard import settings
from tailguard.errors import ConfigError

#: What the engine and the API's tokenizer read besides the weights (vLLM's own selection).
META_PATTERNS = ("*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken")
#: Weights in the order vLLM prefers them: safetensors, else PyTorch pickles.
WEIGHT_PATTERNS = (("*.safetensors",), ("*.bin", "*.pt"))
#: Files a served model must have; the API counts prompt tokens with tokenizer.json.
REQUIRED_FILES = ("config.json", "tokenizer.json")


def _true(raw: str | None) -> bool:
    return (raw or "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE, which transformers also honours) is set."""
    return _true(os.environ.get("HF_HUB_OFFLINE")) or _true(os.environ.get("TRANSFORMERS_OFFLINE"))


def hub_cache_dir() -> Path:
    """huggingface_hub's cache: HF_HUB_CACHE, else $HF_HOME/hub, else
    $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    hf_home = os.environ.get("HF_HOME")
    if hf_home:
        return Path(hf_home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def missing_files(folder: Path) -> list[str]:
    """What `folder` lacks to be served: the required files, and weights of some kind.

    A cached snapshot holds symlinks into the cache's blobs: a dangling one is missing too.
    """
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if not any(p.is_file() for patterns in WEIGHT_PATTERNS for pattern in patterns
               for p in folder.glob(pattern)):
        missing.append("weights (*.safetensors or *.bin)")
    return missing


def cached_snapshot(repo_id: str) -> Path | None:
    """The snapshot directory of `repo_id`'s main revision in the local cache, or None."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, cache_dir=hub_cache_dir(), local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, not a valid id, no hub library: None
        return None


def _download(repo_id: str) -> Path:
    """snapshot_download of what serving needs (its progress bars on stderr)."""
    from huggingface_hub import snapshot_download

    common = dict(cache_dir=hub_cache_dir(), endpoint=os.environ.get("HF_ENDPOINT") or None)
    folder = Path(snapshot_download(repo_id, allow_patterns=[*META_PATTERNS, *WEIGHT_PATTERNS[0]],
                                    **common))
    if missing_files(folder):  # no safetensors: the older weight format, as vLLM falls back
        folder = Path(snapshot_download(repo_id, allow_patterns=list(WEIGHT_PATTERNS[1]), **common))
    return folder


def _unavailable(model: str, why: str) -> ConfigError:
    return ConfigError(f"{settings.MODEL.env}={model!r}: {why}", field=settings.MODEL.env)


def resolve_model(model: str, say: Callable[[str], None] = lambda _line: None) -> Path:
    """The local directory to serve `model` from, or one ConfigError saying what is missing.

    A directory is used as it is. A hub id is looked up in the local cache; if it is not
    there (or incomplete) and HF_HUB_OFFLINE is not set, it is downloaded, with progress.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        missing = missing_files(path)
        if missing:
            raise _unavailable(model, f"the directory {path} has no {', '.join(missing)}")
        return path
    cache = hub_cache_dir()
    cached = cached_snapshot(model)
    if cached is not None and not missing_files(cached):
        return cached
    found = (f"its cached snapshot {cached} has no {', '.join(missing_files(cached))}" if cached
             else f"no such directory, and not in the Hugging Face cache {cache}")
    if hub_offline():
        raise _unavailable(model, f"{found}; HF_HUB_OFFLINE is set, so it is not downloaded. "
                           f"Download it where the hub is reachable (`hf download {model}` "
                           f"into this cache) or point {settings.MODEL.env} at a model directory")
    say(f"downloading {model} from the Hugging Face hub into {cache}")
    try:
        folder = _download(model)
    except Exception as exc:  # noqa: BLE001 - unreachable hub, unknown or gated repo: one error
        raise _unavailable(model, f"{found}, and the download failed ({_first_line(exc)}). On a "
                           "host that cannot reach the hub, download it where one can (`hf "
                           f"download {model}` into this cache) or point {settings.MODEL.env} "
                           "at a model directory; HF_HUB_OFFLINE=1 skips the attempt") from None
    missing = missing_files(folder)
    if missing:
        raise _unavailable(model, f"downloaded into {folder}, which has no {', '.join(missing)}")
    return folder


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
