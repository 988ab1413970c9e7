"""vLLM's OpenAI frontend options (TAILGUARD_OPENAI_ARGS), parsed as `vllm serve` parses them.

The API renders and validates OpenAI requests with vLLM's render layer, and every worker
runs them through vLLM's serving layer: both must read the same options the same way, so
both call `frontend_args` (cross-cutting for that reason). vLLM is imported inside it only:
importing this module costs nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import NoReturn

from tailguard import settings
from tailguard.errors import ConfigError

#: the engine arguments of `vllm serve` that its serving layer reads, which TAILGUARD_OPENAI_ARGS
#: takes too (the reasoning parser also goes to the engine: EngineHost builds it with it)
SERVING_ENGINE_OPTIONS = ("reasoning_parser", "reasoning_parser_plugin", "enable_log_requests")
#: where the other options of `vllm serve` go instead
ELSEWHERE = {"model": settings.MODEL.env, "model_tag": settings.MODEL.env,
             "served_model_name": settings.SERVED_MODEL_NAME.env,
             "max_model_len": "the lanes file (each lane's max_model_len)"}


def frontend_args(argv: Sequence[str]) -> argparse.Namespace:
    """`argv` (TAILGUARD_OPENAI_ARGS) parsed by `vllm serve`'s own argument parser and checked
    as it checks them; ConfigError for anything that is not a frontend option of vLLM's
    serving layer (vLLM's BaseFrontendArgs and SERVING_ENGINE_OPTIONS), saying where it goes."""
    from vllm.entrypoints.launchers.cli_args import (
        BaseFrontendArgs,
        make_arg_parser,
        validate_parsed_serve_args,
    )
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    env = settings.OPENAI_ARGS.env
    parser = make_arg_parser(FlexibleArgumentParser(prog=env, exit_on_error=False))

    def refuse(message: str) -> NoReturn:  # argparse's error() would print and exit
        raise ConfigError(f"{env}: {message}", field=env)

    parser.error = refuse  # type: ignore[method-assign]
    accepted = {f.name for f in dataclasses.fields(BaseFrontendArgs)} | set(SERVING_ENGINE_OPTIONS)
    for dest in _dests(parser, argv):
        if dest in accepted:
            continue
        where = ELSEWHERE.get(dest) or (
            "the lanes file's engine tables ([engine], or a [[workers]] entry's engine)"
            if dest in _engine_dests() else None)
        refuse(f"{_option(parser, dest)} is not a frontend option of vLLM's serving layer; "
               + (f"it goes in {where}" if where else "tailguard takes none of vLLM's server "
                  "options (its API serves HTTP itself)"))
    try:
        args = parser.parse_args(list(argv))
        validate_parsed_serve_args(args)
    except (argparse.ArgumentError, TypeError, ValueError) as exc:
        refuse(str(exc))
    return args


def _dests(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """The argument names `argv` sets, as its parser names them (positional: model_tag)."""
    dests = []
    for token in argv:
        if not token.startswith("-"):
            continue  # a value (the parser itself refuses a stray positional)
        option = token.split("=", 1)[0]
        if option.startswith("--"):
            option = "--" + option[2:].replace("_", "-")  # vLLM takes --tool_call_parser too
        action = parser._option_string_actions.get(option)  # argparse's own option table
        if action is not None:
            dests.append(action.dest)
    if any(not t.startswith("-") for t in argv[:1]):
        dests.append("model_tag")
    return dests


def _option(parser: argparse.ArgumentParser, dest: str) -> str:
    if dest == "model_tag":
        return "a model (the positional argument)"
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            return action.option_strings[0]
    return dest


def _engine_dests() -> set[str]:
    from vllm.engine.arg_utils import AsyncEngineArgs

    return {f.name for f in dataclasses.fields(AsyncEngineArgs)}
