"""CONTRIBUTING.md's layout block lists exactly what the tree holds.

Its first column is a name: at the left margin a top-level folder (`name/`) or file, indented
two spaces a package (`name/`) or module (`name.py`) of `tailguard/`. Every tracked top-level
folder (hidden ones aside) and every package and module of `tailguard/` must be listed, and
every name listed must exist, so the map fails the suite the day it goes stale.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRY = re.compile(r"^( {0,2})(\S+)(?:\s|$)")


def layout_entries() -> tuple[set[str], set[str]]:
    """(top-level names, names inside tailguard/) as the layout block lists them."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    top: set[str] = set()
    inner: set[str] = set()
    for line in block.splitlines()[1:]:  # [0]: the fence's language, empty
        match = ENTRY.match(line)
        if match:
            (inner if match.group(1) else top).add(match.group(2))
    return top, inner


def test_the_layout_block_lists_every_top_level_folder_and_nothing_gone():
    top, _ = layout_entries()
    folders = {p.name + "/" for p in ROOT.iterdir()
               if p.is_dir() and not p.name.startswith(".") and not p.name.endswith(".egg-info")
               and p.name not in {"build", "dist", "__pycache__"} and any(p.rglob("*.*"))}
    assert {t for t in top if t.endswith("/")} == folders
    for name in top:
        assert (ROOT / name).exists(), f"CONTRIBUTING.md's layout lists {name}, which is gone"


def test_the_layout_block_lists_every_package_and_module_of_tailguard():
    _, inner = layout_entries()
    tree = {p.name + "/" for p in (ROOT / "tailguard").iterdir() if (p / "__init__.py").is_file()}
    tree |= {p.name for p in (ROOT / "tailguard").glob("*.py") if p.name != "__init__.py"}
    assert inner == tree, (f"missing from CONTRIBUTING.md's layout: {sorted(tree - inner)}; "
                           f"listed but gone: {sorted(inner - tree)}")
