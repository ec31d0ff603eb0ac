#!/usr/bin/env bash
# The one-GPU H200 suite in one device call (the NCCL files need 2+ GPUs and are left out): every file of tests/gpu
# that runs on one GPU, each capped, results and the log under $OUT. From the repository root, wheels installed:
#   . /tmp/h3site/env.sh && export PYTHONPATH=$PWD:$PYTHONPATH && bash benchmarks/gpu_suite_h200.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
LOG="$OUT/gpu-suite-h200.log"
files=${H3_GPU_FILES:-$(ls tests/gpu/test_*.py | grep -v -e nccl -e ring)}
# shellcheck disable=SC2086
timeout --kill-after=10 "${H3_T_SUITE:-540}" python -m pytest $files -m gpu -q -rA -s -p no:cacheprovider \
  --timeout "${H3_T_TEST:-240}" 2>&1 | tee "$LOG" | grep -E "^\[gpu\]|PASSED|FAILED|ERROR|passed|failed|Error" | tail -80
echo "suite exit ${PIPESTATUS[0]}" | tee -a "$LOG"
