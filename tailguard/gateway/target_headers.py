"""The latency-target headers of a request: llm-d's ``x-llm-d-slo-ttft-ms`` and
``x-llm-d-slo-tpot-ms``, the older ``x-slo-ttft-ms`` / ``x-slo-tpot-ms`` as aliases, read on
every submitting route (what is done with them: tailguard/lanes/latency_targets.py)."""

from __future__ import annotations

from collections.abc import Mapping

from tailguard.errors import InvalidField
from tailguard.lanes.latency_targets import MAX_TARGET_MS, TTFT_FIELD

#: each target's headers, the first preferred: llm-d's name, then the older alias
TTFT_HEADERS = (TTFT_FIELD, "x-slo-ttft-ms")
TPOT_HEADERS = ("x-llm-d-slo-tpot-ms", "x-slo-tpot-ms")


def parse_target_headers(headers: Mapping[str, str]) -> tuple[int | None, int | None]:
    """The (ttft, tpot) targets in ms a request's headers ask for (names matched case-blind;
    llm-d's name wins over the alias); InvalidField for one that is not a positive number."""
    lowered = {k.lower(): v for k, v in headers.items()}
    return (_header_ms(lowered, TTFT_HEADERS), _header_ms(lowered, TPOT_HEADERS))


def _header_ms(headers: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw.strip())
        except ValueError:
            raise InvalidField(f"{name} must be a number of milliseconds, not {raw!r}",
                               field=name) from None
        if not 0 < value < float("inf"):
            raise InvalidField(f"{name} must be > 0 milliseconds", field=name)
        return max(1, min(MAX_TARGET_MS, round(value)))
    return None
