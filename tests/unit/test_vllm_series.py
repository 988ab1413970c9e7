"""vLLM's own series on a worker's metrics port: each sample labelled with the worker, one label
set for the engine's life; the lanes it serves at the scrape as an info series
(tailguard/observe/vllm_series.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tailguard.observe.vllm_series import VllmSeriesCollector


def vllms_registry() -> CollectorRegistry:
    """A registry holding series as vLLM's PrometheusStatLogger registers them."""
    source = CollectorRegistry()
    labels = ["model_name", "engine"]
    Gauge("vllm:num_requests_running", "running", labels, registry=source).labels("m", "0").set(3)
    Gauge("vllm:kv_cache_usage_perc", "kv", labels, registry=source).labels("m", "0").set(0.25)
    Counter("vllm:prompt_tokens", "prompt", labels, registry=source).labels("m", "0").inc(7)
    Histogram("vllm:time_to_first_token_seconds", "ttft", labels, buckets=(0.1, 1.0),
              registry=source).labels("m", "0").observe(0.05)
    Gauge("tailguard_other", "not vLLM's", registry=source).set(1)
    return source


def scrape(collector: VllmSeriesCollector) -> str:
    served = CollectorRegistry()
    served.register(collector)
    return generate_latest(served).decode()


def test_vllms_series_keep_one_label_set_and_the_lanes_are_an_info_series():
    lanes = ["short"]
    collector = VllmSeriesCollector("w1@h", lambda: lanes, source=vllms_registry())
    text = scrape(collector)
    assert 'vllm:num_requests_running{engine="0",model_name="m",worker="w1@h"} 3.0' in text
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="m",worker="w1@h"} 0.25' in text
    assert 'vllm:prompt_tokens_total{engine="0",model_name="m",worker="w1@h"} 7.0' in text
    assert ('vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m",'
            'worker="w1@h"} 1.0') in text
    assert 'tailguard_worker_lanes_info{lane="short",worker="w1@h"} 1.0' in text
    assert "tailguard_other" not in text  # only vLLM's
    before = {line.rsplit(" ", 1)[0] for line in text.splitlines() if line.startswith("vllm:")}
    lanes[:] = ["long", "batch"]  # the worker's lanes change, its engine left warm
    text = scrape(collector)
    # the same series go on (a counter's rate stays whole); only the info series follow
    assert {line.rsplit(" ", 1)[0] for line in text.splitlines() if line.startswith("vllm:")} \
        == before
    assert 'tailguard_worker_lanes_info{lane="long",worker="w1@h"} 1.0' in text
    assert 'tailguard_worker_lanes_info{lane="batch",worker="w1@h"} 1.0' in text
    assert 'lane="short"' not in text
