"""What the README promises a reader, held to the code it describes."""

from __future__ import annotations

import re
from pathlib import Path

from tailguard import errors

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_stays_short():
    assert len(README.encode()) <= 12 * 1024


def test_the_readme_lists_every_http_status_the_error_tree_answers_with():
    tree = errors.__doc__.split("::", 1)[1].split("\n\n")[1]
    statuses = {int(m) for m in re.findall(r"\s([1-5]\d\d)\b", tree)}
    listed = re.search(r"errors \(([\d, \n]+)\)", README)
    assert listed, "the README's list of error statuses is gone"
    assert {int(s) for s in re.findall(r"\d{3}", listed.group(1))} == statuses


def test_the_readme_shows_the_cards_three_uses_and_what_a_cpu_host_gets():
    assert "curl -s -XPOST localhost:8000/v1/jobs" in README and "localhost:8000/v1/jobs/" in README
    assert "**Flower**" in README
    assert re.search(r"CUDA_VISIBLE_DEVICES=\d celery -A tasks worker -Q short", README)
    assert "lanes-cpu.toml" in README
