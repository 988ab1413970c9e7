"""No tracked file records an absolute path of the machine someone worked on.

A developer's checkout, home or scratch run folder (`/work/...`, `/home/alice/...`,
`/tmp/bench-...`) means nothing on another machine: a doc citing one cannot be followed, a
data file holding one leaks where it was made. Paths every machine has (`/proc`, `/usr/bin`,
`/dev/null`), the images' own (`/home/tailguard`) and the fixed scratch names commands use
(`/tmp/tailguard-e2e.lock`) are not of that kind and are not matched.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Prefixes that name a particular machine's places: homes, checkouts, mounts, run folders.
MACHINE_PREFIXES = ("/root/", "/home/", "/Users/", "/work/", "/workspace/", "/mnt/", "/media/",
                    "/tmp/bench-", "/tmp/pytest-", "/private/var/folders/")
#: Under a machine prefix but the same everywhere: the images' non-root user's home.
ALLOWED = ("/home/tailguard",)
#: The path may follow only something that cannot be part of a longer path or a URL.
PATH = re.compile("(?<![\\w./~:-])(" + "|".join(re.escape(p) for p in MACHINE_PREFIXES)
                  + r")[^\s`'\"()<>\[\],;]*")


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def machine_paths(text: str) -> list[str]:
    return [m.group(0) for m in PATH.finditer(text) if not m.group(0).startswith(ALLOWED)]


def test_the_pattern_finds_machine_paths_and_only_them():
    assert machine_paths('"model": "/work/wt/w/.tailguard/models/demo-small"') == [
        "/work/wt/w/.tailguard/models/demo-small"]
    assert machine_paths("--frontend-from /tmp/bench-fs1/report.json, /root/x and /home/al/y") == [
        "/tmp/bench-fs1/report.json", "/root/x", "/home/al/y"]
    assert not machine_paths("/proc/self/stat /usr/bin/env /dev/null /tmp/tailguard-e2e.lock "
                             "WORKDIR /home/tailguard https://example.org/work/x docs/work/y")


def test_no_tracked_file_holds_a_machine_path():
    found = []
    for path in _tracked():
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary: an image, a model file
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {p}" for p in machine_paths(line)]
    assert not found, "absolute paths of a machine in the tree:\n" + "\n".join(found)


def test_a_step_models_source_records_names_not_where_they_lay(tmp_path):
    """`tailguard plan --profile` and `--frontend-from` write these into a committed JSON."""
    from tailguard.plan.stepmodel import path_free

    model = tmp_path / "models" / "demo-small"
    model.mkdir(parents=True)
    assert path_free(str(model)) == "demo-small"
    assert path_free("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert path_free(tmp_path / "bench-fs1" / "report.json", 2) == "bench-fs1/report.json"
