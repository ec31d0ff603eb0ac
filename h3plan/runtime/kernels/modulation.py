"""Fused RMSNorm + indexed AdaLN modulation (the MiniMax-H3 block's norm1/norm2 step), exact or fp32.

    out = rms_norm(x, weight, eps) * (1 + scale[index]) + shift[index]

x: (B, S, D) bf16, contiguous. weight: (D,) bf16 (nn.RMSNorm's) or None. scale, shift: (R, D) bf16 with
unit column stride and any row stride (the `chunk(6, -1)` views of the block's AdaLN projection).
index: (S,) int64, shared by the batch; values must lie in [0, R) -- the kernel does not check them (a
device-side check would synchronize), the reference raises.

Modes
- "exact": bit-identical on the GPU to the block's eager bf16 sequence
      n = norm1(x); n * (1.0 + scale.index_select(0, index)) + shift.index_select(0, index)
  torch 2.11 runs norm1 on CUDA as vectorized_layer_norm_kernel<bf16, float, rms_norm=true> (source:
  aten/src/ATen/native/cuda/layer_norm_kernel.cu; kernel name seen by the H200 probe in
  benchmarks/probes/): the fp32 sum of squares in its thread/shuffle order (reproduced below and in
  runtime/kernels/_rmsnorm.py), IEEE division by D, + eps, rsqrt, then n = bf16(w * (rstd * x)), rounded once.
  Eager then rounds 1 + scale, the product and the sum to bf16; the kernel rounds at exactly those points.
  torch takes that path only for D % 4 == 0 and 8-byte aligned x and weight (else a Welford two-kernel
  path): such inputs are refused in exact mode.
- "fp32": the same math in fp32, one rounding at the end. Lossy against eager; its error against exact is
  bounded element-wise in tests/kernels/test_modulation.py and measured at real shapes by the GPU suite.

In Triton's CPU interpreter rsqrt is numpy's 1/sqrt and torch's CPU rms_norm sums in another order, so
CPU tests match an emulation of the CUDA order exactly and the CPU eager reference within a 1-ulp
budget. Fallback: `rmsnorm_modulate_ref`; `rmsnorm_modulate_check` says why an input is refused.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from h3plan.runtime.kernels._common import (INTERPRET, LAUNCH_OPTS, from_f32, guard, interpreter_tile, round_hw,
                                            tensor_checks, to_f32)
from h3plan.runtime.kernels._registry import custom_op
from h3plan.runtime.kernels._rmsnorm import THREADS, VEC, cuda_rms_iters, cuda_rms_rstd, cuda_rms_tree

_T = tl.constexpr(THREADS)
_V = tl.constexpr(VEC)
MODES = ("exact", "fp32")
MAX_D = 16384  # the row loops are unrolled at compile time
# (rows per program, columns per output step, warps), keyed by D. 5376: the fastest exact config of the H200 sweep
# (benchmarks/results/sweeps/sweep-rmsnorm_modulate.md: 0.82 of copy at 19,000 rows, 0.92 at 104,072).
CONFIGS = {5376: (1, 1024, 4)}
SWEEP_CONFIGS = [(2, 512, 2), (1, 1024, 1), (1, 1024, 2), (2, 1024, 2), (1, 1024, 4), (2, 512, 4),
                 (4, 512, 4), (4, 1024, 8)]


# rstd on the GPU: "tl" (tl.math.rsqrt, the approximate rsqrt torch's rsqrtf compiles to, as in
# runtime/kernels/_rmsnorm.py) or "ieee" (1 / sqrt, each correctly rounded). The GPU suite reports which matches.
RSQRT = "tl"


def _config(D: int):
    rows, block, warps = CONFIGS.get(D) or (2, min(512, triton.next_power_of_2(D)), 2)
    return interpreter_tile(rows), block, warps


@triton.jit
def _sumsq_vec(x_ptr, row_off, rmask, D, NITER: tl.constexpr, ROWS: tl.constexpr, HW: tl.constexpr):
    """Sum of squares of ROWS rows, [ROWS] fp32, with exactly the adds of `_rmsnorm.cuda_rms_sumsq`
    (torch's CUDA order), but loading each thread's 4-vector in one access."""
    col = tl.arange(0, _T)[:, None] * _V + tl.arange(0, _V)[None, :]  # [threads, 4]
    acc = tl.zeros([ROWS, _T], dtype=tl.float32)
    for j in tl.static_range(NITER):
        c = j * (_T * _V) + col
        m = rmask[:, None, None] & (c < D)[None, :, :]
        v = to_f32(tl.load(x_ptr + row_off[:, None, None] + c[None, :, :], mask=m, other=0.0), HW)
        even, odd = tl.split(tl.reshape(v, [ROWS, _T, 2, 2]))  # vector elements (0, 2), (1, 3)
        v0, v2 = tl.split(even)
        v1, v3 = tl.split(odd)
        # acc + v * v as one fma: the square of a bf16 value is exact in fp32, so the fma rounds the same.
        acc = tl.fma(v0, v0, acc)
        acc = tl.fma(v1, v1, acc)
        acc = tl.fma(v2, v2, acc)
        acc = tl.fma(v3, v3, acc)
    return cuda_rms_tree(acc, ROWS)


@triton.jit
def _rmsnorm_modulate_kernel(x_ptr, w_ptr, scale_ptr, shift_ptr, idx_ptr, out_ptr,
                             M, S, D, scale_stride, shift_stride, eps,
                             HAS_W: tl.constexpr, EXACT: tl.constexpr, ROWS: tl.constexpr,
                             NITER: tl.constexpr, BLOCK: tl.constexpr, NBLK: tl.constexpr,
                             IEEE_RSQRT: tl.constexpr, HW: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    rmask = rows < M
    row_off = rows * D
    ss = _sumsq_vec(x_ptr, row_off, rmask, D, NITER, ROWS, HW)
    if IEEE_RSQRT:
        ms = tl.math.div_rn(ss, tl.full(ss.shape, D, tl.float32))
        rstd = tl.math.div_rn(tl.full(ss.shape, 1.0, tl.float32), tl.math.sqrt_rn(ms + eps))
    else:
        rstd = cuda_rms_rstd(ss, D, eps)
    idx = tl.load(idx_ptr + rows % S, mask=rmask, other=0)
    sc_off = idx * scale_stride
    sh_off = idx * shift_stride
    for b in tl.static_range(NBLK):
        cols = b * BLOCK + tl.arange(0, BLOCK)
        cm = cols < D
        m = rmask[:, None] & cm[None, :]
        x = to_f32(tl.load(x_ptr + row_off[:, None] + cols[None, :], mask=m, other=0.0), HW)
        y = rstd[:, None] * x
        if HAS_W:
            y = to_f32(tl.load(w_ptr + cols, mask=cm, other=0.0), HW)[None, :] * y
        sc = to_f32(tl.load(scale_ptr + sc_off[:, None] + cols[None, :], mask=m, other=0.0), HW)
        sh = to_f32(tl.load(shift_ptr + sh_off[:, None] + cols[None, :], mask=m, other=0.0), HW)
        if EXACT:
            n = round_hw(y, True, HW)
            o = round_hw(n * round_hw(1.0 + sc, True, HW), True, HW) + sh
        else:
            o = y * (1.0 + sc) + sh
        o = round_hw(o, True, HW)
        tl.store(out_ptr + row_off[:, None] + cols[None, :], from_f32(o, tl.bfloat16, HW), mask=m)


def rmsnorm_modulate_ref(x, weight, scale, shift, index, eps=None, mode="exact"):
    """Oracle and fallback. exact: the block's eager sequence; fp32: the same math in fp32, one rounding."""
    D = x.shape[-1]
    sc, sh = scale.index_select(0, index), shift.index_select(0, index)
    if mode == "exact":
        n = torch.nn.functional.rms_norm(x, (D,), weight, eps)
        return n * (1.0 + sc) + sh
    xf = x.float()
    e = torch.finfo(torch.float32).eps if eps is None else eps
    y = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + e) * xf
    if weight is not None:
        y = weight.float() * y
    return (y * (1.0 + sc.float()) + sh.float()).to(x.dtype)


