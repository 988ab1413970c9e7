"""The engine a worker hosts, from the lanes it serves and its engine table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tailguard import settings
from tailguard.lanes.engine_options import check_against
from tailguard.lanes.table import Lane, LaneTable, engine_settings_for
from tailguard.model.info import model_max_len, served_model_names, serving_dtype

if TYPE_CHECKING:  # vLLM is imported only when an engine starts
    from tailguard.engine.host import EngineConfig


def check_engine_options(table: LaneTable) -> None:
    """The lanes file's engine tables against vLLM's own EngineArgs
    (tailguard/lanes/engine_options.py), before a worker builds an engine from them: one
    started by hand has had no `tailguard up` to check them."""
    if table.engine_tables:
        from vllm.engine.arg_utils import AsyncEngineArgs

        check_against(table, AsyncEngineArgs)


def engine_config(lanes: list[Lane], options: Mapping[str, Any] | None = None) -> EngineConfig:
    """The engine of a worker serving `lanes` (largest batch and context among them). Serving
    several, it schedules by vLLM priority in their order (tailguard/worker/runtime.py gives
    each lane's requests its position), so a short request goes first at every step. `options`
    are its vLLM engine arguments from the lanes file (its [[workers]] entry's `engine`, over
    `[engine]`). Its OpenAI serving layer answers to the deployment's served model names, with
    vLLM's frontend options of TAILGUARD_OPENAI_ARGS."""
    from tailguard.engine.host import EngineConfig

    model = settings.MODEL.get()
    if not model:
        raise RuntimeError("TAILGUARD_MODEL is not set: point it at a model directory or a "
                           "Hugging Face id (`tailguard make-demo-model DIR` builds a demo one)")
    max_num_seqs, max_len = engine_settings_for(lanes)
    limit = model_max_len(model)
    if limit is not None:
        max_len = min(max_len, limit)
    return EngineConfig(model=model, max_num_seqs=max_num_seqs, max_model_len=max_len,
                        dtype=serving_dtype(model, settings.DTYPE.get()),
                        log_stats=settings.VLLM_METRICS.get(),
                        served_model_names=tuple(served_model_names(
                            model, settings.SERVED_MODEL_NAME.get())),
                        openai_args=settings.OPENAI_ARGS.get(),
                        extra={**(options or {}),
                               **({"scheduling_policy": "priority"} if len(lanes) > 1 else {})})
