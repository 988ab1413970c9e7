"""Secrets `tailguard up` generates once and keeps in $TAILGUARD_HOME (flower.auth, redis.password),
and files that hold one: never readable by others, not even for an instant."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

from tailguard import settings


def kept_secret(path: Path, make: Callable[[], str] = lambda: secrets.token_urlsafe(24)) -> str:
    """The secret in `path`, made first if the file does not exist.

    The file is created with mode 600 in the same call that creates it (O_EXCL), so it
    is never readable by others, not even between a write and a chmod.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(make() + "\n")
    return path.read_text().strip()


def write_private(path: Path, text: str) -> Path:
    """Write `path` anew with mode 600: a fresh file (O_EXCL) renamed over the old one."""
    tmp = path.with_name(path.name + ".new")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return path


def private_dir(path: Path) -> Path:
    """`path` as a directory only its owner can enter (0700), made if missing and tightened if
    it was made looser before: what it holds (prompts and outputs in Redis's AOF, secrets,
    logs) is nobody else's to read, whatever the files' own modes."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def embedded_redis_password() -> str:
    """The embedded Redis's password, made on first use (mode 600, next to flower.auth)."""
    return kept_secret(private_dir(settings.home()) / settings.REDIS_PASSWORD_FILE)
