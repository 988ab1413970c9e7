#!/usr/bin/env bash
# Install tailguard the way users do, from a wheel into a clean venv outside the source tree,
# and run what an installed tailguard must be able to run: the CLI (every subcommand's --help)
# and the imports of the API and the Celery app. A package left out of the wheel fails here.
#   scripts/check-wheel.sh            (make test runs it first)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "check-wheel: building the wheel"
# from a copy of the files git knows (committed or not), so nothing untracked rides along and
# setuptools' build/ stays out of the tree
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/src" 2>/dev/null || true
"$PY" -m pip wheel --disable-pip-version-check -q --no-deps -w "$work/dist" "$work/src" >/dev/null
wheel=("$work"/dist/tailguard-*.whl)
"$PY" -m venv "$work/venv"
echo "check-wheel: installing $(basename "${wheel[0]}") into a clean venv"
"$work/venv/bin/python" -m pip install --disable-pip-version-check -q "${wheel[0]}" 2>&1 \
  | grep -v "^WARNING: Location" || true

cd "$work"   # nothing of the source tree on sys.path
tg="$work/venv/bin/tailguard"
"$tg" --help >/dev/null
# every subcommand, nested groups included, from the CLI's own tree
"$work/venv/bin/python" - "$tg" <<'PY'
import subprocess, sys
import click
from tailguard.cli import main

def walk(cmd, path):
    yield path
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from walk(sub, [*path, name])

failed = []
paths = list(walk(main, []))
for path in paths:
    out = subprocess.run([sys.argv[1], *path, "--help"], capture_output=True, text=True)
    if out.returncode != 0:
        failed.append((" ".join(path), out.stderr.strip().splitlines()[-1:]))
for name, err in failed:
    print(f"check-wheel: `tailguard {name} --help` failed: {err}", file=sys.stderr)
print(f"check-wheel: {len(paths)} commands answer --help" if not failed else "", file=sys.stderr)
sys.exit(1 if failed else 0)
PY
"$work/venv/bin/python" -c 'import app, tasks, celeryconfig; app.create_app()'
"$work/venv/bin/python" -c 'import importlib.resources as r; assert r.files("tailguard.lanes").joinpath("lanes.toml").is_file(); assert list(r.files("tailguard.redis.lua").iterdir())'
echo "check-wheel: ok: the installed CLI, API and Celery app start"
