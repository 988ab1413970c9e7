"""Where the Batch API keeps file contents: a directory on this host (0700, files 0600), or an
fsspec URL (``s3://bucket/prefix``, or any filesystem fsspec opens) that several API hosts share.
Metadata is in Redis (``store``); a file's contents are named by its id alone."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import BinaryIO

from tailguard.errors import ConfigError


class Contents:
    """File contents by id. Local writes are atomic (a temporary file renamed into place), so
    a reader never sees half a file and a rewrite (a feeder finalizing again) is harmless."""

    def __init__(self, location: str) -> None:
        self.location = location.rstrip("/")
        self._fs = None
        if "://" in location:
            try:
                import fsspec
            except ImportError:  # pragma: no cover - depends on the install
                raise ConfigError(f"TAILGUARD_BATCH_STORAGE={location!r} is a URL, which needs the "
                                  "fsspec package (pip install fsspec, and s3fs for s3://)",
                                  field="TAILGUARD_BATCH_STORAGE") from None
            self._fs, self._root = fsspec.core.url_to_fs(location)
            self._fs.makedirs(self._root, exist_ok=True)
        else:
            self._dir = Path(location)
            self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self._dir, 0o700)

    def put(self, file_id: str, data: bytes | BinaryIO) -> None:
        """Store `data`: bytes, or a stream copied in chunks (an upload is never held whole)."""
        if self._fs is not None:
            with self._fs.open(f"{self._root}/{file_id}", "wb") as out:
                _write(out, data)
            return
        tmp = self._dir / f".{file_id}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            _write(out, data)
        os.replace(tmp, self._dir / file_id)

    def get(self, file_id: str) -> bytes | None:
        """The contents, or None when there are none (deleted, or never written)."""
        try:
            if self._fs is not None:
                with self._fs.open(f"{self._root}/{file_id}", "rb") as src:
                    return src.read()
            return (self._dir / file_id).read_bytes()
        except FileNotFoundError:
            return None

    def read_range(self, file_id: str, start: int, end: int) -> bytes | None:
        """Bytes `start` to `end` of the contents, or None when there are none."""
        try:
            if self._fs is not None:
                return self._fs.cat_file(f"{self._root}/{file_id}", start=start, end=end)
            with open(self._dir / file_id, "rb") as src:
                src.seek(start)
                return src.read(end - start)
        except FileNotFoundError:
            return None

    def delete(self, file_id: str) -> None:
        try:
            if self._fs is not None:
                self._fs.rm(f"{self._root}/{file_id}")
            else:
                (self._dir / file_id).unlink()
        except FileNotFoundError:
            pass


#: the chunk a stream is copied in
CHUNK_BYTES = 1 << 20


def _write(out: BinaryIO, data: bytes | BinaryIO) -> None:
    if isinstance(data, bytes | bytearray):
        out.write(data)
    else:
        shutil.copyfileobj(data, out, CHUNK_BYTES)


def stream_size(stream: BinaryIO) -> int:
    """The bytes left in a seekable stream, read from its position without reading them."""
    here = stream.tell()
    end = stream.seek(0, os.SEEK_END)
    stream.seek(here)
    return end - here
