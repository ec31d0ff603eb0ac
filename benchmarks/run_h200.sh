#!/usr/bin/env bash
# The GPU suite, the kernel bench and the block bench on the H200, in ONE device call, from the repository root, after the
# GPU wheels are installed (shared/gpu/README.md):
#
#   . /tmp/h3site/env.sh && export PYTHONPATH=$PWD:$PYTHONPATH && bash benchmarks/run_h200.sh
#
# Steps, each under `timeout` within one overall budget (H3_BUDGET_S, default 540 s; the call allows 600):
#   env      versions, GPU, imports                                        -> run.log
#   suite    python -m pytest tests/gpu -m gpu -q -rA                      -> gpu-suite.log
#   kernels  python benchmarks/fused_kernels.py --out $OUT                       -> kernels-h200.json/.md
#   block    python -m h3plan action=bench ... once per plan in H3_BLOCK_PLANS (default: the bf16 and the
#            fp8 recipe, two processes appending to one JSON): diffusers eager, diffusers' best (regional
#            compile, bench.best=on; its compile ~10-20 s per S, timed apart) and the plan -> block-h200.json/.md/.png
#   summary  exit code and time of every step, the targets, the files in $OUT
# Skip a step with H3_SKIP_ENV / H3_SKIP_SUITE / H3_SKIP_KERNELS / H3_SKIP_BLOCK =1; per-step caps
# H3_T_SUITE, H3_T_KERNELS, H3_T_BLOCK (seconds, each block plan); H3_BENCH_ARGS adds overrides to every
# block run (e.g. 'bench.seq_lens=[37820]'; 'bench.blocks=[1]' keeps only the single-block rows, the
# quick form of the block step); H3_APPEND=1 starts the block JSON from
# benchmarks/results/block-h200.json (to add a plan to committed results). $OUT comes back with at most
# 8 files: this script writes 7. The PNG needs matplotlib; without it, draw it afterwards on any machine:
#   python benchmarks/plot.py benchmarks/results/block-h200.json --md
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:?OUT must name the folder that comes back from the device call}
mkdir -p "$OUT"
START=$(date +%s)
BUDGET=${H3_BUDGET_S:-540}
RESERVE=15                                   # seconds kept for the summary
LOG="$OUT/run.log"
SUMMARY=()
IFS=';' read -r -a PLANS <<< "${H3_BLOCK_PLANS:-recipe=bf16;recipe=fp8}"

left() { echo $(( BUDGET - RESERVE - ($(date +%s) - START) )); }

# step NAME SKIPVAR CAP LOGFILE command...: run under timeout, tee to LOGFILE, record the outcome.
step() {
  local name=$1 skip=$2 cap=$3 log=$4
  shift 4
  if [ "${!skip:-0}" = 1 ]; then SUMMARY+=("$name: skipped ($skip=1)"); return 0; fi
  local t
  t=$(left)
  (( t > cap )) && t=$cap
  if (( t < 20 )); then SUMMARY+=("$name: skipped (budget of ${BUDGET}s spent)"); return 0; fi
  local cmd="$*"
  cmd=${cmd//$'\n'/ }
  echo "=== $name (timeout ${t}s): ${cmd:0:200}" | tee -a "$LOG"
  local s rc
  s=$(date +%s)
  timeout --kill-after=10 "$t" "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  local what="exit $rc"
  (( rc == 124 || rc == 137 )) && what="TIMED OUT (cap ${t}s)"
  SUMMARY+=("$name: $what after $(( $(date +%s) - s ))s")
}

ENV_PY='
import importlib, platform, subprocess
import torch
print("python", platform.python_version(), "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| cuDNN (torch)", torch.backends.cudnn.version())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"GPU {p.name}, SM{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB")
else:
    print("GPU: none visible to torch")
for mod in ("triton", "cudnn", "flash_attn.cute", "diffusers", "hydra", "omegaconf", "matplotlib", "tqdm"):
    try:
        m = importlib.import_module(mod)
        extra = f" (cuDNN backend {m.backend_version()})" if mod == "cudnn" else ""
        ver = getattr(m, "__version__", "?")
        print(f"{mod}: import ok, {ver}{extra}")
    except Exception as e:
        print(f"{mod}: import FAILED: {type(e).__name__}: {str(e)[:200]}")
try:
    q = "name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,memory.used"
    print(subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv"], capture_output=True, text=True,
                         timeout=20).stdout)
except Exception as e:
    print("nvidia-smi:", e)
'

step env H3_SKIP_ENV 60 "$LOG" python -c "$ENV_PY"

step suite H3_SKIP_SUITE "${H3_T_SUITE:-150}" "$OUT/gpu-suite.log" \
  python -m pytest tests/gpu -m gpu -q -rA -p no:cacheprovider

if [ -f benchmarks/fused_kernels.py ]; then
  step kernels H3_SKIP_KERNELS "${H3_T_KERNELS:-100}" "$LOG" python benchmarks/fused_kernels.py --out "$OUT"
else
  SUMMARY+=("kernels: skipped (benchmarks/fused_kernels.py is not in this tree)")
fi

if [ "${H3_APPEND:-0}" = 1 ] && [ -f benchmarks/results/block-h200.json ]; then
  cp benchmarks/results/block-h200.json "$OUT/block-h200.json"
fi
for p in "${PLANS[@]}"; do
  # shellcheck disable=SC2086  # H3_BENCH_ARGS and the plan overrides are word lists
  step "block[$p]" H3_SKIP_BLOCK "${H3_T_BLOCK:-150}" "$LOG" \
    python -m h3plan action=bench hardware=sm90 parallel=u1 $p bench.tag=h200 "bench.out_dir=$OUT" ${H3_BENCH_ARGS:-}
done

rm -f "$OUT"/*.tmp
{
  echo
  echo "=== summary ($(( $(date +%s) - START ))s of ${BUDGET}s)"
  printf '  %s\n' "${SUMMARY[@]}"
  [ -f "$OUT/gpu-suite.log" ] && echo "  suite: $(tail -n 1 "$OUT/gpu-suite.log")"
  if [ -f "$OUT/block-h200.md" ]; then
    sed -n '/^## Targets/,/^## Runs/p' "$OUT/block-h200.md" | grep '^- '
  fi
  [ -f "$OUT/block-h200.png" ] || echo "  no block-h200.png: draw it with python benchmarks/plot.py <block-h200.json> --md"
  n=$(find "$OUT" -mindepth 1 | wc -l)
  echo "  \$OUT holds $n entries (the call returns at most 8 files):"
  find "$OUT" -mindepth 1 -printf '    %P %s bytes\n' | sort
  (( n > 8 )) && echo "  WARNING: more than 8 entries in \$OUT: some will not come back"
} | tee -a "$LOG"
exit 0
