"""Every accepted job ends exactly once: the bench's check across a topology's whole run.

Two witnesses, both read once the run's phases are over:

* the client's: each accepted request's job id and whether its final record (read from
  /v1/jobs/<id>) is terminal; a job id answered to two requests is a failure;
* the system's: the stream of finished jobs (``keys.FINISHED_STREAM``), to which every
  terminal transition appends one entry in the same atomic step (tailguard/jobs/store.py).
  A job in it twice ended twice (ran twice to an end, or ended by two parties); an accepted
  job not in it never ended. Its entries stay after the gateway's consumer group reads
  them (the stream is only trimmed past ``FINISHED_STREAM_MAXLEN`` entries, far more than a
  bench run makes).

`check` is pure; `finished_counts` reads the stream. Jobs of the warm-up and the probe are
in the stream too: they are checked for ending twice, not for ending.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from tailguard.bench.loadgen import Sample

#: How many offending job ids the report lists (the counts are whole).
SHOWN = 5


def check(samples: Iterable[Sample], ends: Mapping[str, int] | None) -> dict[str, Any]:
    """The exactly-once figures of one topology's accepted requests: `ends` is how many
    terminal entries each job id has in the finished stream (None: not read)."""
    accepted = [s for s in samples if s.accepted]
    ids = Counter(s.job_id for s in accepted if s.job_id)
    unfinished = sorted(s.job_id or "?" for s in accepted if not s.finished)
    answered_twice = sorted(j for j, n in ids.items() if n > 1)
    out: dict[str, Any] = {
        "accepted": len(accepted), "job_ids": len(ids),
        "without_id": sum(1 for s in accepted if not s.job_id),
        "not_terminal": len(unfinished), "not_terminal_ids": unfinished[:SHOWN],
        "answered_twice": len(answered_twice), "answered_twice_ids": answered_twice[:SHOWN],
        "stream_read": ends is not None}
    if ends is not None:
        never = sorted(j for j in ids if not ends.get(j))
        twice = sorted(j for j, n in ends.items() if n > 1)
        out.update(ended_once=sum(1 for j in ids if ends.get(j) == 1),
                   never_ended=len(never), never_ended_ids=never[:SHOWN],
                   ended_twice=len(twice), ended_twice_ids=twice[:SHOWN])
    out["ok"] = (not out["without_id"] and not unfinished and not answered_twice
                 and not out.get("never_ended") and not out.get("ended_twice"))
    return out


def describe(topo: str, c: dict[str, Any]) -> str:
    """The report line's text (without its status)."""
    parts = [f"{topo}: every accepted job ends exactly once: {c['accepted']} accepted"]
    if c["stream_read"]:
        parts.append(f"{c['ended_once']} ended once in the finished stream")
        for key, what in (("never_ended", "never ended"), ("ended_twice", "ended twice")):
            if c[key]:
                parts.append(f"{c[key]} {what} ({', '.join(c[key + '_ids'])})")
    else:
        parts.append("finished stream not read")
    for key, what in (("not_terminal", "not terminal when last read"),
                      ("answered_twice", "job ids answered to two requests")):
        if c[key]:
            parts.append(f"{c[key]} {what} ({', '.join(c[key + '_ids'])})")
    if c["without_id"]:
        parts.append(f"{c['without_id']} accepted without a job id")
    return "; ".join(parts)


def finished_counts(redis_url: str, batch: int = 1000) -> dict[str, int] | None:
    """Terminal entries per job id in the finished stream of the Redis at `redis_url` (None
    when it cannot be read)."""
    import redis

    from tailguard.redis import keys

    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    counts: Counter[str] = Counter()
    start = "-"
    try:
        while True:
            entries = client.xrange(keys.FINISHED_STREAM, min=start, max="+", count=batch)
            for _id, fields in entries:
                key = fields.get(b"key") or fields.get("key")
                if key is not None:
                    counts[keys.job_id_of(key.decode() if isinstance(key, bytes) else key)] += 1
            if len(entries) < batch:
                return dict(counts)
            start = "(" + (entries[-1][0].decode() if isinstance(entries[-1][0], bytes)
                           else entries[-1][0])
    except redis.RedisError:
        return None
    finally:
        client.close()
