"""The Batch API's figures, read from Redis (every API process reports the same: they are the
deployment's, not the process's): in /metrics (``BatchCollector``) and `tailguard stats`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tailguard.observe.metrics import metric_name
from tailguard.redis import keys


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class BatchFigures:
    running: dict[str, int]  # batches not yet ended, by status
    ended: dict[str, int]  # batches that ended, by status
    lines_in_flight: int  # lines queued or running as jobs
    stored_bytes: int  # bytes of the files stored

    def to_dict(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        """One line for `tailguard stats`."""
        def counts(by: dict[str, int]) -> str:
            return ", ".join(f"{s} {n}" for s, n in sorted(by.items())) or "none"

        return (f"batches now: {counts(self.running)}; lines in flight {self.lines_in_flight}; "
                f"ended: {counts(self.ended)}; files {self.stored_bytes / 2**20:.1f} MiB")


def read_figures(client: redis.Redis) -> BatchFigures:
    active = sorted(_text(b) for b in client.smembers(keys.BATCHES_ACTIVE))
    pipe = client.pipeline()
    for batch_id in active:
        pipe.hget(keys.batch_key(batch_id), "status")
        pipe.hlen(keys.batch_lines_key(batch_id, "pending"))
    replies = pipe.execute()
    return BatchFigures(
        running=dict(Counter(_text(s) for s in replies[::2] if s is not None)),
        ended={_text(s): int(n) for s, n in client.hgetall(keys.BATCHES_ENDED).items()},
        lines_in_flight=sum(replies[1::2]),
        stored_bytes=int(client.get(keys.files_bytes_key(None)) or 0))


class BatchCollector(Collector):
    """Batches not yet ended by status, batches ended by status, lines queued or running, and
    the bytes of stored files."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        try:
            figures = read_figures(self.client)
        except redis.RedisError:
            return  # no sample beats a wrong one
        running = GaugeMetricFamily(metric_name("batches"), "Batches not yet ended, by status",
                                    labels=["status"])
        for status, n in sorted(figures.running.items()):
            running.add_metric([status], n)
        yield running
        done = CounterMetricFamily(metric_name("batches_ended"), "Batches that ended, by status",
                                   labels=["status"])
        for status, n in sorted(figures.ended.items()):
            done.add_metric([status], n)
        yield done
        yield GaugeMetricFamily(metric_name("batch_lines_in_flight"),
                                "Batch lines queued or running as jobs",
                                value=figures.lines_in_flight)
        yield GaugeMetricFamily(metric_name("batch_files_bytes"),
                                "Bytes of the Batch API's stored files", value=figures.stored_bytes)
