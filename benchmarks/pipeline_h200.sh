#!/usr/bin/env bash
# The call users make, on one H200: diffusers' own `pipe(prompt_embeds=..., height=768, width=1344, num_frames=124,
# num_inference_steps=N, output_type="pt", output="videos")`, no autocast, the VAE in its own dtype, for diffusers
# eager, diffusers' best (compile_repeated_blocks(fullgraph=True)) and h3plan plans (h3plan/actions/bench/pipeline.py),
# from the repository root after the GPU wheels are installed (shared/gpu/README.md):
#
#   . /tmp/h3site/env.sh && export PYTHONPATH=$PWD:$PYTHONPATH && H3_PHASE=fp32 bash benchmarks/pipeline_h200.sh
#
# Request: 768x1344 px, 124 frames, 110 text rows = 37,820 tokens; all 50 layers at real width, seeded weights.
# Each row: one untimed decode of a short latent with the request's tile and clip shapes (cuBLAS, allocator, CUDA
# graphs warm), then one call with 2 untimed + 1 timed forwards; E2E = 49 x forward + the rest of the call.
# A device call allows 600 s, so the rows come in two phases, each one run (one process), appending to one file:
#   H3_PHASE=fp32: diffusers' default VAE: eager, best, the bf16 plan (fp32 decode) and its bitwise reference
#                  (eager with the plan's FA4) - about 7 minutes;
#   H3_PHASE=fp16: eager and best with the fp32 VAE again (the same-run anchor) and with the VAE in fp16, the
#                  bf16 plan with the recipe's fp16 decode (recipe.vae=fp16) and its reference, the fp8 plan (its
#                  decode is fp16 + FP8 VAE GEMMs) - about 8 minutes;
#   H3_PHASE=stock: eager, the bf16 plan (FA4; its frames against stock diffusers', no reference row) and the
#                  stock-bits plan (levers.attention=sdpa, bench.pipeline.stock_bits: bitwise against eager) with
#                  diffusers' fp32 VAE - about 4 minutes;
#   H3_PHASE=all:  every row of both but the references (eager and best at fp32 and fp16, the bf16 plan with each
#                  decode, the fp8 plan) - about 8 minutes.
#   H3_PHASE=cache-bf16 / cache-fp8: eager and best with the fp32 VAE (2 untimed + 1 timed forwards as
#                  above), then the plan with levers.step_cache=fixed computing 34 of 49 forwards (bf16 + the fp16
#                  VAE, or fp8): one untimed 2-forward call, then the whole 50-step call timed end to end; its notes
#                  carry the overhead check (E2E <= 1.03 x (34 forwards + rest)) - about 8.5 and 8 minutes (estimate
#                  from the rows above: build ~1, eager ~1.3, best ~2.3, cached call 3.1 / 2.4 + install and warm call
#                  ~0.7). H3_PHASE=cache runs both cached rows in one process (about 11 minutes: over one device call).
#   H3_PHASE=cache-high: eager and best with the fp32 VAE as above, then the fp8 plan with the fp16 decode and
#                  recipe.cache.policy=high (SGLang's quality=high: first_block on the first block's residual, warm-up 4,
#                  threshold 0.04, 1 in a row; docs/step_cache.md), the whole call timed: how many forwards the
#                  threshold computes on seeded weights is a count, not a quality claim; the call must fall inside the
#                  plan's range (26..49 forwards computed) - about 7-8.5 minutes (build ~1, eager ~1.3, best ~2.3,
#                  install and warm call ~0.7, the call 26..49 x 4.07 s).
#   H3_PHASE=cache-adaptive: eager and best as above, then the fp8 plan with levers.step_cache=first_block
#                  at threshold 0.08 (Sol-Engine's FirstBlockCache setting), the whole call timed: the row reports how
#                  many forwards the threshold computed on seeded weights (a count, not a quality claim) and its
#                  overhead against computed forwards + rest (reported: every skipped forward runs the first block) -
#                  about 401 s on the H200 (20 of 49 forwards computed).
# Every workflow with the prompt through the text encoder (--prompt: pipe(prompt="...") through diffusers'
# text encoder step and the seeded Qwen3-VL at the packaged Qwen3-VL-32B widths, built on the device in seconds and
# placed where the plan's memory.text_encoder puts it for every row; the encode and its moves are in each row's rest,
# E2E and peak). A whole workflow fits one call (ref2va / fl2va, further down); the split phases below are for a
# call with less time:
#   H3_PHASE=ref2va-best: ref2va (video=ref2va_768x1344_5s, one seeded image reference, the transformer_ref
#                  partition, 49 forwards), memory.text_encoder=offload_after (the plan's fit on 141 GB: resident
#                  needs 65.4 GiB beside the denoise peak, 64.5 free): eager, best, the bf16 plan, fp32 VAE - about
#                  7.5 minutes;
#   H3_PHASE=ref2va-bits: the same request: eager, the bf16 plan and its bitwise reference (eager with the plan's
#                  FA4), fp32 VAE - about 6.5 minutes;
#   H3_PHASE=fl2va-best / fl2va-bits: fl2va at 768x1344x124 and 49 forwards (the t2va preset with
#                  video.task=fl2va and the first and last keyframe, seeded), the same rows as ref2va's two phases -
#                  about 7 and 6 minutes;
#   H3_PHASE=ref2va / fl2va: the four rows of both phases above in one process (eager, best, the bf16 plan and its
#                  bitwise reference): about 453 s and 356 s on the H200. The bench runs each reference before its
#                  plan and notes what an earlier row left on the device (after its plan, fl2va's reference row ran
#                  out of memory at the text encode, 1.2 GiB over the eager row's 137.0 GiB peak). fl2va's plan takes
#                  the text rows the seeded conditioner packs for the 110-byte prompt and the two keyframes' vision
#                  blocks (2,026: the measured 41,752 rows less the video, audio and keyframe rows).
#   H3_PHASE=turbo: the Turbo FL2VA request (video=fl2va_turbo_768x1344: 1344x768 height x width, 124 frames: 107
#                  is under the pipeline's 5 s; 4 denoiser evaluations, --e2e-steps 4): eager and best with diffusers'
#                  default fp32 VAE, the bf16 plan with recipe.vae=fp16 (target: E2E >= 1.5x best; no fp16 eager row,
#                  so its frames are not compared here) - about 6 minutes;
#   H3_PHASE=cap-t2va / cap-ref2va: not this bench: benchmarks/memory.py's 80 GB cap row (bf16, tables on,
#                  memory.text_encoder=host: the plan fits 80 GB) in a fresh process, the pipeline resting on the host,
#                  install(pipe, plan, device="cuda") under torch.cuda.set_per_process_memory_fraction, then the whole
#                  pipe(prompt=...) with the conditioner streamed from the host a part at a time (3 steps); rows in
#                  $OUT/memory-h200-cap-<workflow>.json / .md - about 4 and 5 minutes. The whole pipeline resting
#                  on the host (the 62 GiB conditioner + the 62 GiB transformer + the 9.7 GiB VAE) is more than the
#                  one-GPU H200 machine's 128 GiB of host memory, so the seeded conditioner's 64 decoder layers share
#                  16 layers' weights (--text-encoder-weight-sets 16, recorded in the rows; diffusers refuses fewer
#                  than 51 layers): at memory.text_encoder=host the device holds one layer at a time at the real width
#                  either way, so the sharing changes the host's memory, not the device's peak the cap tests. On a
#                  host of 256 GiB (the two-GPU kind): H3_TE_SETS=64, every layer its own weights.
#   H3_PHASE=lora: not this bench: benchmarks/lora.py, a seeded LoRA of the published Turbo shape (rank 128
#                  on every block's attention and FFN) on 8 real-width layers at 512x896x124, diffusers' denoise step
#                  with 1 + 3 forwards per row: the bf16 plan without / with the LoRA loaded after install (load and
#                  set_adapters timed), its bitwise reference, diffusers eager with the LoRA; the fp8 plan without it
#                  (the LoRA's one-line refusal recorded), with it fused the way the refusal names (timed), diffusers
#                  on the fused weights; $OUT/lora-h200.json / .md - about 3 minutes (estimate: build, FA4 and cuDNN
#                  JIT, 7 calls of 4 forwards).
# Whole calls at the same output precision: each row below times a short call (2 untimed + 3 timed
# forwards) and then one real 49-forward call end to end, every forward between CUDA events; E2E is the whole call and
# the row records its extrapolation check (49 x the short call's median forward + its rest within 1% of the whole call:
# PASS or FAIL). Three rows do not fit one device call (a 49-forward call of diffusers' compile takes about 300 s, the
# fp8 plan's 205 s), so each is its own phase, run back to back: the machine keeps /tmp between calls, where each phase
# leaves its frames (H3_FRAMES, default /tmp/h3plan-frames, with the seeded weights' fingerprint) and the results file
# so far (H3_KEEP, default /tmp/h3plan-bench), which the next phase starts from. The seeded
# 33.1B-parameter transformer is 123 GiB in float32: on a card with less free memory (an H100 80GB) it is built in bf16
# directly, with the same values (docs/measurements.md); on an H100 80GB the whole calls of whole-best, whole-tier,
# whole-tier-fixed and whole-cache-fp8 fit (benchmarks/results/pipeline-h100.md); whole-lossless ran out of memory
# in the build's allocator holes (fixed since, not yet rerun).
# The phases:
#   H3_PHASE=whole-best: diffusers' regional compile with its VAE cast to fp16 (as from_pretrained(torch_dtype=
#                  torch.float16) casts it), t2va 768x1344x124, 49 forwards, alone - about 6.5 minutes;
#   H3_PHASE=whole-fp8: the fp8 plan (its fp16 decode, sm90/fp8/u1 +vae=fp16) alone: its ratio against whole-best's
#                  compile (best_run names that run) and its frames against that compile's and, where whole-lossless ran
#                  before, the lossless plan's - about 4.5 minutes;
#   H3_PHASE=whole-lossless: the bf16 plan with diffusers' fp32 VAE alone, whose frames the lossy plans' are held
#                  against (run it first) - about 7 minutes;
#   H3_PHASE=whole-bf16: the bf16 plan with its fp16 decode (sm90/bf16/u1 +vae=fp16) alone: the lossless transformer
#                  at whole-best's output precision, its ratio against that compile - about 6 minutes;
#   H3_PHASE=whole-best-fl2va / whole-best-ref2va and whole-bf16-fl2va / whole-bf16-ref2va: the same two rows for the
#                  other workflows (their requests as the fl2va / ref2va phases', the prompt through the seeded
#                  conditioner): each alone, the compile first - about 6.5 minutes each;
#   H3_PHASE=whole-tier: the quality tier (tier=quality: fp8 GEMMs, BF16 FA4 attention, the fp16 decode, the step
#                  cache's high policy, block-sparse attention at keep 0.25 after 10 dense forwards) alone, t2va
#                  768x1344x124, 49 forwards: its ratio against whole-best's compile (target 2.7x) and its frames
#                  against that compile's and the lossless plan's (seeded weights) - about 4 minutes;
#   H3_PHASE=whole-tier-fixed: the tier with the step cache's high policy replaced by the fixed schedule of the cache
#                  rows (34 of 49 forwards computed, the rest reuse the last velocity), alone, t2va 768x1344x124: the
#                  tier's call at a skip count fixed in advance, where the adaptive policy's count is the checkpoint's
#                  (seeded weights skip 3; SGLang's 1.40x for the high policy on released weights comes to about 35
#                  computed, 49 / 1.40), its ratio against whole-best's compile and the plan's call declared before it
#                  (benchmarks/results/predict-declared-h200.md) - about 4 minutes;
#   H3_PHASE=whole-adaptive: cache-adaptive's first_block plan (threshold 0.08) with its fp16 decode alone, the whole call
#                  with every forward's time, computed and skipped, and the overhead check per kind of forward; its ratio
#                  against whole-best's compile - about 4 minutes;
#   H3_PHASE=whole-cache-fp8 / whole-cache-bf16: the fixed step-cache rows (34 of 49 forwards computed, as cache-fp8 /
#                  cache-bf16) with the fp16 decode alone: the whole call, its ratio against whole-best's compile and its
#                  frames against the lossless plan's where whole-lossless ran before - about 3.5 / 4.5 minutes;
#   H3_PHASE=whole-tier-fl2va / whole-tier-ref2va: the tier on the other workflows' requests (as whole-bf16-fl2va's /
#                  -ref2va's; ref2va's reference rows stay dense), its ratio against that workflow's whole-best compile
#                  of an earlier run - about 4 / 5 minutes, and the conditioner initialised on the host first;
#   H3_PHASE=whole-best-10s / whole-tier-10s: whole-best's compile and whole-tier's tier at the 10 s request
#                  (video=t2v_768x1344_10s, 768x1344x243, 73,496 tokens), each alone: over one device call (the
#                  compile's 49 forwards alone take about 15 minutes), so run each with H3_DETACH=1 and collect calls;
#                  the tier's ratio is against the compile of an earlier run of the same request (best_run);
#   H3_PHASE=turbo-fp16: the Turbo FL2VA request (4 forwards, the prompt through the seeded conditioner) with diffusers'
#                  compile at the fp16 VAE and the bf16 plan with recipe.vae=fp16, both whole calls - about 4.5 minutes.
# H3_PHASE=forward-points (not this bench): the installed 50-layer forward profiled at 19,000 and 46,020 tokens (bf16
# and fp8), the rates inside the forward at token counts other than the t2va request's
# (benchmarks/probes/block_profile.py --forward 50): $OUT/block-profile-forward.json - about 4 minutes.
# Output in $OUT (default benchmarks/results): pipeline-h200.json (rows of every run), .md, .png, pipeline-h200.log.
# H3_APPEND=1 starts from the committed benchmarks/results/pipeline-h200.json.
# python benchmarks/merge_run.py DIR merges what the collect calls brought back into pipeline-<card>.json of the card
# each run ran on. Once a run's rows are in a committed pipeline-<card>.json: python benchmarks/record_digests.py
# appends their digests (tests/docs/test_records_append_only.py fails on a row without one, and on a committed row
# changed since).
# H3_PHASE=a,b,...: the phases one after another in one process tree, the first as above, the rest going on from its
# results file: phases that must share the machine's /tmp (whole-lossless before the lossy whole-* phases) in one
# device call, not several that the machine's idle release can split. H3_T_PHASE caps each phase: their sum must fit
# the device call.
# Longer than one device call (phases whose sum is over 600 s, a 10 s request's whole call): H3_DETACH=1 starts the
# phases in a process session of their own (setsid: it runs on between device calls while the machine is held),
# writing to H3_DETACHED (default /tmp/h3plan-detached: $OUT is emptied before each call), and returns at once; then
# back-to-back calls of H3_PHASE=collect (each waits up to H3_T_PHASE s for the run to end) copy what it has written so
# far into $OUT. A collect call must follow the previous call within the machine's 30 s idle window.
set -u
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/.."
DETACHED=${H3_DETACHED:-/tmp/h3plan-detached}
if [ "${H3_DETACH:-0}" = 1 ]; then
  rm -rf "$DETACHED" && mkdir -p "$DETACHED"
  [ -n "${OUT:-}" ] && [ -f "$OUT/pipeline-h200.json" ] && cp "$OUT/pipeline-h200.json" "$DETACHED/"
  H3_DETACH=0 OUT=$DETACHED setsid nohup bash -c "bash '$SELF'; touch '$DETACHED/done'" > "$DETACHED/detached.log" \
    2>&1 < /dev/null &
  echo "detached: phases ${H3_PHASE:-fp32} (pid $!), writing to $DETACHED; collect with H3_PHASE=collect"
  exit 0
