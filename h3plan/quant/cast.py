"""Per-tensor dynamic e4m3 quantisation of activations (the FP8 GEMM's A operand), two Triton passes.

    amax = max |x|; scale = 448 / amax (1 if amax == 0); codes = e4m3(clamp(x * scale, +-448));
    descale = 1 / scale

the convention of h3plan.kernels.qk_norm_rope's FP8 cast and h3plan.attention.fp8. Pass 1 writes one
partial max per program (no atomics; the tiny final max and the IEEE scale division run in torch);
pass 2 scales in fp32 (one rounding) and rounds to nearest even through an explicit e4m3 rounding
(`round_to_e4m3`), so the codes are identical on the GPU, in the interpreter and in `quantize_ref`.
Versus torch's own ops this reads x twice and writes 1 byte per element (torch: an fp32 copy and three
elementwise passes). Refused inputs (`quantize_check`) go to `quantize_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from h3plan.kernels._common import INTERPRET, LAUNCH_OPTS, guard, tensor_checks, to_f32
from h3plan.kernels._registry import custom_op
from h3plan.kernels.qk_norm_rope import round_to_e4m3

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
BLOCK = 4096


@triton.jit
def _partial_amax_kernel(x_ptr, part_ptr, N, BLOCK: tl.constexpr, HW: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    x = to_f32(tl.load(x_ptr + offs, mask=offs < N, other=0.0), HW)
    tl.store(part_ptr + pid, tl.max(tl.abs(x), axis=0))


@triton.jit
def _cast_kernel(x_ptr, scale_ptr, out_ptr, N, BLOCK: tl.constexpr, HW: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    m = offs < N
    x = to_f32(tl.load(x_ptr + offs, mask=m, other=0.0), HW)
    y = tl.minimum(tl.maximum(x * tl.load(scale_ptr), -448.0), 448.0)
    tl.store(out_ptr + offs, round_to_e4m3(y).to(tl.float8e4nv), mask=m)


def scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    return torch.where(amax > 0, torch.full_like(amax, E4M3_MAX) / amax, torch.ones_like(amax))


def quantize_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle and fallback: (codes e4m3 shaped like x, descale fp32 0-dim)."""
    scale = scale_from_amax(x.abs().amax().float())
    codes = (x.float() * scale).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return codes, torch.ones_like(scale) / scale


def quantize_check(x) -> str | None:
    def checks():
        yield from tensor_checks("x", x, (torch.bfloat16, torch.float16))
        yield x.numel() > 0, "x is empty"

    return guard(checks())


def _fake(x):
    return torch.empty_like(x, dtype=E4M3), x.new_empty((), dtype=torch.float32)


@custom_op("fp8_quantize_per_tensor", fake=_fake)
def _quantize_op(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.numel()
    grid = (triton.cdiv(n, BLOCK),)
    part = torch.empty(grid[0], device=x.device, dtype=torch.float32)
    _partial_amax_kernel[grid](x, part, n, BLOCK=BLOCK, HW=not INTERPRET, num_warps=8, **LAUNCH_OPTS)
    scale = scale_from_amax(part.amax())
    out = torch.empty_like(x, dtype=E4M3)
    _cast_kernel[grid](x, scale, out, n, BLOCK=BLOCK, HW=not INTERPRET, num_warps=8, **LAUNCH_OPTS)
    return out, torch.ones_like(scale) / scale


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, descale) of a contiguous bf16/fp16 tensor; raises ValueError(reason) on refused inputs."""
    reason = quantize_check(x)
    if reason:
        raise ValueError(reason)
    return torch.ops.h3plan.fp8_quantize_per_tensor(x)
