"""tailguard's Redis Lua scripts: one file each, read once, registered once per client.

As dramatiq keeps its broker's Lua: the text lives in ``.lua`` files next to this
module (package data, so an installed tailguard has them), never in Python strings.
Each script takes its keys in KEYS and its arguments by name: one JSON object in
ARGV[1], decoded with cjson in the script.

A script may be built from several files, concatenated in order: scripts that
stamp times start with ``clock``, the one definition of ``now``.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

import redis


@functools.cache
def source(*names: str) -> str:
    """The text of the named files (without ``.lua``), concatenated in order."""
    folder = resources.files(__name__)
    return "\n".join(folder.joinpath(f"{name}.lua").read_text(encoding="utf-8") for name in names)


class Script:
    """One script registered with one client: called by SHA, loaded into Redis on first use."""

    def __init__(self, client: redis.Redis, *names: str) -> None:
        self._script = client.register_script(source(*names))

    def __call__(self, keys: list[str], *, client: redis.Redis | None = None, **args: Any) -> Any:
        """Run it with `args` (no script takes one named ``client``: that is the client to run
        it on, when not the one it was registered with)."""
        return self._script(keys=keys, args=[json.dumps(args, ensure_ascii=False,
                                                        separators=(",", ":"))], client=client)
