#!/usr/bin/env bash
# Measurements on the H200s of one host (nvidia-h200-x2 unless a phase says otherwise; GPU 0 serves the one-GPU
# runs), one device call per phase, from the repository root after the GPU wheels are installed (shared/gpu/README.md):
#
#   . /tmp/h3site/env.sh && export PYTHONPATH=$PWD:$PYTHONPATH && bash benchmarks/run_h200_x2.sh PHASE
#
#   parallel   NCCL: the installed transformer at degree 2 vs degree 1, bf16 and fp8 (every FP8 scale over the
#              whole sequence); compile safety on one GPU; h3plan's Ulysses plans vs diffusers' context
#              parallel (benchmarks/parallel.py); one VAE decode over two GPUs (benchmarks/probes/vae_parallel.py)
#   pipeline   the MiniMax-H3 pipeline end to end, bf16 and fp8 recipes (benchmarks/pipeline_h200.sh)
#   fp8        the producer-fused FP8 kernels and the lean q/k/v cast (GPU tests, probe); the VAE over two GPUs
#   u2pipe     the MiniMax-H3 pipeline end to end at Ulysses degree 2 (bf16, fp8), appended to the committed
#              pipeline-h200.json (records are keyed by GPUs, so the one-GPU rows stay)
#   profile    where the FP8 block's time goes (benchmarks/probes/block_profile.py), the parallel bench again with
#              per-category profiles and regional compile over every recipe's plan; the GPU tests of the
#              pipeline, ring and VAE over NCCL, calibrate at real width and the FA4 2-CTA message
#   measure    the block bench with diffusers' best (regional compile) as a peer row, bf16 and fp8, one block at
#              19,000 and 37,820; fp8_act_quant tensor vs row (probe + GPU test)
#   vae        the released-shape VAE decode (eager vs plan: time, bitwise, peak), the VAE over NCCL, the block
#              profiles again
#   vae2       fp8 plans at degree 2 with fp8_act_quant=row (NCCL) and under regional compile; the FP8 VAE at the
#              released latent (time, PSNR, peak); the VAE decode profile; the VAE over NCCL
#   recheck    vae2's two NCCL checks alone: the fp8 plans at degree 2 (no compile at degree > 1), the VAE over NCCL
#   overlap    where degree 2 loses against half of degree 1 (benchmarks/probes/ulysses_overlap.py: profiles,
#              exchange layouts, query-split attention with its output exchange overlapped), then the ring phase
#   scale      every installed-Ulysses NCCL case (bitwise vs degree 1), the parallel bench with the other exchange as
#              an arm, the bf16 pipeline at degree 2 (appended to the committed pipeline-h200.json)
#   split      ulysses_exchange=projection_split: its NCCL install cases and the parallel bench with every exchange
#   last       the parallel bench at 8 blocks (bf16, 37,820, every exchange), the install-time parking GPU test,
#              the fp8 pipeline on one GPU again (appended to the committed pipeline-h200.json)
#   post       the output exchange as send/recv plus a local copy: its NCCL cases and the bf16 bench, 10 rounds
#   ring       the installed ring plan (ring 2 x Ulysses 1) over NCCL against degree 1
#   many       the larger degrees on H3_NPROC GPUs (8 or 4): Ulysses and installed-Ulysses NCCL tests at that degree, the
#              installed ring 2 x Ulysses N/2, the scaling probe at 37,820 and 104,076, the parallel bench against
#              diffusers' context parallel with a ring 2 x Ulysses N/2 arm (one device call may not hold all of it:
#              the steps run in order under H3_BUDGET_S; rerun with the rest)
#   final      the pipeline again (two untimed steps per call: diffusers' first step has another temb shape, so
#              regional compile traces twice) and the GPU suite
#
# Every step runs under `timeout` inside H3_BUDGET_S (default 560 s); logs and results land in $OUT (at most 8
# files come back: each phase writes fewer).
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
OUT=${OUT:?OUT must name the folder that comes back from the device call}
mkdir -p "$OUT"
START=$(date +%s)
BUDGET=${H3_BUDGET_S:-560}
LOG="$OUT/$1.log"
left() { echo $(( BUDGET - 10 - ($(date +%s) - START) )); }
step() {  # step NAME CAP command...
  local name=$1 cap=$2; shift 2
  local t; t=$(left); (( t > cap )) && t=$cap
  if (( t < 20 )); then echo "=== $name: skipped (budget spent)" | tee -a "$LOG"; return; fi
  echo "=== $name (timeout ${t}s)" | tee -a "$LOG"
  local s; s=$(date +%s)
  timeout --kill-after=10 "$t" "$@" 2>&1 | tee -a "$LOG"
  echo "=== $name: exit ${PIPESTATUS[0]} after $(( $(date +%s) - s ))s" | tee -a "$LOG"
}
nccl_install() {  # nccl_install CAP K: the installed-Ulysses NCCL test on two GPUs, cases matching K ("" = all)
  local cap=$1 k=$2
  step nccl-install "$cap" torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_install_ulysses_nccl.py \
    -q -rA -s -p no:cacheprovider ${k:+-k "$k"}
}
parallel_bench() {  # parallel_bench CAP ARGS...: benchmarks/parallel.py on two GPUs, results in $OUT
  local cap=$1; shift
  step parallel-bench "$cap" torchrun --standalone --nproc-per-node=2 benchmarks/parallel.py --out "$OUT" "$@"
}
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee -a "$LOG"
case "$1" in
  parallel)
    step nccl-install 140 torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_install_ulysses_nccl.py \
      -q -rA -s -p no:cacheprovider
    step compile 90 python -m pytest tests/gpu/test_compile_gpu.py -k regional -q -rA -s -p no:cacheprovider
    step parallel-bench 230 torchrun --standalone --nproc-per-node=2 benchmarks/parallel.py --out "$OUT" --tag h200x2
    step vae-parallel 130 python benchmarks/probes/vae_parallel.py --out "$OUT/vae-parallel-h200x2.json"
    ;;
  pipeline)
    H3_T_RECIPE=${H3_T_RECIPE:-270} OUT="$OUT" H3_RECIPES="bf16 fp8" bash benchmarks/pipeline_h200.sh >> "$LOG" 2>&1
    tail -40 "$LOG"
    ;;
  fp8)
    step fp8-gpu-tests 120 python -m pytest tests/gpu/test_fp8_producers_gpu.py -q -rA -s -p no:cacheprovider
    step fp8-probe 260 python benchmarks/probes/fp8_producers.py "$OUT" --sections kernels,qk,block --rounds 6
    step vae-parallel 140 python benchmarks/probes/vae_parallel.py --out "$OUT/vae-parallel-h200x2.json"
    ;;
  u2pipe)
    cp benchmarks/results/pipeline-h200.json "$OUT/pipeline-h200.json"
    for recipe in ${H3_RECIPES:-bf16 fp8}; do
      step "pipeline-u2-$recipe" "${H3_T_RECIPE:-280}" torchrun --standalone --nproc-per-node=2 benchmarks/pipeline.py \
        hardware=sm90 parallel=u2 "recipe=$recipe" --video 768x1344x124 --text-tokens 110 --rounds 2 --warmup 2 \
        --steps 1 --decode-warmup 1 --out "$OUT" --tag h200 ${H3_PIPELINE_ARGS:-}
    done
    rm -f "$OUT"/*.tmp
    ;;
  profile)
    step block-profile 120 python benchmarks/probes/block_profile.py --out "$OUT" fp8:19000 fp8:37820 bf16:37820
    step parallel-bench 260 torchrun --standalone --nproc-per-node=2 benchmarks/parallel.py --out "$OUT" --tag h200x2 \
      --rounds 4 --profile
    step ring-nccl 60 torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_ring_nccl.py -q -rA -p no:cacheprovider
    step vae-parallel-nccl 60 torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_vae_parallel_nccl.py -q -rA \
      -p no:cacheprovider
    step gpu-rest 200 python -m pytest -q -rA -p no:cacheprovider tests/gpu/test_calibrate_gpu.py tests/gpu/test_pipeline_gpu.py \
      tests/gpu/test_install_gpu.py -k "calibrate or static or verify or plan_frames or two_cta"
    ;;
  measure)
    for recipe in bf16 fp8; do
      step "block-$recipe" 150 python -m h3plan action=bench hardware=sm90 parallel=u1 "recipe=$recipe" bench.tag=h200 \
        "bench.out_dir=$OUT" 'bench.seq_lens=[19000,37820]' 'bench.blocks=[1]'
    done
    step fp8-act-quant-ab 120 python benchmarks/probes/fp8_act_quant_ab.py "$OUT" 19000 37820
    step fp8-act-quant-gpu 90 python -m pytest tests/gpu/test_fp8_act_quant_gpu.py -m gpu -q -rA -p no:cacheprovider
    ;;
  vae)
    step vae-released 240 python benchmarks/vae.py --out "$OUT" --latents 1x24x62x48x84 --plans "hardware=sm90 recipe=bf16" \
      --warmup 1 --iters 2 --tag h200-released --budget-s 220
    step vae-parallel-nccl 60 torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_vae_parallel_nccl.py -q -rA \
      -p no:cacheprovider
    step block-profile 120 python benchmarks/probes/block_profile.py --out "$OUT" fp8:19000 fp8:37820 bf16:37820 \
      fp8:37820:levers.fp8_act_quant=tensor
    ;;
  vae2)
    step nccl-install-fp8 150 torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_install_ulysses_nccl.py \
      -q -rA -p no:cacheprovider -k "${H3_K:-fp8}"
    step vae-fp8-released 170 python benchmarks/vae.py --out "$OUT" --latents 1x24x62x48x84 --plans "hardware=sm90 recipe=fp8" \
      --warmup 1 --iters 2 --tag h200-fp8 --budget-s 150
    step vae-profile 90 python benchmarks/probes/vae_profile.py 1x24x12x48x84 --out "$OUT"
    step vae-parallel-nccl 60 torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_vae_parallel_nccl.py -q -rA \
      -p no:cacheprovider
    step compile 90 python -m pytest tests/gpu/test_compile_gpu.py -k regional -q -rA -p no:cacheprovider
    ;;
  recheck)
    step nccl-install-fp8 150 torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_install_ulysses_nccl.py \
      -q -rA -p no:cacheprovider -k "${H3_K:-fp8}"
    step vae-parallel-nccl 60 torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_vae_parallel_nccl.py -q -rA \
      -p no:cacheprovider
    ;;
  overlap)
    step ulysses-overlap 300 torchrun --standalone --nproc-per-node=2 benchmarks/probes/ulysses_overlap.py "$OUT" 37820
    step ring-install-nccl 200 torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_install_ring_nccl.py -q -rA \
      -s -p no:cacheprovider
    ;;
  scale)
    nccl_install 150 ""
    parallel_bench 230 --tag h200x2 --rounds 6 --exchange-arm --profile
    cp benchmarks/results/pipeline-h200.json "$OUT/pipeline-h200.json"
    step pipeline-u2-bf16 230 torchrun --standalone --nproc-per-node=2 benchmarks/pipeline.py hardware=sm90 parallel=u2 \
      recipe=bf16 --video 768x1344x124 --text-tokens 110 --rounds 2 --warmup 2 --steps 1 --decode-warmup 1 --out "$OUT" \
      --tag h200
    rm -f "$OUT"/*.tmp
    ;;
  split)
    nccl_install 150 "${H3_K:-split or projection or bf16-37820}"
    parallel_bench 300 --tag h200x2 --rounds 8 --exchange-arm --profile
    ;;
  last)
    parallel_bench 220 --tag h200x2-8blocks --seq-lens 37820 --blocks 8 --recipes bf16 --no-compile-plans --exchange-arm \
      --rounds 6
    step parking-gpu 90 python -m pytest tests/gpu/test_install_gpu.py -k parks -q -rA -p no:cacheprovider
    H3_T_RECIPE=$(( $(left) - 5 )) OUT="$OUT" H3_RECIPES=fp8 H3_APPEND=1 bash benchmarks/pipeline_h200.sh >> "$LOG" 2>&1
    grep -E "^=== |exit " "$OUT/pipeline-h200.log" | tail -4
    ;;
  post)
    nccl_install 110 "projection or split or bf16-37820"
    parallel_bench 200 --tag h200x2-bf16 --recipes bf16 --no-compile-plans --exchange-arm --rounds 10
    ;;
  ring)
    step ring-install-nccl 200 torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_install_ring_nccl.py -q -rA \
      -s -p no:cacheprovider
    ;;
  many)  # H3_NPROC GPUs (default 8; 4 works too): the larger degrees, ring x Ulysses against Ulysses at the same world
    N=${H3_NPROC:-8}
    step "ulysses-nccl-x$N" 120 torchrun --standalone --nproc-per-node="$N" -m pytest tests/gpu/test_ulysses_nccl.py -q -rA \
      -p no:cacheprovider
    step "install-nccl-x$N" 150 torchrun --standalone --nproc-per-node="$N" -m pytest tests/gpu/test_install_ulysses_nccl.py \
      -q -rA -s -p no:cacheprovider
    step "ring-install-x$N" 120 torchrun --standalone --nproc-per-node="$N" -m pytest tests/gpu/test_install_ring_nccl.py -q -rA \
      -s -p no:cacheprovider
    step "scaling-x$N" 200 torchrun --standalone --nproc-per-node="$N" benchmarks/probes/ulysses_scaling.py "$OUT" 37820 104076
    step "parallel-bench-x$N" 240 torchrun --standalone --nproc-per-node="$N" benchmarks/parallel.py --out "$OUT" \
      --tag "h200x$N" --seq-lens 37820,104076 --rounds 4 --no-compile-plans --ring 2
    ;;
  final)
    H3_T_RECIPE=${H3_T_RECIPE:-230} OUT="$OUT" H3_RECIPES="bf16 fp8" bash benchmarks/pipeline_h200.sh >> "$LOG" 2>&1
    grep -E "^=== |exit |pipeline bench" "$LOG" | tail -8
    step gpu-suite 400 python -m pytest tests/gpu -m gpu -q -rA -p no:cacheprovider --deselect \
      tests/gpu/test_install_ulysses_nccl.py --deselect tests/gpu/test_compile_gpu.py
    ;;
  *) echo "unknown phase $1 (parallel | pipeline | u2pipe | profile | measure | vae | vae2 | recheck | overlap | scale | split | last | post | ring | many | fp8 | final)"; exit 2 ;;
esac
echo "=== done in $(( $(date +%s) - START ))s; files:" | tee -a "$LOG"
ls -l "$OUT" | tee -a "$LOG"
