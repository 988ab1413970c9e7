"""docs/architecture.md is generated from the import-direction test's tables and the packages'
docstrings, and must not drift from them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tailguard.jobs.store import STATES

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("architecture_doc",
                                                  ROOT / "scripts" / "architecture_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_doc_is_what_the_code_generates():
    committed = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert committed == _generator().render(), (
        "docs/architecture.md differs from tests/unit/test_import_directions.py's tables or the "
        "packages' docstrings: run `python scripts/architecture_doc.py --write`")


def test_the_tables_are_read_from_the_import_direction_test():
    import test_import_directions as directions

    gen = _generator()
    assert gen.allowed_tables()["ALLOWED"] == directions.ALLOWED
    ns = gen.direction_tables()
    assert ns["CROSS_CUTTING"] == directions.CROSS_CUTTING and ns["TOOLS"] == directions.TOOLS
    text = gen.render()
    for package in directions.ALLOWED:
        assert f"| `tailguard/{package}/`" in text, package


def test_the_job_life_names_exactly_the_stores_states_and_real_modules():
    gen = _generator()
    named = {s for src, dst, _, _ in gen.JOB_LIFE for s in (src, dst)} - {"[*]"}
    assert named == set(STATES)
    assert set(gen.TERMINAL_ORDER) == set(STATES) - {"queued", "running"}
    for *_, where in gen.JOB_LIFE:
        assert (ROOT / where).is_file(), where
    for relpath, _ in gen.LIFECYCLE_SOURCES:
        assert "queued" in gen.lifecycle_drawing(relpath) and "running" in gen.lifecycle_drawing(relpath)


def test_a_new_table_or_package_is_picked_up_without_editing_the_generator(tmp_path, monkeypatch):
    gen = _generator()
    source = gen.DIRECTIONS.read_text(encoding="utf-8")
    extra = ('\nAPP_ALLOWED: dict[str, set[str]] = {"app": {"gateway"} | ALLOWED["redis"]}\n'
             'ALLOWED["conformance"] = {"model", "lanes"}\n')
    copy = tmp_path / "test_import_directions.py"
    copy.write_text(source + extra, encoding="utf-8")
    monkeypatch.setattr(gen, "DIRECTIONS", copy)
    tables = gen.allowed_tables()
    assert tables["APP_ALLOWED"] == {"app": {"gateway"}}
    assert tables["ALLOWED"]["conformance"] == {"model", "lanes"}
    text = gen.render()
    assert "### `APP_ALLOWED`" in text and "| `app/` |" in text  # the checkout's app/ docstring
    assert "    app --> gateway" in text and "    conformance -.-> model" in text  # a tool: dashed
