"""The Redis Lua scripts live in tailguard/redis/lua/*.lua, ship with the package, and nowhere else."""

import re
import tomllib
from fnmatch import fnmatch

from conftest import ROOT

from tailguard.redis import lua

LUA_DIR = ROOT / "tailguard" / "redis" / "lua"


def test_every_script_file_is_package_data():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setup["package-data"]["tailguard.redis.lua"]
    files = sorted(LUA_DIR.glob("*.lua"))
    assert files
    for path in files:
        assert any(fnmatch(path.name, p) for p in patterns), path.name


def test_no_lua_inside_python():
    for folder in ("app", "tasks", "tailguard"):
        for path in (ROOT / folder).rglob("*.py"):
            assert "redis.call(" not in path.read_text(), path


def test_a_script_is_its_files_in_order():
    text = lua.source("clock", "transition_job")
    assert text.index("local now") < text.index("cjson.decode(ARGV[1])")
    assert lua.source("clock", "transition_job") is text  # read once


def test_no_script_hard_codes_a_stream_cap():
    """Stream caps are arguments: their values have one owner in Python (settings, jobs.py)."""
    for path in LUA_DIR.glob("*.lua"):
        assert not re.search(r"MAXLEN'\s*,\s*'~'\s*,\s*'?\d", path.read_text()), path.name
