"""The soak's short form (benchmarks/soak_faults.py --short): the whole system under `tailguard
up` (two workers serving every lane), loaded from four keys with a batch running, while each of
the six faults is injected once; then nothing lost, stuck or run twice, the batch complete with
one line per input line, the counters at zero and Redis memory back near its baseline. The
30-minute form and its figures: docs/reliability.md."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.faults


def test_the_short_soak_loses_nothing_whatever_breaks(tiny_model, tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import soak_faults

    report = soak_faults.run(soak_faults.parse(["--short", "--model", tiny_model,
                                                "--out", str(tmp_path)]))
    assert sorted(f["kind"] for f in report["faults"]
                  if not f["answer"].startswith("not injected")) == sorted(soak_faults.FAULTS)
    assert report["jobs_accepted"] > 0 and report["batch_line_jobs_finished"] > 0
    assert report["failures"] == [], report["failures"]
