"""vLLM's own ``vllm:*`` series on a worker's metrics port, labelled with the worker and its lanes.

vLLM's Prometheus stat logger (vllm/v1/metrics/loggers.py, ``PrometheusStatLogger``) registers
its series in the process's default registry with the labels ``model_name`` and ``engine``
only, which cannot tell one tailguard worker's engine from another's on the same model. The
labels are added here, when scraped, not given to vLLM's logger when the engine is built: a
worker's lanes change at run time (lane moves, tailguard/worker/lane_follower.py) with the
engine left warm, so a label fixed at build time would go on naming the lanes it left.

``lane`` is the worker's lanes as it serves them now, comma-joined (``short``, or
``long,batch`` for a worker of two lanes): one engine is one series, so sums across workers
count each engine once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

#: what every series of vLLM's own is named with
VLLM_PREFIX = "vllm:"


def lane_label(lanes: Sequence[str]) -> str:
    """The ``lane`` label of a worker serving `lanes`, in its own order."""
    return ",".join(lanes)


class VllmSeriesCollector(Collector):
    """The ``vllm:*`` families of `source` (vLLM registers them in the default registry), each
    sample with ``worker`` and ``lane`` added as they are at the scrape."""

    def __init__(self, worker: str, lanes: Callable[[], Sequence[str]],
                 source: CollectorRegistry = REGISTRY) -> None:
        self.worker, self.lanes, self.source = worker, lanes, source

    def collect(self) -> Iterator[Metric]:
        added = {"worker": self.worker, "lane": lane_label(self.lanes())}
        for family in self.source.collect():
            if not family.name.startswith(VLLM_PREFIX):
                continue
            relabelled = Metric(family.name, family.documentation, family.type, family.unit)
            relabelled.samples = [s._replace(labels={**s.labels, **added})
                                  for s in family.samples]
            yield relabelled
