"""Lanes files of other shapes for tests that reason about a partition of the engines: the
shipped lanes with rounds 1-4's dedicated workers (short alone; long and batch on the rest) and
sizes (long's batch of 8, no per-engine limits)."""

import re

from tailguard.lanes.table import default_lanes_path

PARTITION_WORKERS = """
[[workers]]
name = "short"
lanes = ["short"]

[[workers]]
name = "long"
lanes = ["long", "batch"]
replicas = "fill"
"""


def partitioned_default() -> str:
    """The packaged lanes.toml with dedicated workers instead of its one fleet entry."""
    text = default_lanes_path().read_text()
    text = re.sub(r"(?m)^max_running = \d+\n", "", text)
    head, long_lane, rest = re.split(r"(?s)(\[lanes\.long\].*?)(?=\n\[)", text, maxsplit=1)
    long_lane = re.sub(r"(?m)^max_num_seqs = \d+$", "max_num_seqs = 8", long_lane)
    text = head + long_lane + rest
    return text[:text.rindex("\n[[workers]]\n")] + "\n" + PARTITION_WORKERS
