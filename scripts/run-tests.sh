#!/usr/bin/env bash
# The whole suite, as `make test` runs it, in two pytest processes at once: the tiers that
# start vLLM engines (e2e, faults, multihost), one after another in one process, as a serial
# run orders them (their engines together would not fit a 24 GiB machine), and beside it the
# tiers without an engine (unit, integration, fuzz), which fill the core an engine start
# leaves idle. Each process starts its own redis-server. The second one's output follows the
# first's; the exit status is non-zero if either failed.
#   scripts/run-tests.sh [PYTEST ARGS]     (PYTHON: the interpreter, .venv/bin/python by default)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
ENGINE_TIERS=(tests/e2e tests/faults tests/multihost)
OTHER_TIERS=(tests/unit tests/integration tests/fuzz)
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

"$PY" -m pytest "${OTHER_TIERS[@]}" "$@" >"$log" 2>&1 &
other=$!
trap 'kill "$other" 2>/dev/null; rm -f "$log"' EXIT
echo "run-tests: ${OTHER_TIERS[*]} in the background (pid $other); ${ENGINE_TIERS[*]} here"
"$PY" -m pytest "${ENGINE_TIERS[@]}" "$@"
engines=$?
wait "$other"
rest=$?
echo
echo "run-tests: ${OTHER_TIERS[*]}, which ran beside the engine tiers:"
cat "$log"
echo "run-tests: ${ENGINE_TIERS[*]}: exit $engines; ${OTHER_TIERS[*]}: exit $rest"
[ "$engines" -eq 0 ] && [ "$rest" -eq 0 ]