def _aligned8(t) -> bool:
    # Traced tensors have no pointer: the op's eager body re-runs this check on the real tensors and raises.
    return torch.compiler.is_compiling() or t.data_ptr() % 8 == 0


def rmsnorm_modulate_check(x, weight, scale, shift, index, eps=None, mode="exact") -> str | None:
    """None if the kernel takes these inputs, else the one-line reason."""
    def checks():
        yield mode in MODES, f"mode {mode!r} not in {MODES}"
        yield from tensor_checks("x", x, (torch.bfloat16,), ndim=3)
        D = x.shape[2]
        yield 0 < D <= MAX_D, f"x row length {D} outside [1, {MAX_D}]"
        if weight is not None:
            yield from tensor_checks("weight", weight, (torch.bfloat16,), ndim=1, device=x.device)
            yield weight.shape[0] == D, f"weight has {weight.shape[0]} elements, x rows {D}"
        for name, t in (("scale", scale), ("shift", shift)):
            yield from tensor_checks(name, t, (torch.bfloat16,), ndim=2, contiguous=False, device=x.device)
            yield t.shape[1] == D, f"{name} has {t.shape[1]} columns, x rows {D}"
            yield t.stride(1) == 1 or D == 1, f"{name} columns not unit-stride (strides {t.stride()})"
            yield t.shape[0] > 0, f"{name} table has no rows"
        yield from tensor_checks("index", index, (torch.int64,), ndim=1, device=x.device)
        yield index.shape[0] == x.shape[1], f"index has {index.shape[0]} rows, x has S={x.shape[1]}"
        yield eps is None or isinstance(eps, (int, float)), f"eps {eps!r} is not a number"
        if mode == "exact":
            # torch's vectorized CUDA rms_norm (whose order exact mode reproduces) needs these.
            yield D % VEC == 0, f"exact mode needs D % 4 == 0 (torch's vectorized rms_norm path), D={D}"
            yield _aligned8(x), "exact mode needs x 8-byte aligned (torch's vectorized rms_norm path)"
            yield weight is None or _aligned8(weight), "exact mode needs weight 8-byte aligned"
    return guard(checks())


