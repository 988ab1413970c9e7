#!/usr/bin/env bash
# Run a command on another commit's code with this checkout's environment, for before/after runs:
#   benchmarks/at-commit.sh b74099d tailguard bench --workload overhead --out "$PWD/before-1"
# The commit's tree is unpacked once into /tmp/tailguard-at-<commit> (AT_COMMIT_DIR) and the command
# runs there: give it absolute paths. PYTHONPATH alone does not do this: the editable install's
# import hook finds this checkout's tailguard first, and a child started in this checkout's
# directory finds it first again. Check it worked: the lanes API's RSS is ~70 MB before vLLM's
# render layer (64181fd), ~650 MB after.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 COMMIT COMMAND [ARGS...]" >&2; exit 2; }
commit="$1"; shift
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${AT_COMMIT_DIR:-/tmp/tailguard-at-$commit}"
if [ ! -f "$dir/pyproject.toml" ]; then
  mkdir -p "$dir"
  git -C "$root" archive "$commit" | tar -x -C "$dir"
fi
mkdir -p "$dir/.at-commit"
cat > "$dir/.at-commit/sitecustomize.py" <<'PY'
# Drop the editable install's import hook, so PYTHONPATH's tree is the one imported.
import sys

sys.meta_path[:] = [f for f in sys.meta_path
                    if "__editable__" not in (getattr(f, "__module__", "") or type(f).__module__)]
PY
cd "$dir"
PATH="$root/.venv/bin:$PATH" PYTHONPATH="$dir/.at-commit:$dir" exec "$@"
