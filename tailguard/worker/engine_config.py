"""The engine a worker hosts, from the lanes it serves and borrows from."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tailguard import settings
from tailguard.lanes.table import Lane, engine_settings_for
from tailguard.model.info import model_max_len, serving_dtype

if TYPE_CHECKING:  # vLLM is imported only when an engine starts
    from tailguard.engine.host import EngineConfig


def engine_config(lanes: list[Lane], borrowed: list[Lane] | None = None) -> EngineConfig:
    """The engine of a worker serving `lanes` (largest batch and context among them) and
    borrowing from `borrowed`: then its context fits their requests too, and it schedules
    by vLLM priority, so its own requests go before borrowed ones."""
    from tailguard.engine.host import EngineConfig

    model = settings.MODEL.get()
    if not model:
        raise RuntimeError("TAILGUARD_MODEL is not set: point it at a model directory or a "
                           "Hugging Face id (`tailguard make-demo-model DIR` builds a demo one)")
    max_num_seqs, max_len = engine_settings_for(lanes, borrowed or ())
    limit = model_max_len(model)
    if limit is not None:
        max_len = min(max_len, limit)
    return EngineConfig(model=model, max_num_seqs=max_num_seqs, max_model_len=max_len,
                        dtype=serving_dtype(model, settings.DTYPE.get()),
                        log_stats=settings.VLLM_METRICS.get(),
                        extra={"scheduling_policy": "priority"} if borrowed else {})


def idle_engine_config(borrowed: list[Lane], slots: int) -> EngineConfig:
    """The idle-priority engine of a worker borrowing from `borrowed`: `slots` (B) requests,
    the context of their largest lane."""
    config = engine_config(borrowed)
    return dataclasses.replace(config, max_num_seqs=slots)