def _launch(x, weight, scale, shift, index, eps, mode, config=None, rsqrt=None):
    B, S, D = x.shape
    out = torch.empty_like(x)
    M = B * S
    if M == 0:
        return out
    rows, block, warps = config or _config(D)
    eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
    _rmsnorm_modulate_kernel[(triton.cdiv(M, rows),)](
        x, x if weight is None else weight, scale, shift, index, out, M, S, D, scale.stride(0),
        shift.stride(0), eps, HAS_W=weight is not None, EXACT=mode == "exact", ROWS=rows,
        NITER=cuda_rms_iters(triton.cdiv(D, VEC) * VEC), BLOCK=block, NBLK=triton.cdiv(D, block),
        IEEE_RSQRT=(rsqrt or RSQRT) == "ieee", HW=not INTERPRET, num_warps=warps,
        **LAUNCH_OPTS)
    return out


def _fake(x, weight, scale, shift, index, eps, mode):
    return torch.empty_like(x)


@custom_op("rmsnorm_modulate", fake=_fake)
def _rmsnorm_modulate_op(x: torch.Tensor, weight: Optional[torch.Tensor], scale: torch.Tensor,
                         shift: torch.Tensor, index: torch.Tensor, eps: Optional[float], mode: str) -> torch.Tensor:
    reason = rmsnorm_modulate_check(x, weight, scale, shift, index, eps, mode)
    if reason is not None:
        raise ValueError(reason)
    return _launch(x, weight, scale, shift, index, eps, mode)


def rmsnorm_modulate(x, weight, scale, shift, index, eps=None, mode="exact"):
    """`rms_norm(x, weight, eps) * (1 + scale[index]) + shift[index]` in one pass (see the module doc for
    the modes' numerics); ValueError(reason) on inputs the kernel does not take."""
    reason = rmsnorm_modulate_check(x, weight, scale, shift, index, eps, mode)
    if reason is not None:
        raise ValueError(reason)
    return torch.ops.h3plan.rmsnorm_modulate(x, weight, scale, shift, index, eps, mode)


# the kernel ops of this module a lever names (SPEC.kernels): op -> (function, its check), read by table.py
OPS = {"modulation": ("rmsnorm_modulate", "rmsnorm_modulate_check")}
