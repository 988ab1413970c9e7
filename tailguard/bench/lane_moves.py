"""Lane moves during a phase, read from the API's /metrics (the hook for the lane controller).

The lane controller (issue 33) exposes, on the API's /metrics, a counter of moves
``tailguard_lane_moves_total{from,to,reason}`` and a histogram of their durations (decision
to the first job of the new lane started) ``tailguard_lane_move_seconds``, and of the drain
within them ``tailguard_lane_move_drain_seconds``. A phase reads them before and after
(`LaneMoveWatch`); the difference is the phase's moves and the P50/P99 of their durations
and drains, as a histogram gives them: the upper bound of the bucket the rank falls in. A
topology whose /metrics has neither (no controller, or `direct`) reports ``exposed: False``:
the report says 'no moves'.

The metric names are written here until the controller's module owns them: import them from
there then (one owner per name).
"""

from __future__ import annotations

import http.client
import math
from collections import Counter
from typing import Any

from tailguard.bench.loadgen import Client

MOVES_TOTAL = "tailguard_lane_moves_total"
MOVE_SECONDS = "tailguard_lane_move_seconds"
DRAIN_SECONDS = "tailguard_lane_move_drain_seconds"


def parse(text: str) -> dict[str, Any]:
    """What /metrics says of lane moves: moves by (from, to, reason), the duration histogram's
    cumulative counts by upper bound (label sets summed), its count and sum; `exposed` is
    whether either metric is there."""
    from prometheus_client.parser import text_string_to_metric_families

    moves: Counter[tuple[str, str, str]] = Counter()
    buckets: Counter[float] = Counter()
    drain: Counter[float] = Counter()
    count = total = 0.0
    exposed = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == MOVES_TOTAL:
                exposed = True
                key = tuple(sample.labels.get(k, "") for k in ("from", "to", "reason"))
                moves[key] += sample.value  # type: ignore[index]
            elif sample.name == MOVE_SECONDS + "_bucket":
                exposed = True
                buckets[float(sample.labels["le"])] += sample.value
            elif sample.name == DRAIN_SECONDS + "_bucket":
                drain[float(sample.labels["le"])] += sample.value
            elif sample.name == MOVE_SECONDS + "_count":
                count += sample.value
            elif sample.name == MOVE_SECONDS + "_sum":
                total += sample.value
    return {"exposed": exposed, "moves": moves, "buckets": buckets, "drain": drain,
            "count": count, "sum": total}


def bucket_quantile(buckets: dict[float, float], q: float) -> float | None:
    """The `q`-th percentile (0-100) of a histogram's cumulative `buckets` (upper bound ->
    count): the smallest bound whose count reaches the nearest rank; None when empty or when
    the rank is only in the +Inf bucket."""
    bounds = sorted(buckets)
    if not bounds or not buckets[bounds[-1]]:
        return None
    rank = max(1, math.ceil(q / 100 * buckets[bounds[-1]]))
    bound = next(b for b in bounds if buckets[b] >= rank)
    return None if math.isinf(bound) else bound


def between(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The moves from `before` to `after` (two `parse` results) with the P50/P99 of their
    durations; the report's `lane_moves` entry of a phase."""
    if not after["exposed"]:
        return {"exposed": False, "moves": 0}
    moves = {k: n - before["moves"].get(k, 0) for k, n in after["moves"].items()}
    buckets = {le: n - before["buckets"].get(le, 0) for le, n in after["buckets"].items()}
    drain = {le: n - before["drain"].get(le, 0) for le, n in after["drain"].items()}
    return {"exposed": True, "moves": int(sum(moves.values())),
            "by_move": [{"from": f, "to": t, "reason": r, "count": int(n)}
                        for (f, t, r), n in sorted(moves.items()) if n > 0],
            "timed": int(after["count"] - before["count"]),
            "move_p50_s": bucket_quantile(buckets, 50), "move_p99_s": bucket_quantile(buckets, 99),
            "drain_p50_s": bucket_quantile(drain, 50), "drain_p99_s": bucket_quantile(drain, 99)}


def describe(entry: dict[str, Any] | None) -> str:
    """One line's text: 'no moves', or how many, which, and how long they took."""
    if not entry or not entry.get("exposed") or not entry.get("moves"):
        return "no moves" + ("" if entry and entry.get("exposed") else
                             f" (no {MOVES_TOTAL} on /metrics)")

    def le(v: float | None) -> str:
        return "n/a" if v is None else f"<= {v:g} s"

    which = ", ".join(f"{m['from']}->{m['to']} ({m['reason']}) {m['count']}"
                      for m in entry["by_move"])
    return (f"{entry['moves']} moves: {which}; move time (decision -> first job of the new "
            f"lane started) P50 {le(entry['move_p50_s'])}, P99 {le(entry['move_p99_s'])}; "
            f"of which the drain (old lanes' running jobs) P50 {le(entry.get('drain_p50_s'))}, "
            f"P99 {le(entry.get('drain_p99_s'))}")


class LaneMoveWatch:
    """The lane moves of one phase: read /metrics at the start, `stop()` at the end."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.before = self._read()

    def _read(self) -> dict[str, Any]:
        try:
            code, body = self.client.get_json("/metrics")
        except (OSError, http.client.HTTPException):
            code, body = 0, ""
        return parse(body) if code == 200 and isinstance(body, str) else parse("")

    def stop(self) -> dict[str, Any]:
        return between(self.before, self._read())
