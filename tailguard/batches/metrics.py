"""The Batch API in /metrics, read from Redis when scraped (every API process reports the same
figures: they are the deployment's, not the process's)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tailguard.observe.metrics import metric_name
from tailguard.redis import keys


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class BatchCollector(Collector):
    """Batches not yet ended by status, batches ended by status, lines queued or running, and
    the bytes of stored files."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        try:
            active = sorted(_text(b) for b in self.client.smembers(keys.BATCHES_ACTIVE))
            pipe = self.client.pipeline()
            for batch_id in active:
                pipe.hget(keys.batch_key(batch_id), "status")
                pipe.hlen(keys.batch_lines_key(batch_id, "pending"))
            replies = pipe.execute()
            ended = self.client.hgetall(keys.BATCHES_ENDED)
            stored = int(self.client.get(keys.files_bytes_key(None)) or 0)
        except redis.RedisError:
            return  # no sample beats a wrong one
        statuses = Counter(_text(s) for s in replies[::2] if s is not None)
        running = GaugeMetricFamily(metric_name("batches"), "Batches not yet ended, by status",
                                    labels=["status"])
        for status, n in sorted(statuses.items()):
            running.add_metric([status], n)
        yield running
        done = CounterMetricFamily(metric_name("batches_ended"), "Batches that ended, by status",
                                   labels=["status"])
        for status, n in sorted(ended.items()):
            done.add_metric([_text(status)], int(n))
        yield done
        yield GaugeMetricFamily(metric_name("batch_lines_in_flight"),
                                "Batch lines queued or running as jobs", value=sum(replies[1::2]))
        yield GaugeMetricFamily(metric_name("batch_files_bytes"),
                                "Bytes of the Batch API's stored files", value=stored)
