"""vLLM's own series on a worker's metrics port: each sample labelled with the worker and the
lanes it serves at the scrape (tailguard/observe/vllm_series.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tailguard.observe.vllm_series import VllmSeriesCollector, lane_label


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


def test_vllms_series_get_the_worker_and_its_lanes_as_they_are_at_each_scrape():
    lanes = ["short"]
    collector = VllmSeriesCollector("short@h", lambda: lanes, source=vllms_registry())
    text = scrape(collector)
    assert 'vllm:num_requests_running{engine="0",lane="short",model_name="m",worker="short@h"} 3.0' \
        in text
    assert 'vllm:kv_cache_usage_perc{engine="0",lane="short",model_name="m",worker="short@h"} 0.25' \
        in text
    assert 'vllm:prompt_tokens_total{engine="0",lane="short",model_name="m",worker="short@h"} 7.0' \
        in text
    assert ('vllm:time_to_first_token_seconds_bucket{engine="0",lane="short",le="0.1",'
            'model_name="m",worker="short@h"} 1.0') in text
    assert "tailguard_other" not in text  # only vLLM's
    lanes[:] = ["long", "batch"]  # a lane move, with the engine left warm
    text = scrape(collector)
    assert 'vllm:num_requests_running{engine="0",lane="long,batch",model_name="m",' \
           'worker="short@h"} 3.0' in text
    assert 'lane="short"' not in text


def test_a_worker_of_several_lanes_is_one_series_per_engine():
    assert lane_label(["long", "batch"]) == "long,batch"
    assert lane_label(["short"]) == "short"
