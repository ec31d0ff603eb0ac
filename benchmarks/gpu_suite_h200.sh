#!/usr/bin/env bash
# The one-GPU H200 suite (the NCCL files need 2+ GPUs and are left out): every file of tests/gpu that runs on one
# GPU, each test capped, results and the log under $OUT. From the repository root, wheels installed:
#   . /tmp/h3site/env.sh && export PYTHONPATH=$PWD:$PYTHONPATH && H3_GPU_LANE=1 bash benchmarks/gpu_suite_h200.sh
# H3_GPU_LANE=1|2|3|4: one lane of tests/gpu/lanes.txt, one device call each (under 7 minutes); unset: every one-GPU
# file in one run (about 10 minutes: more than one 600 s device call holds). H3_GPU_FILES=... runs those files instead.
# Each run also writes the seconds each file took (setup + call + teardown of its tests, from --durations=0).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
lane=${H3_GPU_LANE:-}
if [ -n "$lane" ]; then
  files=$(awk -v l="$lane" '$1 == l {print "tests/gpu/" $2}' tests/gpu/lanes.txt)
  if [ -z "$files" ]; then
    echo "H3_GPU_LANE=$lane: no such lane in tests/gpu/lanes.txt (lanes: $(awk '/^[0-9]/ {print $1}' tests/gpu/lanes.txt | sort -u | paste -sd' '))" >&2
    exit 2
  fi
  LOG="$OUT/gpu-suite-h200-lane$lane.log"
  TIMES="$OUT/gpu-suite-h200-lane$lane-files.txt"
else
  files=$(ls tests/gpu/test_*.py | grep -v -e nccl -e ring)
  LOG="$OUT/gpu-suite-h200.log"
  TIMES="$OUT/gpu-suite-h200-files.txt"
fi
files=${H3_GPU_FILES:-$files}
# shellcheck disable=SC2086
timeout --kill-after=10 "${H3_T_SUITE:-540}" python -m pytest $files -m gpu -q -rA -s -p no:cacheprovider \
  --durations=0 --durations-min=0 --timeout "${H3_T_TEST:-240}" 2>&1 | tee "$LOG" \
  | grep -E "^\[gpu\]|PASSED|FAILED|ERROR|passed|failed|Error" | tail -80
rc=${PIPESTATUS[0]}
awk '$1 ~ /^[0-9.]+s$/ && $3 ~ /^tests\/gpu\// {split($3, p, "::"); t[p[1]] += substr($1, 1, length($1) - 1)}
     END {for (f in t) {printf "%8.1f s  %s\n", t[f], f; s += t[f]}; printf "%8.1f s  total\n", s}' "$LOG" \
  | sort -n > "$TIMES"
cat "$TIMES"
echo "suite exit $rc" | tee -a "$LOG"
