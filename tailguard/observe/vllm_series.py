"""vLLM's own ``vllm:*`` series on a worker's metrics port, labelled with the worker; the lanes
it serves as an info series of their own.

vLLM's Prometheus stat logger (vllm/v1/metrics/loggers.py, ``PrometheusStatLogger``) registers
its series in the process's default registry with the labels ``model_name`` and ``engine``
only, which cannot tell one tailguard worker's engine from another's on the same model: the
``worker`` label is added here, when scraped. Its label set never changes: vLLM's counters and
histograms are cumulative over the engine's life, and a label that followed the worker's lanes
would start a new series at each change carrying the old one's counts, misattributing every
rate across it. The lanes a worker serves now are ``tailguard_worker_lanes_info{worker, lane}``
(value 1, one series per lane: Prometheus's info convention), to join on ``worker`` where a
query wants vLLM's series by lane.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tailguard.observe.metrics import metric_name

#: what every series of vLLM's own is named with
VLLM_PREFIX = "vllm:"
#: the info series of a worker's lanes
LANES_INFO = metric_name("worker_lanes_info")


class VllmSeriesCollector(Collector):
    """The ``vllm:*`` families of `source` (vLLM registers them in the default registry), each
    sample with ``worker`` added, and the worker's `lanes` at the scrape as LANES_INFO."""

    def __init__(self, worker: str, lanes: Callable[[], Sequence[str]],
                 source: CollectorRegistry = REGISTRY) -> None:
        self.worker, self.lanes, self.source = worker, lanes, source

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(LANES_INFO, "The lanes this worker's engine serves now: 1 for "
                                 "each (join vllm:* series on worker)", labels=["worker", "lane"])
        for lane in self.lanes():
            info.add_metric([self.worker, lane], 1)
        yield info
        for family in self.source.collect():
            if not family.name.startswith(VLLM_PREFIX):
                continue
            relabelled = Metric(family.name, family.documentation, family.type, family.unit)
            relabelled.samples = [s._replace(labels={**s.labels, "worker": self.worker})
                                  for s in family.samples]
            yield relabelled
