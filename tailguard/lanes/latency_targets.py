"""Per-request latency targets: what a caller may ask for, within its key's bounds.

Pure, no I/O. A request may state a time-to-first-token and a time-per-output-token target in
milliseconds (headers: tailguard/gateway/target_headers.py). A target reorders who is served and
who is refused, so each key bounds the targets it may ask for (``TargetBounds``, kept with the
key): an asked target is clamped into them, and the response says so. The time-to-first-token
target decides placement (of the lanes that accept the request, the first whose predicted wait
meets it: a request the short lane can serve in time is not sent to the long one to wait) and
admission (a target the request's predicted time to first token misses is refused at once,
429 ``wait_past_target``). That prediction is the lane's predicted wait, then the request's
prefill and one step (``AdmissionPolicy.first_token_s``): a 1 ms target is missed on an idle
lane too.
The time-per-output-token target is recorded and reported, not decided on: the API knows no
lane's decode speed. vLLM's integer ``priority`` body field (lower is scheduled first, on an
engine that schedules by priority) is such a claim too: a key may bound how urgent a priority
it sends (``min_vllm_priority``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tailguard.errors import ConfigError, WaitPastTarget
from tailguard.lanes.placement import Placement

#: what a refusal on the TTFT target names as its field: the header that asks for it
TTFT_FIELD = "x-llm-d-slo-ttft-ms"
#: the largest target taken (a day): a larger one is read as this
MAX_TARGET_MS = 86_400_000


@dataclass(frozen=True)
class TargetBounds:
    """The targets a key may ask for, in ms (None: no bound): a tighter one than ``min_*`` is
    raised to it (a tight target is a claim on the lane before others), a looser one than
    ``max_*`` lowered to it; and the most urgent vLLM priority it may send."""

    min_ttft_ms: int | None = None
    max_ttft_ms: int | None = None
    min_tpot_ms: int | None = None
    max_tpot_ms: int | None = None
    min_vllm_priority: int | None = None

    def check(self) -> None:
        """ConfigError naming the bound that is out of range or above its max."""
        for name in ("ttft", "tpot"):
            lo, hi = getattr(self, f"min_{name}_ms"), getattr(self, f"max_{name}_ms")
            for bound, value in ((f"min_{name}_ms", lo), (f"max_{name}_ms", hi)):
                if value is not None and not 0 < value <= MAX_TARGET_MS:
                    raise ConfigError(f"{bound} must be in 1..{MAX_TARGET_MS}", field=bound)
            if lo is not None and hi is not None and lo > hi:
                raise ConfigError(f"min_{name}_ms {lo} is above max_{name}_ms {hi}",
                                   field=f"min_{name}_ms")


@dataclass(frozen=True)
class LatencyTarget:
    """A request's targets in ms (None: none asked), as applied, and as asked."""

    ttft_ms: int | None = None
    tpot_ms: int | None = None
    asked_ttft_ms: int | None = None
    asked_tpot_ms: int | None = None

    @property
    def asked(self) -> bool:
        return self.asked_ttft_ms is not None or self.asked_tpot_ms is not None

    @property
    def clamped(self) -> bool:
        """Whether the key's bounds changed what was asked."""
        return (self.ttft_ms, self.tpot_ms) != (self.asked_ttft_ms, self.asked_tpot_ms)

    def to_dict(self) -> dict[str, int | bool | None]:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms,
                "asked_ttft_ms": self.asked_ttft_ms, "asked_tpot_ms": self.asked_tpot_ms,
                "clamped": self.clamped}


def clamp_target(ttft_ms: int | None, tpot_ms: int | None, bounds: TargetBounds) -> LatencyTarget:
    """The targets applied: each asked one clamped into the key's bounds; none asked, none."""
    return LatencyTarget(
        ttft_ms=_clamp(ttft_ms, bounds.min_ttft_ms, bounds.max_ttft_ms),
        tpot_ms=_clamp(tpot_ms, bounds.min_tpot_ms, bounds.max_tpot_ms),
        asked_ttft_ms=ttft_ms, asked_tpot_ms=tpot_ms)


def _clamp(value: int | None, lo: int | None, hi: int | None) -> int | None:
    if value is None:
        return None
    if lo is not None:
        value = max(value, lo)
    if hi is not None:
        value = min(value, hi)
    return value


def clamp_vllm_priority(value: int | None, bounds: TargetBounds) -> int | None:
    """vLLM's priority as sent (None: none sent), never more urgent than the key may ask."""
    if value is None or bounds.min_vllm_priority is None:
        return value
    return max(value, bounds.min_vllm_priority)


def meets_ttft(target: LatencyTarget, predicted_ttft_s: float) -> bool:
    """Whether a request whose first token is predicted after `predicted_ttft_s` meets its TTFT
    target (no target: any time does)."""
    return target.ttft_ms is None or predicted_ttft_s * 1000.0 <= target.ttft_ms


def preferring_lanes_in_time(target: LatencyTarget,
                             predicted_ttft_s: Callable[[Placement], float]
                             ) -> Callable[[Placement], bool] | None:
    """placement.place's `prefer` for a request with a TTFT target: a lane whose predicted time
    to first token for the request as placed there (`predicted_ttft_s`) meets it; None without
    a target (first fit, and no lane's load read)."""
    if target.ttft_ms is None:
        return None
    return lambda placement: meets_ttft(target, predicted_ttft_s(placement))


def admit_target(target: LatencyTarget, lane: str, predicted_wait_s: float,
                 first_token_s: float = 0.0) -> None:
    """WaitPastTarget (429, Retry-After: until the wait would meet it) when the predicted time
    to first token (the lane's predicted wait, then `first_token_s` of prefill and a step)
    misses the request's TTFT target."""
    if meets_ttft(target, predicted_wait_s + first_token_s):
        return
    wait_ms, first_ms = predicted_wait_s * 1000.0, first_token_s * 1000.0
    raise WaitPastTarget(
        f"lane {lane!r} would give this request its first token in about "
        f"{wait_ms + first_ms:.0f} ms (a wait of {wait_ms:.0f} ms, then {first_ms:.0f} ms of "
        f"prefill and a step), past its time-to-first-token target of {target.ttft_ms} ms",
        field=TTFT_FIELD,
        retry_after_s=max(1, math.ceil((wait_ms + first_ms - (target.ttft_ms or 0)) / 1000.0)),
        lane=lane)


def target_outcome(job: Mapping[str, Any]) -> dict[str, Any]:
    """A job's targets (its record's ``slo_ttft_ms``/``slo_tpot_ms``) and whether each was met
    (None: not asked, or not known yet): TTFT as the client sees it (queue wait + the engine's),
    TPOT the decode time after the first token over the tokens after it."""
    ttft_ms, tpot_ms = job.get("slo_ttft_ms"), job.get("slo_tpot_ms")
    submitted, started, first = job.get("submitted_at"), job.get("running_at"), job.get("ttft_s")
    ended = next((job[k] for k in ("succeeded_at", "failed_at", "cancelled_at") if k in job), None)
    ttft_s = started - submitted + first if None not in (submitted, started, first) else None
    tokens = job.get("completion_tokens", (job.get("result") or {}).get("completion_tokens"))
    tpot_s = ((ended - started - first) / (tokens - 1)
              if None not in (ended, started, first) and isinstance(tokens, int) and tokens > 1
              else None)
    return {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms,
            "ttft_met": _met(ttft_ms, ttft_s), "tpot_met": _met(tpot_ms, tpot_s)}


def _met(target_ms: int | None, took_s: float | None) -> bool | None:
    return None if target_ms is None or took_s is None else took_s * 1000.0 <= target_ms
