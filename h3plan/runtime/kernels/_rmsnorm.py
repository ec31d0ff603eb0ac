"""RMSNorm statistics in exactly the order torch's CUDA eager kernel computes them.

torch 2.11 runs `F.rms_norm` / `nn.RMSNorm` on contiguous CUDA rows whose length is a multiple of 4
through `vectorized_layer_norm_kernel<T, float, rms_norm=true>` (seen by the H200 probe,
benchmarks/probes/rounding_probe-h200.json). Its arithmetic, from aten/src/ATen/native/cuda/
layer_norm_kernel.cu:

- one row per CUDA block of 32 x 4 threads (thread t = lane + 32 * warp), vectors of 4 elements;
  thread t squares and adds, sequentially in fp32, the elements of vectors t, t + 128, t + 256, ...
  (element order 0..3 inside each vector). Squares of bf16/fp16 values are exact in fp32, so the
  FMA nvcc may form there rounds the same as a separate multiply and add;
- a warp-shuffle-down tree over lanes (offsets 16, 8, 4, 2, 1), then a tree over the 4 warps
  (offsets 2, 1): every step adds partial sums at that distance;
- ms = sumsq / N (IEEE division), rstd = rsqrt(ms + eps);
- y = round(gamma * (rstd * x)) with one rounding to the storage dtype.

The same order is used here, so the statistics are bit-identical on the GPU. On the CPU (interpreter)
torch's eager reference uses another order; CPU tests allow a rare 1-ulp difference there.
"""

from __future__ import annotations

import triton
import triton.language as tl

THREADS = 128  # 32 lanes x 4 warps, torch's launch for this kernel
VEC = 4
# Globals read inside @triton.jit must be constexpr.
_THREADS = tl.constexpr(THREADS)
_VEC = tl.constexpr(VEC)


def cuda_rms_iters(n: int) -> int:
    """Vector loads per thread for a row of n elements (n % 4 == 0)."""
    return triton.cdiv(n // VEC, THREADS)


@triton.jit
def _halve(s, LEAD: tl.constexpr, WIDTH: tl.constexpr):
    # s: [LEAD, 2 * WIDTH] -> [LEAD, WIDTH], element i + element i + WIDTH (one shuffle-down step)
    s = tl.reshape(s, [LEAD, 2, WIDTH])
    s = tl.permute(s, (0, 2, 1))
    lo, hi = tl.split(s)
    return lo + hi


@triton.jit
def cuda_rms_sumsq(x_ptr, row_offsets, row_mask, N, NITER: tl.constexpr, ROWS: tl.constexpr):
    """Sum of squares of ROWS rows (fp32, [ROWS]) in torch-CUDA order.

    x_ptr + row_offsets[r] is the first element of row r (int64 offsets); row_mask masks absent rows.
    """
    t = tl.arange(0, _THREADS)
    acc = tl.zeros([ROWS, _THREADS], dtype=tl.float32)
    for j in tl.static_range(NITER):
        base = (j * _THREADS + t) * _VEC  # [_THREADS]
        ok = (base < N)[None, :] & row_mask[:, None]
        ptrs = x_ptr + row_offsets[:, None] + base[None, :]
        for ii in tl.static_range(_VEC):
            v = tl.load(ptrs + ii, mask=ok, other=0.0).to(tl.float32)
            acc = acc + v * v
    return cuda_rms_tree(acc, ROWS)


@triton.jit
def cuda_rms_tree(acc, ROWS: tl.constexpr):
    """[ROWS] sums of the per-thread partial sums acc [ROWS, 128] in torch's order: a shuffle-down tree over each
    warp's 32 lanes (offsets 16, 8, 4, 2, 1), then over the 4 warps (offsets 2, 1)."""
    s = tl.reshape(acc, [ROWS * 4, 32])
    s = _halve(s, ROWS * 4, 16)
    s = _halve(s, ROWS * 4, 8)
    s = _halve(s, ROWS * 4, 4)
    s = _halve(s, ROWS * 4, 2)
    s = _halve(s, ROWS * 4, 1)
    s = tl.reshape(s, [ROWS, 4])
    s = _halve(s, ROWS, 2)
    s = _halve(s, ROWS, 1)
    return tl.reshape(s, [ROWS])


@triton.jit
def cuda_rms_rstd(sumsq, N, eps):
    """rstd = rsqrt(sumsq / N + eps), with the IEEE division torch's kernel does."""
    ms = tl.math.div_rn(sumsq, tl.full(sumsq.shape, N, tl.float32))
    return tl.math.rsqrt(ms + eps)