fi
if [ "${H3_PHASE:-}" = collect ]; then
  cap=${H3_T_PHASE:-560} s=$(date +%s)
  [ -d "$DETACHED" ] || { echo "collect: nothing detached in $DETACHED" >&2; exit 2; }
  while [ ! -f "$DETACHED/done" ] && [ $(( $(date +%s) - s )) -lt "$cap" ]; do sleep 5; done
  mkdir -p "${OUT:-benchmarks/results}"
  find "$DETACHED" -maxdepth 1 -type f ! -name done -exec cp {} "${OUT:-benchmarks/results}/" \;
  tail -5 "$DETACHED/detached.log"
  if [ -f "$DETACHED/done" ]; then echo "collect: the detached run ended"; else echo "collect: still running"; fi
  exit 0
fi
if [[ "${H3_PHASE:-}" == *,* ]]; then
  IFS=, read -ra phases <<< "$H3_PHASE"
  first=1
  for phase in "${phases[@]}"; do
    if [ "$first" = 1 ]; then H3_PHASE=$phase bash "$SELF" || exit $?
    else H3_PHASE=$phase H3_APPEND=0 bash "$SELF" || exit $?; fi
    first=0
  done
  exit 0
fi
export PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
LOG="$OUT/pipeline-h200.log"
CAP=${H3_T_PHASE:-570}
KEEP=${H3_KEEP:-/tmp/h3plan-bench}
FRAMES=${H3_FRAMES:-/tmp/h3plan-frames}
if [ "${H3_APPEND:-0}" = 1 ] && [ -f benchmarks/results/pipeline-h200.json ] && \
   [ ! "$OUT/pipeline-h200.json" -ef benchmarks/results/pipeline-h200.json ]; then
  cp benchmarks/results/pipeline-h200.json "$OUT/pipeline-h200.json"
