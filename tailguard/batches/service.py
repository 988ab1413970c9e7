"""What the Batch API's views ask: files and batches of the caller's key, as OpenAI answers.

Ownership as jobs have it (tailguard.gateway.service.Gateway.check_owner): a file or batch
belongs to the key that made it; another key gets a 404 exactly like an unknown id; an
admin key, or no key (open mode), sees all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, BinaryIO

from tailguard.batches.contents import stream_size
from tailguard.batches.lines import COMPLETION_WINDOWS, ENDPOINTS
from tailguard.batches.objects import (
    CANCELLING,
    IN_PROGRESS,
    PURPOSE_INPUT,
    VALIDATING,
    check_metadata,
    file_object,
    new_batch_id,
    new_file_id,
    page,
)
from tailguard.batches.store import BatchStore
from tailguard.errors import (
    BodyTooLarge,
    InvalidField,
    JobNotFound,
    JobStateConflict,
    QuotaExceeded,
)
from tailguard.gateway.api_keys import ApiKey
from tailguard.jobs.redis_memory import StorageWatch

#: OpenAI's page sizes: files up to 10,000 (default 10,000), batches up to 100 (default 20)
FILE_PAGE, FILE_PAGE_MAX, BATCH_PAGE, BATCH_PAGE_MAX = 10000, 10000, 20, 100


def _may_see(caller: ApiKey | None, owner: str | None) -> bool:
    return caller is None or caller.admin or caller.id == (owner or "")


def _index_owner(caller: ApiKey | None) -> str | None:
    """Whose index a listing reads: every one for an admin key or open mode."""
    return None if caller is None or caller.admin else caller.id


def page_limit(raw: str | None, default: int, most: int) -> int:
    if raw is None:
        return default
    try:
        limit = int(raw)
    except ValueError:
        raise InvalidField(f"limit must be an integer, got {raw!r}", field="limit") from None
    if not 1 <= limit <= most:
        raise InvalidField(f"limit must be between 1 and {most}", field="limit")
    return limit


@dataclass
class BatchService:
    store: BatchStore
    max_file_bytes: int
    #: Redis's room (tailguard.jobs.redis_memory): nothing new is stored past its high-water mark
    storage: StorageWatch | None = None
    #: a key's most stored file bytes and batches not yet ended (0: no bound)
    max_bytes_per_key: int = 0
    max_running_per_key: int = 0

    def _check_storage(self) -> None:
        if self.storage is not None:
            self.storage.check()  # StorageFull (503)

    # -- files ---------------------------------------------------------------------------

    def upload(self, filename: str, purpose: str, data: BinaryIO,
               caller: ApiKey | None) -> dict[str, Any]:
        """Store an uploaded file from its stream (seekable: its size is known before a byte of
        it is copied, and it is copied in chunks, never held whole)."""
        if purpose != PURPOSE_INPUT:
            raise InvalidField(f"purpose must be {PURPOSE_INPUT!r}: this API keeps batch input "
                               "files only", field="purpose")
        self._check_storage()
        size = stream_size(data)
        if size > self.max_file_bytes:
            raise BodyTooLarge(f"the file has {size} bytes, more than the "
                               f"{self.max_file_bytes} taken (TAILGUARD_BATCH_MAX_FILE_BYTES)",
                               field="file")
        if caller is not None and self.max_bytes_per_key and (
                stored := self.store.stored_bytes(caller.id)) + size > self.max_bytes_per_key:
            raise QuotaExceeded(f"key {caller.name!r} stores {stored} bytes of files; this one "
                                f"would pass its {self.max_bytes_per_key} "
                                "(TAILGUARD_BATCH_MAX_BYTES_PER_KEY): delete files first",
                                field="file", retry_after_s=60)
        record = self.store.add_file(new_file_id(), filename=filename or "upload.jsonl",
                                     purpose=purpose, owner=caller.id if caller else None, data=data)
        return file_object(record)

    def file(self, file_id: str, caller: ApiKey | None) -> dict[str, Any]:
        """OpenAI's File object of a file the caller may see."""
        return file_object(self._file(file_id, caller))

    def _file(self, file_id: str, caller: ApiKey | None) -> dict[str, Any]:
        record = self.store.file(file_id)
        if record is None or not _may_see(caller, record.get("owner")):
            raise JobNotFound(f"no file {file_id!r}", field="file_id")
        return record

    def content(self, file_id: str, caller: ApiKey | None) -> bytes:
        data = self.store.contents.get(self._file(file_id, caller)["id"])
        if data is None:
            raise JobNotFound(f"the contents of file {file_id!r} are gone", field="file_id")
        return data

    def delete_file(self, file_id: str, caller: ApiKey | None) -> dict[str, Any]:
        """Delete a file, unless a batch not yet ended reads it (JobStateConflict, 409): its
        feeder may read its input again, and its lines' results need their custom_ids."""
        record = self._file(file_id, caller)
        if (users := self.store.batches_reading(file_id)):
            raise JobStateConflict(f"file {file_id} is the input of batch {users[0]}, which has "
                                   "not ended: cancel the batch or wait for its end, then delete "
                                   "the file", field="file_id")
        self.store.delete_file(record)
        return {"id": file_id, "object": "file", "deleted": True}

    def files(self, caller: ApiKey | None, after: str | None, limit: str | None,
              purpose: str | None = None) -> dict[str, Any]:
        objects, more = self.store.file_page(_index_owner(caller), after,
                                             page_limit(limit, FILE_PAGE, FILE_PAGE_MAX))
        if purpose:
            objects = [o for o in objects if o["purpose"] == purpose]
        return page(objects, more)

    # -- batches -------------------------------------------------------------------------

    def create(self, body: Any, caller: ApiKey | None) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise InvalidField("the body must be a JSON object", field="body")
        endpoint, window = body.get("endpoint"), body.get("completion_window")
        if not isinstance(endpoint, str) or endpoint not in ENDPOINTS:
            raise InvalidField(f"endpoint must be one of {', '.join(ENDPOINTS)}", field="endpoint")
        if not isinstance(window, str) or window not in COMPLETION_WINDOWS:
            raise InvalidField(f"completion_window must be one of {', '.join(COMPLETION_WINDOWS)}",
                               field="completion_window")
        if (why := check_metadata(body.get("metadata"))) is not None:
            raise InvalidField(why, field="metadata")
        input_file_id = body.get("input_file_id")
        if not isinstance(input_file_id, str):
            raise InvalidField("input_file_id must be a file id", field="input_file_id")
        source = self._file(input_file_id, caller)
        if source["purpose"] != PURPOSE_INPUT:
            raise InvalidField(f"file {input_file_id} has purpose {source['purpose']!r}, not "
                               f"{PURPOSE_INPUT!r}", field="input_file_id")
        self._check_storage()
        if caller is not None and self.max_running_per_key and (
                self.store.running_of(caller.id) >= self.max_running_per_key):
            raise QuotaExceeded(f"key {caller.name!r} has {self.max_running_per_key} batches not "
                                "yet ended (TAILGUARD_BATCH_MAX_RUNNING_PER_KEY)", retry_after_s=60)
        now = self.store.now()
        record = {"id": new_batch_id(), "endpoint": endpoint, "input_file_id": input_file_id,
                  "completion_window": window, "status": VALIDATING, "created_at": now,
                  "expires_at": now + COMPLETION_WINDOWS[window],
                  "metadata": body.get("metadata"), "total": 0, "next": 0}
        self.store.add_batch(record, caller.id if caller else None)
        return self.store.batch_view(record)

    def _batch(self, batch_id: str, caller: ApiKey | None) -> dict[str, Any]:
        record = self.store.batch(batch_id)
        if record is None or not _may_see(caller, record.get("owner")):
            raise JobNotFound(f"no batch {batch_id!r}", field="batch_id")
        return record

    def batch(self, batch_id: str, caller: ApiKey | None) -> dict[str, Any]:
        return self.store.batch_view(self._batch(batch_id, caller))

    def batches(self, caller: ApiKey | None, after: str | None, limit: str | None) -> dict[str, Any]:
        objects, more = self.store.batch_page(_index_owner(caller), after,
                                              page_limit(limit, BATCH_PAGE, BATCH_PAGE_MAX))
        return page(objects, more)

    def cancel(self, batch_id: str, caller: ApiKey | None) -> dict[str, Any]:
        """Stop queuing its lines now; the feeder ends it ``cancelled`` once the lines already
        queued or running have finished. A batch cancelled already answers as it is."""
        self._batch(batch_id, caller)
        if not self.store.set_status(batch_id, {VALIDATING, IN_PROGRESS}, CANCELLING):
            record = self._batch(batch_id, caller)
            if record["status"] not in (CANCELLING, "cancelled"):
                raise JobStateConflict(f"batch {batch_id} already ended ({record['status']}): "
                                       "nothing to cancel")
        return self.batch(batch_id, caller)
