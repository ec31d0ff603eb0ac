#!/usr/bin/env bash
# The MiniMax-H3 pipeline end to end on one H200: diffusers eager, diffusers' best setting (regional compile)
# and the h3plan plan, for the bf16 and the fp8 recipe, in ONE device call from the repository root, after the
# GPU wheels are installed (shared/gpu/README.md; diffusers' modular pipeline also needs transformers, which
# the H200 image has):
#
#   . /tmp/h3site/env.sh && export PYTHONPATH=$PWD:$PYTHONPATH && bash benchmarks/pipeline_h200.sh
#
# Request: 768x1344 pixels, 124 frames (the pipeline's own default canvas and frame count), 110 text rows:
# 110 + 2 x 207 audio rows + 37 latent frames x 24 x 42 patches = 37,820 tokens; the whole 50-layer
# transformer at real width, seeded random weights. Per setting: two interleaved calls of diffusers' denoise
# step (eager, plan, best / best, plan, eager), each 1 untimed warm-up step + 1 timed step, so 2 timed
# steps per setting; the video decode once after one untimed decode (eager and plan; best decodes as eager);
# the audio decode once; the lossless bf16 plan's frames also against diffusers eager with its FA4 backend
# (2 more steps and a decode). End to end = 49 steps (num_inference_steps 50) + decode, estimated.
# Expected per recipe (docs/sources.md#h200-anchors: a step 6.4 s eager, 5.9 s compiled, 5.3 s plan; decode ~7 s at 37
# latent frames): model build ~1 min, regional compile ~1-2 min, the steps ~1.5 min, decodes ~0.5 min:
# 4-6 minutes; each recipe is capped at H3_T_RECIPE seconds (default 480). A device call allows 600 s, so
# run one recipe per call, the second appending to the first one's committed results:
#
#   H3_RECIPES=bf16 bash benchmarks/pipeline_h200.sh                # copy $OUT/pipeline-h200.* to benchmarks/results/
#   H3_RECIPES=fp8 H3_APPEND=1 bash benchmarks/pipeline_h200.sh     # starts from benchmarks/results/pipeline-h200.json
#
# Output in $OUT (default benchmarks/results): pipeline-h200.json (every recipe's records), .md, .png, and
# pipeline-h200.log. H3_PIPELINE_ARGS adds arguments to every run (e.g. '--layers 4' for a quick check);
# H3_RECIPES picks the recipes (default 'bf16 fp8', both in one call: only where the call allows ~10 minutes).
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
LOG="$OUT/pipeline-h200.log"
CAP=${H3_T_RECIPE:-480}
if [ "${H3_APPEND:-0}" = 1 ] && [ -f benchmarks/results/pipeline-h200.json ] && \
   [ ! "$OUT/pipeline-h200.json" -ef benchmarks/results/pipeline-h200.json ]; then
  cp benchmarks/results/pipeline-h200.json "$OUT/pipeline-h200.json"
fi
STATUS=()
for recipe in ${H3_RECIPES:-bf16 fp8}; do
  echo "=== recipe=$recipe (timeout ${CAP}s)" | tee -a "$LOG"
  s=$(date +%s)
  # shellcheck disable=SC2086  # H3_PIPELINE_ARGS is a word list
  timeout --kill-after=15 "$CAP" python benchmarks/pipeline.py hardware=sm90 parallel=u1 "recipe=$recipe" \
    --video 768x1344x124 --text-tokens 110 --rounds 2 --warmup 2 --steps 1 --decode-warmup 1 \
    --out "$OUT" --tag h200 ${H3_PIPELINE_ARGS:-} 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  what="exit $rc"
  (( rc == 124 || rc == 137 )) && what="TIMED OUT (cap ${CAP}s)"
  STATUS+=("recipe=$recipe: $what after $(( $(date +%s) - s ))s")
done
rm -f "$OUT"/*.tmp
{
  echo "=== summary"
  printf '  %s\n' "${STATUS[@]}"
  ls -l "$OUT"/pipeline-h200.* 2>/dev/null
} | tee -a "$LOG"
exit 0
