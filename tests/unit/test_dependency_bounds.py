"""pyproject.toml's lower bounds admit no release that lacks an API the code calls: a fresh
install resolves to the newest release, so only an old pinned one would find out at run time."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]

#: (distribution, the oldest release with what the code uses, where it is used)
NEEDS = [
    # Request.max_content_length as a setter, per request: Flask 3.1
    ("flask", "3.1", "app/batches.py"),
]


def requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {(r := Requirement(line)).name.lower(): r for line in project["dependencies"]}


@pytest.mark.parametrize("name, oldest, where", NEEDS)
def test_the_lower_bound_is_the_oldest_release_the_code_runs_on(name, oldest, where):
    spec = requirements()[name].specifier
    below = Version(oldest).release
    older = Version(".".join(map(str, (*below[:-1], below[-1] - 1))) + ".99")
    assert not spec.contains(older), f"{name}{spec} admits {older}; {where} needs {oldest}"
    assert spec.contains(oldest)