fi
case "${H3_PHASE:-fp32}" in  # a whole-call phase goes on from the results an earlier one left in $KEEP
  whole-*|turbo-fp16)
    if [ -f "$KEEP/pipeline-h200.json" ] && [ ! "$OUT/pipeline-h200.json" -ef "$KEEP/pipeline-h200.json" ]; then
      cp "$KEEP/pipeline-h200.json" "$OUT/pipeline-h200.json"
    fi ;;
esac
[ -f "$OUT/pipeline-h200-corrections.json" ] || cp benchmarks/results/pipeline-h200-corrections.json "$OUT/"
vid=768x1344x124  # HEIGHTxWIDTHxFRAMES of the call (the turbo phase's request is portrait)
ref2va_call=(video=ref2va_768x1344_5s memory.text_encoder=offload_after --workflow ref2va --prompt)
fl2va_call=(video=t2v_768x1344_5s video.task=fl2va 'video.keyframes=[first,last]' video.text_tokens=2026
            memory.text_encoder=offload_after --workflow fl2va --prompt)
ref2va=("${ref2va_call[@]}" --vae fp32)
fl2va=("${fl2va_call[@]}" --vae fp32)
script=benchmarks/pipeline.py
# no evidence covers these schedules (docs/step_cache.md): they run as measured, recipe.cache.unmeasured=true
cache='recipe.cache={psnr_db_min:28,ssim_min:0.93,computed:34,unmeasured:true}'  # 34 of 49, as TeleFuser's
# the tier with cache's fixed schedule in place of its high policy (policy:null drops the tier's first_block policy)
tier_fixed='recipe.cache={policy:null,psnr_db_min:28,ssim_min:0.93,computed:34,unmeasured:true}'
adaptive='recipe.cache={psnr_db_min:28,ssim_min:0.93,threshold:0.08,warmup:4,final:1,max_skip:2,unmeasured:true}'
case "${H3_PHASE:-fp32}" in
  fp32) args=(hardware=sm90 parallel=u1 recipe=bf16 --vae fp32) ;;
  fp16) args=(hardware=sm90 parallel=u1 recipe=bf16 recipe.vae=fp16 --vae fp32,fp16 --plan "recipe=fp8") ;;
  stock) args=(hardware=sm90 parallel=u1 recipe=bf16 --vae fp32 --no-best --no-reference --stock-bits) ;;
  all) args=(hardware=sm90 parallel=u1 recipe=bf16 --vae fp32,fp16 --plan "recipe=bf16 recipe.vae=fp16"
             --plan "recipe=fp8" --no-reference) ;;
  cache-bf16) args=(hardware=sm90 parallel=u1 recipe=bf16 recipe.vae=fp16 "$cache" levers.step_cache=fixed --vae fp32
                   --no-reference) ;;
  cache-fp8) args=(hardware=sm90 parallel=u1 recipe=fp8 "$cache" levers.step_cache=fixed --vae fp32 --no-reference) ;;
  cache-high) args=(hardware=sm90 parallel=u1 recipe=fp8 recipe.vae=fp16 recipe.cache.policy=high
                   levers.step_cache=first_block --vae fp32 --no-reference) ;;
  cache-adaptive) args=(hardware=sm90 parallel=u1 recipe=fp8 "$adaptive" levers.step_cache=first_block --vae fp32
                       --no-reference) ;;
  cache) args=(hardware=sm90 parallel=u1 recipe=bf16 recipe.vae=fp16 "$cache" levers.step_cache=fixed --vae fp32
               --plan "recipe=fp8 $cache levers.step_cache=fixed" --no-reference) ;;
  ref2va-best) args=(hardware=sm90 parallel=u1 recipe=bf16 "${ref2va[@]}" --no-reference) ;;
  ref2va-bits) args=(hardware=sm90 parallel=u1 recipe=bf16 "${ref2va[@]}" --no-best) ;;
  fl2va-best) args=(hardware=sm90 parallel=u1 recipe=bf16 "${fl2va[@]}" --no-reference) ;;
  fl2va-bits) args=(hardware=sm90 parallel=u1 recipe=bf16 "${fl2va[@]}" --no-best) ;;
  ref2va) args=(hardware=sm90 parallel=u1 recipe=bf16 "${ref2va[@]}") ;;
  fl2va) args=(hardware=sm90 parallel=u1 recipe=bf16 "${fl2va[@]}") ;;
  turbo) vid=1344x768x124
         args=(hardware=sm90 parallel=u1 recipe=bf16 recipe.vae=fp16 video=fl2va_turbo_768x1344
               memory.text_encoder=offload_after --workflow fl2va --prompt --vae fp32 --e2e-steps 4 --no-reference) ;;
  whole-best) args=(hardware=sm90 parallel=u1 recipe=bf16 --vae fp16 --no-eager --no-plan --whole) ;;
  whole-fp8) args=(hardware=sm90 parallel=u1 recipe=fp8 --vae fp16 --no-eager --no-best --whole) ;;
  whole-lossless) args=(hardware=sm90 parallel=u1 recipe=bf16 --vae fp32 --no-eager --no-best --no-reference --whole) ;;
  whole-bf16) args=(hardware=sm90 parallel=u1 recipe=bf16 recipe.vae=fp16 --vae fp16 --no-eager --no-best --no-reference
                    --whole) ;;
  whole-best-fl2va|whole-best-ref2va) w=${H3_PHASE#whole-best-}; [ "$w" = fl2va ] && req=("${fl2va_call[@]}") \
         || req=("${ref2va_call[@]}")
         args=(hardware=sm90 parallel=u1 recipe=bf16 "${req[@]}" --vae fp16 --no-eager --no-plan --whole) ;;
  whole-bf16-fl2va|whole-bf16-ref2va) w=${H3_PHASE#whole-bf16-}; [ "$w" = fl2va ] && req=("${fl2va_call[@]}") \
         || req=("${ref2va_call[@]}")
         args=(hardware=sm90 parallel=u1 recipe=bf16 recipe.vae=fp16 "${req[@]}" --vae fp16 --no-eager --no-best
               --no-reference --whole) ;;
  whole-tier) args=(hardware=sm90 parallel=u1 tier=quality --vae fp16 --no-eager --no-best --whole) ;;
  whole-tier-fixed) args=(hardware=sm90 parallel=u1 tier=quality "$tier_fixed" levers.step_cache=fixed --vae fp16
                        --no-eager --no-best --whole) ;;
  whole-tier-fl2va|whole-tier-ref2va) w=${H3_PHASE#whole-tier-}; [ "$w" = fl2va ] && req=("${fl2va_call[@]}") \
         || req=("${ref2va_call[@]}")
         # the conditioner resident, where the tier's plan fits it (memory.text_encoder=auto picks it). The bench
         # builds a bf16 transformer the fp8 install quantises: at offload_after the conditioner's 62 GiB on the host
         # beside the bf16 block linears and AdaLN linears the install parks there exceed a 128 GiB host; resident,
         # the bf16 transformer and the whole conditioner on the device (134.1 GiB, the plan's "moved to the GPU
         # whole" figure with recipe.checkpoint=bf16) ran out of device memory in setup (12-05 04:04). So its 64
         # decoder layers share 16 layers' weights: every layer still computes at its width, resident, as planned
         h3_te_sets=(--text-encoder-weight-sets 16)
         req=("${req[@]/memory.text_encoder=offload_after/memory.text_encoder=resident}")
         args=(hardware=sm90 parallel=u1 tier=quality "${req[@]}" "${h3_te_sets[@]}" --vae fp16 --no-eager --no-best
               --no-reference --whole) ;;
  whole-best-10s) vid=768x1344x243
         args=(hardware=sm90 parallel=u1 recipe=bf16 video=t2v_768x1344_10s --vae fp16 --no-eager --no-plan --whole) ;;
  whole-tier-10s) vid=768x1344x243
         args=(hardware=sm90 parallel=u1 tier=quality video=t2v_768x1344_10s --vae fp16 --no-eager --no-best --whole) ;;
  whole-cache-fp8) args=(hardware=sm90 parallel=u1 recipe=fp8 recipe.vae=fp16 "$cache" levers.step_cache=fixed --vae fp16
                        --no-eager --no-best --no-reference --whole) ;;
  whole-cache-bf16) args=(hardware=sm90 parallel=u1 recipe=bf16 recipe.vae=fp16 "$cache" levers.step_cache=fixed
                         --vae fp16 --no-eager --no-best --no-reference --whole) ;;
  whole-adaptive) args=(hardware=sm90 parallel=u1 recipe=fp8 recipe.vae=fp16 "$adaptive" levers.step_cache=first_block
                       --vae fp16 --no-eager --no-best --no-reference --whole) ;;
  turbo-fp16) vid=1344x768x124
         args=(hardware=sm90 parallel=u1 recipe=bf16 recipe.vae=fp16 video=fl2va_turbo_768x1344
               memory.text_encoder=offload_after --workflow fl2va --prompt --vae fp16 --e2e-steps 4 --no-eager
               --no-reference --whole) ;;
  forward-points) script=benchmarks/probes/block_profile.py
         args=(--forward 50 --out "$OUT" bf16:19000 bf16:46020 fp8:19000 fp8:46020) ;;
  cap-t2va|cap-ref2va) script=benchmarks/memory.py
         args=(--recipes bf16 --cap-only --workflow "${H3_PHASE#cap-}" --text-encoder host --steps 3 --no-warmup
               --text-encoder-weight-sets "${H3_TE_SETS:-16}") ;;
  lora) script=benchmarks/lora.py vid=512x896x124
        args=(hardware=sm90 parallel=u1 --layers 8 --steps 3) ;;
  *) echo "H3_PHASE: fp32, fp16, stock, all, cache-bf16, cache-fp8, cache-high, cache-adaptive, cache, ref2va-best," \
          "ref2va-bits, fl2va-best, fl2va-bits, ref2va, fl2va, turbo, whole-best, whole-fp8, whole-lossless, whole-bf16,"\
          "whole-best-fl2va, whole-best-ref2va, whole-bf16-fl2va, whole-bf16-ref2va, whole-tier, whole-tier-fixed," \
          "whole-adaptive," \
          "whole-cache-fp8, whole-cache-bf16, whole-tier-fl2va, whole-tier-ref2va, whole-best-10s, whole-tier-10s," \
          "turbo-fp16, forward-points, cap-t2va, cap-ref2va or lora" >&2; exit 2 ;;
