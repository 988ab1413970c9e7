"""A worker's vLLM engine options, the lanes file's ``engine`` tables: their checks, without vLLM.

An ``engine`` table holds keyword arguments of vLLM's ``AsyncEngineArgs``, given to the
worker's engine as written: the file's top-level ``[engine]`` for every worker, then a
``[[workers]]`` entry's own ``engine``, key by key. They are checked in two steps:

* at load, here (`parse_engine_table`): a table; none of the fields tailguard derives
  itself (`DERIVED`, each refused with where to set it instead); parallel sizes that are
  integers >= 1, since they say how many GPUs the worker takes (`devices_per_engine`);
* where vLLM may be imported (`tailguard up` before it starts anything, a worker before it
  builds its engine), against vLLM's own ``EngineArgs`` dataclass, which the caller passes
  in (`check_against`): an unknown name is refused with the closest valid ones, a value the
  field's annotation rules out is refused with that annotation. Annotations that say
  nothing reliable of a TOML value (a config class vLLM builds from a dict, a callable)
  are left to vLLM.

Why derived fields are refused rather than given a precedence: each has a second reader
that must agree with the engine. ``max_num_seqs`` is also the worker's thread count and
admission's batch slots, ``max_model_len`` the API's cost cap, ``model`` the tokenizer the
API counts prompts with, ``dtype`` a choice per CPU family, ``scheduling_policy`` what a worker
serving several lanes relies on (each lane at its vLLM priority), ``disable_log_stats`` what
``TAILGUARD_VLLM_METRICS`` promises. An engine value that won would make the engine disagree
with them; one that lost would be ignored without a word.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import math
import sys
import types
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from tailguard import settings
from tailguard.errors import ConfigError

if TYPE_CHECKING:
    from tailguard.lanes.table import LaneTable

#: engine fields tailguard sets itself -> where the lanes file or the environment sets them
DERIVED: dict[str, str] = {
    "model": f"${settings.MODEL.env} (the API counts prompt tokens with the same model's tokenizer)",
    "tokenizer": f"${settings.MODEL.env} (the API counts prompt tokens with the model's own tokenizer)",
    "max_num_seqs": "the lanes' max_num_seqs (also the worker's threads and admission's batch slots)",
    "max_model_len": "the lanes' max_model_len (also the API's cost cap)",
    "dtype": f"${settings.DTYPE.env}",
    "disable_log_stats": f"${settings.VLLM_METRICS.env}",
    "scheduling_policy": ('the worker\'s lanes: "priority" when it serves several (each lane at '
                          "its place in their order), vLLM's default otherwise"),
}
#: the engine fields whose product is the number of GPUs one engine takes (vLLM's
#: ParallelConfig: world size x data parallel size)
PARALLEL_SIZES = ("tensor_parallel_size", "pipeline_parallel_size",
                  "prefill_context_parallel_size", "data_parallel_size")
#: how many Literal values a message lists before it cuts the list short
_MAX_LISTED = 8


def parse_engine_table(raw: Any, where: str) -> dict[str, Any]:
    """The ``engine`` table at `where` (``engine``, ``workers[1].engine``), checked as far
    as it can be without vLLM; ConfigError naming the field otherwise."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table of vLLM engine arguments "
                          "(`engine = {tensor_parallel_size = 2}`)", field=where)
    for key, value in raw.items():
        if key in DERIVED:
            raise ConfigError(f"{where}.{key}: tailguard sets {key} itself; set it with "
                              f"{DERIVED[key]}", field=f"{where}.{key}")
        if key in PARALLEL_SIZES and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
            raise ConfigError(f"{where}.{key} must be an integer >= 1, got {value!r}",
                              field=f"{where}.{key}")
    return dict(raw)


def devices_per_engine(options: Mapping[str, Any]) -> int:
    """How many GPUs an engine with these options takes (1 without parallelism)."""
    return math.prod(int(options.get(key, 1)) for key in PARALLEL_SIZES)


def check_against(table: LaneTable, engine_args: type) -> None:
    """Every engine table of `table` against vLLM's ``EngineArgs`` dataclass `engine_args`
    (the module docstring); ConfigError naming the field, its file and the closest names."""
    fields = {f.name: f for f in dataclasses.fields(engine_args) if not f.name.startswith("_")}
    prefix = f"{table.source}: " if table.source else ""
    for where, options in table.engine_tables:
        for key, value in options.items():
            name = f"{where}.{key}"
            if key not in fields:
                close = difflib.get_close_matches(key, fields, n=3, cutoff=0.6)
                hint = (f"; closest: {', '.join(close)}" if close else
                        "; no engine argument has a close name (vLLM's engine arguments: "
                        "`python -m vllm.entrypoints.openai.api_server --help`)")
                raise ConfigError(f"{prefix}{name}: not one of vLLM's engine arguments{hint}",
                                  field=name)
            hint = _annotation(fields[key], engine_args)
            if hint is not None and value_fits(value, hint) is False:
                raise ConfigError(f"{prefix}{name}: vLLM takes {describe(hint)}, got {value!r}",
                                  field=name)


def _annotation(field: dataclasses.Field, owner: type) -> Any:
    """The field's annotation as an object; None where it cannot be resolved (a name only
    vLLM's type checker sees)."""
    if not isinstance(field.type, str):
        return field.type
    module = sys.modules.get(owner.__module__)
    try:
        return eval(field.type, vars(module) if module else {})  # an annotation
    except Exception:  # noqa: BLE001 - unresolvable: unchecked
        return None


def value_fits(value: Any, hint: Any) -> bool | None:
    """Whether a TOML `value` fits the annotation `hint`: True, False, or None where the
    annotation says nothing reliable about it (the module docstring)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Literal:
        # type-strict: TOML's true is not vLLM's Literal[1]
        return any(type(value) is type(a) and value == a for a in args)
    if origin in (typing.Union, types.UnionType):
        verdicts = [value_fits(value, h) for h in args]
        return True if True in verdicts else (None if None in verdicts else False)
    if origin in (list, set, frozenset, tuple, collections.abc.Sequence):
        if not isinstance(value, list):
            return False
        items = [a for a in args if a is not Ellipsis]
        if len(items) != 1:
            return True  # a bare list, or a tuple of positions: vLLM checks the items
        verdicts = [value_fits(v, items[0]) for v in value]
        return False if False in verdicts else (None if None in verdicts else True)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if hint is type(None):
        return False  # TOML has no null: leave the field out instead
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return None


def describe(hint: Any) -> str:
    """An annotation as a person reads it: ``an integer``, ``one of 'auto', 'fp8'``."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Literal:
        listed = ", ".join(repr(a) for a in args[:_MAX_LISTED])
        return f"one of {listed}{', ...' if len(args) > _MAX_LISTED else ''}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(h) for h in args if h is not type(None))
    if origin in (list, set, frozenset, tuple, collections.abc.Sequence):
        items = [a for a in args if a is not Ellipsis]
        return f"a list of {describe(items[0])}" if len(items) == 1 else "a list"
    if origin is dict or hint is dict:
        return "a table"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))
