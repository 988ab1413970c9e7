"""Print docs/architecture.md from what the code enforces; `--write` rewrites the file.

    python scripts/architecture_doc.py            # the markdown, to stdout
    python scripts/architecture_doc.py --write    # docs/architecture.md

Sources: the import-direction tables of tests/unit/test_import_directions.py (every
module-level `dict[str, set[str]]` whose name contains ``ALLOWED``, plus ``CROSS_CUTTING`` and
``TOOLS``), read by evaluating its literals, not by importing the test; each package's
``__init__`` docstring (its first paragraph: what it is); the job's two lifecycle drawings in
tailguard/jobs/store.py and tailguard/worker/runner.py, quoted as they stand, under one
drawing of the whole life whose states tests/unit/test_architecture_doc.py holds to
``tailguard.jobs.store.STATES``. A new package or arrow in the test's tables shows up here by
rerunning this script; tests/unit/test_architecture_doc.py fails until then.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
DIRECTIONS = ROOT / "tests" / "unit" / "test_import_directions.py"
#: the two docstrings whose drawings make up a job's life: (file, the part it tells)
LIFECYCLE_SOURCES = (("tailguard/jobs/store.py", "the record in Redis, as every process sees it"),
                     ("tailguard/worker/runner.py", "the same job on the worker that runs it"))

#: The job's whole life, joined from the two drawings: (from, to, what moves it, who does).
#: `[*]` is outside the store. The test holds its states to tailguard.jobs.store.STATES.
JOB_LIFE = (
    ("[*]", "queued", "accepted: admission passed, the message queued on its lane",
     "tailguard/gateway/service.py"),
    ("queued", "running", "a worker takes it, still wanted, engine up and warm",
     "tailguard/worker/runner.py"),
    ("running", "running", "engine died before the first token: once more, restarted engine",
     "tailguard/worker/runner.py"),
    ("running", "succeeded", "the engine finished", "tailguard/worker/runner.py"),
    ("running", "failed", "engine_dead, poison_request, an engine error",
     "tailguard/worker/runner.py"),
    ("running", "failed", "worker_lost: its worker stopped heart-beating",
     "tailguard/jobs/reaper.py"),
    ("running", "cancelled", "the client cancels (noticed while it runs)",
     "tailguard/gateway/service.py"),
    ("queued", "cancelled", "the client cancels", "tailguard/gateway/service.py"),
    ("queued", "expired", "waited past its lane's queue_ttl_s", "tailguard/worker/runner.py"),
    ("queued", "failed", "message_lost: its Celery message is gone",
     "tailguard/jobs/redeliver.py"),
)
TERMINAL_ORDER = ("succeeded", "failed", "cancelled", "expired")


def direction_tables() -> dict[str, object]:
    """The module-level names of the import-direction test whose values are plain data
    (literals, `set()`, and expressions over names defined before them), by name."""
    namespace: dict[str, object] = {}
    for node in ast.parse(DIRECTIONS.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            table, key = namespace.get(target.value.id), target.slice  # TABLE["x"] = {...}
            if isinstance(table, dict) and isinstance(key, ast.Constant):
                entry = _evaluate(value, namespace)
                if entry is not _NOT_DATA:
                    table[key.value] = entry
            continue
        if not isinstance(target, ast.Name):
            continue
        value = _evaluate(value, namespace)
        if value is not _NOT_DATA:
            namespace[target.id] = value
    return namespace


_NOT_DATA = object()


def _evaluate(node: ast.expr, namespace: dict[str, object]) -> object:
    """`node`'s value from literals, `set()`/`frozenset()` and the names before it, or
    _NOT_DATA (a path, a call: not a table)."""
    try:
        return eval(compile(ast.Expression(node), str(DIRECTIONS), "eval"),  # no builtins
                    {"__builtins__": {}, "set": set, "frozenset": frozenset, **namespace})
    except Exception:  # noqa: BLE001 - not plain data: not a table
        return _NOT_DATA


def _is_direction_table(value: object) -> bool:
    return (isinstance(value, dict) and bool(value)
            and all(isinstance(k, str) and isinstance(v, set | frozenset) for k, v in value.items()))


def allowed_tables() -> dict[str, dict[str, set[str]]]:
    """Every `...ALLOWED...` table of package -> the packages it may import, by name."""
    return {name: {k: set(v) for k, v in value.items()}
            for name, value in direction_tables().items()
            if "ALLOWED" in name and _is_direction_table(value)}


def _source(unit: str) -> Path | None:
    """The file whose docstring says what `unit` is: a tailguard package or module, or a
    top-level one of the checkout (app, tasks); dotted names are subpackages."""
    parts = unit.split(".")
    for base in (ROOT / "tailguard", ROOT):
        for path in (base.joinpath(*parts, "__init__.py"), base.joinpath(*parts).with_suffix(".py")):
            if path.is_file():
                return path
    return None


def _display(unit: str) -> str:
    path = _source(unit)
    if path is None:
        return unit
    rel = path.relative_to(ROOT)
    return str(rel.parent if rel.name == "__init__.py" else rel.with_suffix("")) + (
        "/" if rel.name == "__init__.py" else "")


def first_paragraph(unit: str) -> str:
    path = _source(unit)
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) if path else None
    if not doc:
        return "(no docstring)"
    return " ".join(doc.strip().split("\n\n")[0].split())


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _node(unit: str) -> str:
    return unit.replace(".", "_")


INTRO = """\
# Architecture

