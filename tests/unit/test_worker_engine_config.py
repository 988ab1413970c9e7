"""A worker's engine configuration: vLLM's own stat loggers follow TAILGUARD_VLLM_METRICS."""

import pytest

from tailguard.lanes.table import load_lanes
from tailguard.worker.engine_config import engine_config


@pytest.fixture
def short_lane(tiny_model, monkeypatch):
    monkeypatch.setenv("TAILGUARD_MODEL", str(tiny_model))
    return [load_lanes()["short"]]


def test_vllm_metrics_are_on_by_default(short_lane, monkeypatch):
    monkeypatch.delenv("TAILGUARD_VLLM_METRICS", raising=False)
    assert engine_config(short_lane).log_stats is True


def test_vllm_metrics_off_reaches_the_workers_engine(short_lane, monkeypatch):
    monkeypatch.setenv("TAILGUARD_VLLM_METRICS", "0")
    assert engine_config(short_lane).log_stats is False
