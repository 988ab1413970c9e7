"""docs/configuration.md is generated from the code's registries and must not drift from them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tailguard import settings
from tailguard.lanes.table import LANE_FIELDS, WORKER_FIELDS

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("configuration_doc",
                                                  ROOT / "scripts" / "configuration_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_doc_is_what_the_code_generates():
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == _generator().render(), (
        "docs/configuration.md differs from the settings and lanes-file registries: "
        "run `python scripts/configuration_doc.py --write`")


def test_every_setting_is_documented_with_its_default_and_doc():
    text = _generator().render()
    for s in settings.ALL:
        row = next((line for line in text.splitlines() if line.startswith(f"| `{s.env}` |")), None)
        assert row is not None, f"{s.env} is missing from the generated doc"
        assert " ".join(s.doc.split()).replace("|", "\\|") in row


def test_every_lanes_file_field_is_documented_under_its_table():
    text = _generator().render()
    lanes_part, _, workers_part = text.partition("### `[[workers]]`")
    for key, fd in LANE_FIELDS.items():
        assert f"| `{key}` |" in lanes_part and " ".join(fd.doc.split()) in lanes_part, key
    for key, fd in WORKER_FIELDS.items():
        assert f"| `{key}` |" in workers_part and " ".join(fd.doc.split()) in workers_part, key


def test_a_new_registry_is_picked_up_without_editing_the_generator(monkeypatch):
    import tailguard.lanes.table as table

    extra = {"devices": table.FieldDoc((list,), "[]", "the accelerators a worker's engine uses")}
    monkeypatch.setattr(table, "EXAMPLE_EXTRA_FIELDS", extra, raising=False)
    text = _generator().render()
    assert "### `EXAMPLE_EXTRA_FIELDS`" in text
    assert "| `devices` | array | [] | the accelerators a worker's engine uses |" in text
