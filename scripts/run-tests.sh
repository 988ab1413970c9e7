#!/usr/bin/env bash
# The whole suite, as `make test` runs it, in two pytest processes at once, so that one's
# work fills the core the other leaves idle (an engine start runs on one core at a time):
#   1. the engine tiers (e2e, faults, multihost), one after another as a serial run orders
#      them: the e2e tier's session workers, then the fault and multi-host tiers' own;
#   2. the tiers without an engine (unit, integration, fuzz), then the tests that bring up a
#      whole system of their own (`tailguard bench`, `tailguard up`, the batch fault test's
#      API and two workers, the short soak's `tailguard up`), so the two processes take about as long.
# Each process starts its own redis-server; between them at most about five engines run,
# which fits 24 GiB (the suite's engines have a 256 MiB KV cache: tests/lanes.test.toml).
# The second process's output follows the first's; the exit status is non-zero if either
# failed. A plain `pytest` runs everything serially instead, in tier order.
#   scripts/run-tests.sh [PYTEST ARGS]     (PYTHON: the interpreter, .venv/bin/python by default)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
WHOLE_SYSTEMS=(tests/e2e/test_bench_smoke.py tests/e2e/test_up_default_model.py
               tests/faults/test_batch_faults.py tests/faults/test_soak.py)
ENGINE_TIERS=(tests/e2e tests/faults tests/multihost)
OTHER_TIERS=(tests/unit tests/integration tests/fuzz "${WHOLE_SYSTEMS[@]}")
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

"$PY" -m pytest "${OTHER_TIERS[@]}" "$@" >"$log" 2>&1 &
other=$!
trap 'kill "$other" 2>/dev/null; rm -f "$log"' EXIT
echo "run-tests: ${OTHER_TIERS[*]} in the background (pid $other);" \
     "${ENGINE_TIERS[*]} (but those two) here"
"$PY" -m pytest "${ENGINE_TIERS[@]}" "${WHOLE_SYSTEMS[@]/#/--ignore=}" "$@"
engines=$?
wait "$other"
rest=$?
echo
echo "run-tests: ${OTHER_TIERS[*]}, which ran beside the engine tiers:"
cat "$log"
echo "run-tests: ${ENGINE_TIERS[*]}: exit $engines; ${OTHER_TIERS[*]}: exit $rest"
[ "$engines" -eq 0 ] && [ "$rest" -eq 0 ]
