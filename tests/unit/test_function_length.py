"""No function of the product's domain code (tailguard/ but its tools, and tasks/) runs past 80
lines: a longer one is several steps that want names (issue 32). The tools (bench, plan,
conformance) may, with a comment in the function that says why. (app/openapi.py's schema table is
data, not steps.)"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

LIMIT = 80
TOOLS = {"bench", "plan", "conformance"}


def _long_functions(path: Path) -> list[tuple[str, int, int]]:
    source = path.read_text(encoding="utf-8")
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > LIMIT:
                body = source.splitlines()[node.lineno - 1:node.end_lineno]
                out.append((node.name, length, sum("#" in line for line in body)))
    return out


def test_no_product_function_is_over_80_lines():
    files = [p for d in ("tailguard", "tasks") for p in (ROOT / d).rglob("*.py")
             if not (d == "tailguard" and p.relative_to(ROOT / d).parts[0] in TOOLS)]
    long = {f"{p.relative_to(ROOT)}:{name}": n for p in files for name, n, _ in _long_functions(p)}
    assert long == {}


def test_a_long_tool_function_says_why():
    files = [p for tool in TOOLS for p in (ROOT / "tailguard" / tool).rglob("*.py")]
    silent = [f"{p.relative_to(ROOT)}:{name} ({n} lines)" for p in files
              for name, n, comments in _long_functions(p) if comments == 0]
    assert silent == []
