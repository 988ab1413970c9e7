"""Batch API metadata in Redis (names from tailguard.redis.keys): files, batches, and each
running batch's line state; file contents through ``contents``.

A file or batch record is a hash; indexes are sorted sets by created_at, one of everything
and one per API key (a caller's listing reads its own). A batch's status moves only by a
compare-and-set on the Redis clock (set_batch_status.lua). While a batch runs, its lines are
a ``pending`` hash (line -> attempt: queued or running), a ``retry`` hash (line -> its next
attempt), and ``output`` / ``errors`` hashes of finished lines, a line written once in one of
the two (finish_batch_line.lua), so a collector that runs twice writes nothing twice; they go
when its files are written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, BinaryIO

import redis

from tailguard.batches.contents import Contents, stream_size
from tailguard.batches.objects import ENDED, batch_object, decode, encode, file_object
from tailguard.redis import keys, lua


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class BatchStore:
    """Files and batches of one Redis and one contents store; share freely between threads."""

    def __init__(self, client: redis.Redis, contents: Contents, *, output_ttl_s: int) -> None:
        self.redis = client
        self.contents = contents
        #: how long output and error files, and an ended batch's record, are kept
        self.output_ttl_s = output_ttl_s
        self._set_status = lua.Script(client, "clock", "set_batch_status")
        self._finish_line = lua.Script(client, "finish_batch_line")

    def now(self) -> int:
        sec, _ = self.redis.time()
        return int(sec)

    def _order(self) -> float:
        """An index's score: the Redis clock to the microsecond, so that a listing is in the
        order things were made even within one second (created_at is whole seconds)."""
        sec, usec = self.redis.time()
        return sec + usec / 1e6

    # -- files ---------------------------------------------------------------------------

    def add_file(self, file_id: str, *, filename: str, purpose: str, owner: str | None,
                 data: bytes | BinaryIO, expires_at: int | None = None) -> dict[str, Any]:
        """Store the contents (bytes, or a seekable stream copied in chunks), then the record
        (a record never names missing contents)."""
        size = len(data) if isinstance(data, bytes | bytearray) else stream_size(data)
        self.contents.put(file_id, data)
        order = self._order()
        record = {"id": file_id, "bytes": size, "created_at": int(order),
                  "filename": filename, "purpose": purpose, "owner": owner or "",
                  "expires_at": expires_at}

        def write(pipe: Any) -> None:
            # a result file written again counts its change in size only, once however many
            # processes write it at once (the record is watched: redis-py's transaction)
            before = pipe.hget(keys.file_key(file_id), "bytes")
            pipe.multi()
            pipe.hset(keys.file_key(file_id), mapping=encode(record))
            for index in {keys.files_key(None), keys.files_key(owner or None)}:
                pipe.zadd(index, {file_id: order})
            if expires_at is not None:
                pipe.zadd(keys.FILES_EXPIRING, {file_id: expires_at})
            for total in {keys.files_bytes_key(None), keys.files_bytes_key(owner or None)}:
                pipe.incrby(total, size - int(before or 0))

        self.redis.transaction(write, keys.file_key(file_id))
        return record

    def file(self, file_id: str) -> dict[str, Any] | None:
        """The record of a file that exists and has not expired."""
        if not keys.is_file_id(file_id):
            return None
        raw = self.redis.hgetall(keys.file_key(file_id))
        if not raw:
            return None
        record = decode(raw)
        if record.get("expires_at") is not None and record["expires_at"] <= self.now():
            self.delete_file(record)
            return None
        return record

    def delete_file(self, record: Mapping[str, Any]) -> None:
        file_id = record["id"]
        pipe = self.redis.pipeline()
        pipe.delete(keys.file_key(file_id))
        for index in {keys.files_key(None), keys.files_key(record.get("owner") or None)}:
            pipe.zrem(index, file_id)
        pipe.zrem(keys.FILES_EXPIRING, file_id)
        deleted = pipe.execute()[0]
        if deleted and record.get("bytes"):
            for total in {keys.files_bytes_key(None), keys.files_bytes_key(record.get("owner") or None)}:
                self.redis.decrby(total, int(record["bytes"]))
        self.contents.delete(file_id)

    def delete_expired_files(self) -> int:
        """Delete the files whose time is up (batch outputs); how many."""
        due = self.redis.zrangebyscore(keys.FILES_EXPIRING, "-inf", self.now())
        for raw in due:
            record = decode(self.redis.hgetall(keys.file_key(_text(raw))))
            self.delete_file({**record, "id": _text(raw)})
        return len(due)

    def file_page(self, owner: str | None, after: str | None,
                  limit: int) -> tuple[list[dict[str, Any]], bool]:
        ids, has_more = self._page(keys.files_key(owner), after, limit)
        records = [r for r in (self.file(i) for i in ids) if r is not None]
        return [file_object(r) for r in records], has_more

    def stored_bytes(self, owner: str | None) -> int:
        """The bytes of the files of `owner` (None: of every file)."""
        return int(self.redis.get(keys.files_bytes_key(owner)) or 0)

    # -- batches -------------------------------------------------------------------------

    def add_batch(self, record: dict[str, Any], owner: str | None) -> None:
        batch_id, order = record["id"], self._order()
        pipe = self.redis.pipeline()
        pipe.hset(keys.batch_key(batch_id), mapping=encode({**record, "owner": owner or ""}))
        for index in {keys.batches_key(None), keys.batches_key(owner or None)}:
            pipe.zadd(index, {batch_id: order})
        pipe.sadd(keys.BATCHES_ACTIVE, batch_id)
        pipe.execute()

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        if not keys.is_batch_id(batch_id):
            return None
        raw = self.redis.hgetall(keys.batch_key(batch_id))
        return decode(raw) if raw else None

    def batch_view(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The public object, its request counts read from its line state (kept in the record
        once it ended)."""
        if record["status"] in ENDED and "completed" in record:
            return batch_object(record, int(record["completed"]), int(record["failed"]))
        done, failed = self.counts(record["id"])
        return batch_object(record, done, failed)

    def batch_page(self, owner: str | None, after: str | None,
                   limit: int) -> tuple[list[dict[str, Any]], bool]:
        ids, has_more = self._page(keys.batches_key(owner), after, limit)
        records = [r for r in (self.batch(i) for i in ids) if r is not None]
        return [self.batch_view(r) for r in records], has_more

    def active(self) -> list[str]:
        return sorted(_text(b) for b in self.redis.smembers(keys.BATCHES_ACTIVE))

    def batches_reading(self, file_id: str) -> list[str]:
        """The batches not yet ended whose input is `file_id`."""
        active = self.active()
        pipe = self.redis.pipeline()
        for batch_id in active:
            pipe.hget(keys.batch_key(batch_id), "input_file_id")
        return [b for b, f in zip(active, pipe.execute() if active else [])
                if f is not None and _text(f) == file_id]

    def running_of(self, owner: str) -> int:
        """How many of the batches not yet ended are `owner`'s."""
        pipe = self.redis.pipeline()
        for batch_id in self.active():
            pipe.hget(keys.batch_key(batch_id), "owner")
        return sum(1 for o in pipe.execute() if o is not None and _text(o) == owner)

    def set_status(self, batch_id: str, from_: set[str] | frozenset[str], to: str,
                   fields: Mapping[str, Any] | None = None) -> bool:
        """Move the batch to `to` if it is in one of `from_`, stamping ``<to>_at``; an end
        is counted (``keys.BATCHES_ENDED``) once, by the move that made it."""
        moved = bool(self._set_status([keys.batch_key(batch_id)], **{
            "from": sorted(from_), "to": to, "fields": encode(fields or {})}))
        if moved and to in ENDED:
            self.redis.hincrby(keys.BATCHES_ENDED, to, 1)
        return moved

    def set_fields(self, batch_id: str, fields: Mapping[str, Any]) -> None:
        self.redis.hset(keys.batch_key(batch_id), mapping=encode(fields))

    def ended(self, batch_id: str, completed: int, failed: int) -> None:
        """An ended batch: its counts kept in its record, its line state dropped, out of the
        feeder's set, its record kept as long as its files."""
        pipe = self.redis.pipeline()
        pipe.hset(keys.batch_key(batch_id), mapping={"completed": completed, "failed": failed})
        pipe.expire(keys.batch_key(batch_id), self.output_ttl_s)
        pipe.delete(*(keys.batch_lines_key(batch_id, p)
                      for p in ("pending", "retry", "output", "errors")))
        pipe.srem(keys.BATCHES_ACTIVE, batch_id)
        pipe.execute()

    # -- a running batch's lines -----------------------------------------------------------

    def pending(self, batch_id: str) -> dict[int, int]:
        """Line index -> attempt of the lines queued or running."""
        raw = self.redis.hgetall(keys.batch_lines_key(batch_id, "pending"))
        return {int(_text(k)): int(_text(v)) for k, v in raw.items()}

    def retries(self, batch_id: str) -> list[tuple[int, int]]:
        """(line index, its next attempt) of the lines to queue again, in line order."""
        raw = self.redis.hgetall(keys.batch_lines_key(batch_id, "retry"))
        return sorted((int(_text(k)), int(_text(v))) for k, v in raw.items())

    def queued(self, batch_id: str, index: int, attempt: int, next_index: int | None) -> None:
        """Line `index`'s attempt is queued: pending, no longer to retry, the cursor past it."""
        pipe = self.redis.pipeline()
        pipe.hset(keys.batch_lines_key(batch_id, "pending"), str(index), attempt)
        pipe.hdel(keys.batch_lines_key(batch_id, "retry"), str(index))
        if next_index is not None:
            pipe.hset(keys.batch_key(batch_id), "next", next_index)
        pipe.execute()

    def retry(self, batch_id: str, index: int, attempt: int) -> None:
        """Line `index` is to be queued again, as attempt `attempt`."""
        pipe = self.redis.pipeline()
        pipe.hset(keys.batch_lines_key(batch_id, "retry"), str(index), attempt)
        pipe.hdel(keys.batch_lines_key(batch_id, "pending"), str(index))
        pipe.execute()

    def finish_line(self, batch_id: str, index: int, line: str, ok: bool,
                    next_index: int | None = None) -> bool:
        """Line `index` ended with its output (`ok`) or error line: written once, in one of
        the two (finish_batch_line.lua); whether this call wrote it."""
        return bool(self._finish_line(
            [*(keys.batch_lines_key(batch_id, p) for p in ("output", "errors", "pending", "retry")),
             keys.batch_key(batch_id)],
            index=index, line=line, ok=ok,
            **({"next_index": next_index} if next_index is not None else {})))

    def counts(self, batch_id: str) -> tuple[int, int]:
        """Lines ended with an output line, and with an error line."""
        pipe = self.redis.pipeline()
        pipe.hlen(keys.batch_lines_key(batch_id, "output"))
        pipe.hlen(keys.batch_lines_key(batch_id, "errors"))
        done, failed = pipe.execute()
        return int(done), int(failed)

    def finished_lines(self, batch_id: str, part: str) -> dict[int, str]:
        raw = self.redis.hgetall(keys.batch_lines_key(batch_id, part))
        return {int(_text(k)): _text(v) for k, v in raw.items()}

    # -- listing -------------------------------------------------------------------------

    def _page(self, index: str, after: str | None, limit: int) -> tuple[list[str], bool]:
        """Up to `limit` ids of `index`, newest first, after the id `after` (OpenAI's cursor)."""
        start = 0
        if after:
            rank = self.redis.zrevrank(index, after)
            if rank is None:
                return [], False
            start = rank + 1
        ids = [_text(i) for i in self.redis.zrevrange(index, start, start + limit)]
        return ids[:limit], len(ids) > limit