esac
if [ "$script" = benchmarks/memory.py ]; then
  common=(--video "$vid" --text-tokens 110 --out "$OUT" --tag "h200-${H3_PHASE}")
elif [ "$script" = benchmarks/lora.py ]; then
  common=(--video "$vid" --text-tokens 110 --out "$OUT" --tag h200)
elif [ "$script" = benchmarks/probes/block_profile.py ]; then
  common=()
else
  steps=1
  case "${H3_PHASE:-fp32}" in whole-*|turbo-fp16) steps=3; args+=(--frames-dir "$FRAMES") ;; esac  # a median of 3
  common=(--video "$vid" --text-tokens 110 --rounds 1 --warmup 2 --steps "$steps" --decode-warmup 1 --out "$OUT"
          --tag h200)
fi
if [ "${H3_DRY:-0}" = 1 ]; then  # H3_DRY=1: print what each phase would run (a check of the phase list, any machine)
  echo "phase ${H3_PHASE:-fp32}: python $script ${args[*]} ${common[*]}"
  exit 0
fi
echo "=== phase ${H3_PHASE:-fp32} (timeout ${CAP}s)" | tee -a "$LOG"
s=$(date +%s)
# shellcheck disable=SC2086  # H3_PIPELINE_ARGS is a word list
timeout --kill-after=15 "$CAP" python "$script" "${args[@]}" "${common[@]}" ${H3_PIPELINE_ARGS:-} 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
rm -f "$OUT"/*.tmp
case "${H3_PHASE:-fp32}" in
  whole-*|turbo-fp16) mkdir -p "$KEEP" && [ -f "$OUT/pipeline-h200.json" ] && cp "$OUT/pipeline-h200.json" "$KEEP/" ;;
esac
echo "=== phase ${H3_PHASE:-fp32}: exit $rc after $(( $(date +%s) - s ))s" | tee -a "$LOG"
ls -l "$OUT"/pipeline-h200.* "$OUT"/memory-h200-cap-* "$OUT"/lora-h200.* "$OUT"/block-profile-forward.json \
  2>/dev/null | tee -a "$LOG"
ls -l "$OUT"/pipeline-h200.* "$OUT"/memory-h200-cap-* "$OUT"/block-profile-forward.json 2>/dev/null | tee -a "$LOG"
exit 0