<!-- Generated by scripts/architecture_doc.py from tests/unit/test_import_directions.py's tables,
each package's __init__ docstring and the lifecycle docstrings of tailguard/jobs/store.py and
tailguard/worker/runner.py: edit those, then run `python scripts/architecture_doc.py --write`.
tests/unit/test_architecture_doc.py fails when this file and the code disagree. -->

A request goes from the Flask API (`app/`, a thin skin over `tailguard.gateway`) onto its lane's
Celery queue in Redis; a worker (`celery -A tasks worker -Q <lane>`, a thin skin over
`tailguard.worker`) runs it on the vLLM engine it hosts and writes its output to the job's Redis
stream, which the API reads back. This page is the map: the packages, what each owns, which may
import which (the arrows `tests/unit/test_import_directions.py` enforces on every import in the
tree), and a job's life across them.
"""


def packages_section() -> str:
    tables = allowed_tables()
    ns = direction_tables()
    cross = sorted(ns.get("CROSS_CUTTING", set()))
    tools = set(ns.get("TOOLS", set()))
    out = ["## Packages", ""]
    for name, table in tables.items():
        if len(tables) > 1:
            out += [f"### `{name}`", ""]
        out += ["| package | what it is | may import (besides itself and the cross-cutting modules) |",
                "|---|---|---|"]
        for unit in sorted(table):
            deps = ", ".join(f"`{d}`" for d in sorted(table[unit])) or "nothing of tailguard's"
            kind = " (a tool: only the CLI imports it)" if unit in tools else ""
            out.append(f"| `{_display(unit)}`{kind} | {_cell(first_paragraph(unit))} | {deps} |")
        out.append("")
    if cross:
        out += ["Cross-cutting modules, open to every package and importing nothing of tailguard's "
                "but each other: " + ", ".join(f"`tailguard/{m}.py`" for m in cross)
                + ". `tailguard/cli.py` (the `tailguard` command) wires everything.", ""]
    return "\n".join(out)


def arrows_section() -> str:
    tools = set(direction_tables().get("TOOLS", set()))
    out = ["## Allowed imports", "",
           "An arrow `a --> b`: `a` may import `b`. Everything else is a test failure. Tools "
           "(dashed) may import the product; nothing of the product imports them.", ""]
    tables = allowed_tables()
    for name, table in tables.items():
        if len(tables) > 1:
            out += [f"`{name}`:", ""]
        out += ["```mermaid", "flowchart TD"]
        for unit in sorted(set(table).union(*table.values())):
            out.append(f"    {_node(unit)}[{unit}]")
        for unit in sorted(table):
            arrow = "-.->" if unit in tools else "-->"
            out += [f"    {_node(unit)} {arrow} {_node(dep)}" for dep in sorted(table[unit])]
        out += ["```", ""]
    return "\n".join(out)


def lifecycle_drawing(relpath: str) -> str:
    """The first indented block of a module docstring: its drawing."""
    doc = ast.get_docstring(ast.parse((ROOT / relpath).read_text(encoding="utf-8")), clean=False)
    lines = (doc or "").splitlines()
    block: list[str] = []
    for line in lines[1:]:
        if line.startswith("    ") and line.strip():
            block.append(line[4:].rstrip())
        elif block:
            break
    return "\n".join(block)


def life_section() -> str:
    out = ["## A job's life", "",
           "One drawing of both halves: the record's state machine in Redis "
           "(`tailguard/jobs/store.py`, every move a compare-and-set in "
           "`tailguard/redis/lua/transition_job.lua`) and what the worker does with it "
           "(`tailguard/worker/runner.py`). Each arrow names the module that makes the move.", "",
           "```mermaid", "stateDiagram-v2"]
    for src, dst, what, who in JOB_LIFE:
        label = what.replace(":", ",")  # mermaid ends a label at a colon
        out.append(f"    {src} --> {dst}: {label} ({Path(who).stem})")
    out += [f"    {s} --> [*]" for s in TERMINAL_ORDER]
    out += ["```", "", "| from | to | what moves it | where |", "|---|---|---|---|"]
    out += [f"| {src} | {dst} | {_cell(what)} | `{who}` |" for src, dst, what, who in JOB_LIFE]
    out += ["", "The two drawings it joins, as their docstrings hold them:", ""]
    for relpath, part in LIFECYCLE_SOURCES:
        out += [f"`{relpath}`, {part}:", "", "```", lifecycle_drawing(relpath), "```", ""]
    return "\n".join(out)


def render() -> str:
    """The whole of docs/architecture.md."""
    return "\n".join([INTRO, packages_section(), arrows_section(), life_section()]).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from configuration_doc import write_or_print  # the generated docs' one command line

    return write_or_print(__doc__.splitlines()[0], DOC, render(), argv)


if __name__ == "__main__":
    sys.exit(main())
