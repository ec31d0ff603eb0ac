"""SwiGLU activation with diffusers' semantics (SwiGLU.forward after its proj), exact.

    hidden, gate = x.chunk(2, dim=-1); out = hidden * silu(gate)

x: (..., 2F) bf16, fp16 or fp32 (the VAE decoder runs it in its decode precision), contiguous; out (..., F).

Numerics: torch's silu on a bf16/fp16 tensor computes `x / (1 + exp(-x))` in fp32 (expf, IEEE division)
and rounds once; the product then rounds again. The kernel does the same fp32 operations -- libdevice
`expf` (the function torch's CUDA kernel calls) and `div_rn` -- and rounds at those two points. On fp32
x torch's silu and product are those fp32 operations with no rounding step, so neither has the kernel (the
GPU suite checks the bits; exhaustive proof covers the 16-bit gates only). Because
silu depends only on the 16-bit gate, its exactness is proven exhaustively over all 65,536 gate values
(tests/kernels/test_swiglu.py in the interpreter, tests/gpu on the H200). Fallback: `swiglu_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from h3plan.runtime.kernels._common import (INTERPRET, LAUNCH_OPTS, from_f32, guard, interpreter_tile, round_st,
                                            tensor_checks, to_f32)
from h3plan.runtime.kernels._registry import custom_op

# (rows per program, output columns per program, warps). Columns: the largest power of two <= 1024
# dividing F (14336 = 14 * 1024). Untimed until benchmarks/fused_kernels.py --sweep runs on the H200.
SWEEP_CONFIGS = [(2, 1024, 4), (1, 1024, 4), (4, 1024, 8), (4, 512, 4), (8, 256, 4), (1, 2048, 8)]
# exp used on the GPU: "libdevice" (expf, what torch calls) or "tl" (Triton's exp2-based approximation).
# The interpreter always uses numpy's exp.
EXP = "libdevice"
DTYPES = (torch.bfloat16, torch.float16)  # x the transformer's fused SwiGLU takes (its blocks are bf16)
VAE_DTYPES = DTYPES + (torch.float32,)  # the VAE decoder's too: its fp32 decode (silu and the product unrounded)


def _config(F: int):
    block = next((b for b in (1024, 512, 256, 128) if F % b == 0), min(1024, triton.next_power_of_2(F)))
    return (interpreter_tile(max(1, 2048 // block)), block, 4)


@triton.jit
def _swiglu_kernel(x_ptr, out_ptr, M, F, ROWS: tl.constexpr, BLOCK_F: tl.constexpr,
                   IS_BF16: tl.constexpr, HW: tl.constexpr, LIBDEVICE_EXP: tl.constexpr, IS_F32: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    m = (rows < M)[:, None] & (cols < F)[None, :]
    xin = x_ptr + rows[:, None] * (2 * F) + cols[None, :]
    a = to_f32(tl.load(xin, mask=m, other=0.0), HW)
    g = to_f32(tl.load(xin + F, mask=m, other=0.0), HW)
    if LIBDEVICE_EXP:
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    # Some Triton versions lower div_rn to div.rn.ftz, which would flush the fp32-subnormal quotients of
    # |g| < 2^-125 that torch keeps. For |g| < 1e-30, exp(-g) is exactly 1: torch's quotient is exactly g / 2.
    s = tl.where(tl.abs(g) < 1e-30, g * 0.5, tl.math.div_rn(g, 1.0 + e))
    s = round_st(s, IS_BF16, IS_F32, HW)
    out = round_st(a * s, IS_BF16, IS_F32, HW)
    tl.store(out_ptr + rows[:, None] * F + cols[None, :], from_f32(out, out_ptr.dtype.element_ty, HW), mask=m)


def swiglu_ref(x):
    """diffusers' SwiGLU after its proj (oracle and fallback)."""
    hidden, gate = x.chunk(2, dim=-1)
    return hidden * torch.nn.functional.silu(gate)


def swiglu_check(x, dtypes=DTYPES) -> str | None:
    """None if the kernel takes x, else the one-line reason (dtypes: DTYPES for the transformer, VAE_DTYPES)."""
    def checks():
        yield from tensor_checks("x", x, dtypes)
        yield x.dim() >= 1 and x.shape[-1] % 2 == 0, f"x last dim {tuple(x.shape)[-1:]} is not even"
    return guard(checks())


def _launch(x, config=None, exp=None):
    F = x.shape[-1] // 2
    out = x.new_empty(x.shape[:-1] + (F,))
    M = x.numel() // (2 * F) if F else 0
    if M == 0:
        return out
    rows, block_f, warps = config or _config(F)
    grid = (triton.cdiv(M, rows), triton.cdiv(F, block_f))
    _swiglu_kernel[grid](x, out, M, F, ROWS=rows, BLOCK_F=block_f, IS_BF16=x.dtype == torch.bfloat16,
                         HW=not INTERPRET, LIBDEVICE_EXP=(exp or EXP) == "libdevice" and not INTERPRET,
                         IS_F32=x.dtype == torch.float32,
                         num_warps=warps, **LAUNCH_OPTS)
    return out


def _fake(x):
    return x.new_empty(x.shape[:-1] + (x.shape[-1] // 2,))


@custom_op("swiglu", fake=_fake)
def _swiglu_op(x: torch.Tensor) -> torch.Tensor:
    reason = swiglu_check(x, VAE_DTYPES)
    if reason is not None:
        raise ValueError(reason)
    return _launch(x)


def swiglu(x):
    """`hidden * silu(gate)` of x = [hidden | gate] in one pass, bit-identical to eager; ValueError if refused."""
    reason = swiglu_check(x, VAE_DTYPES)
    if reason is not None:
        raise ValueError(reason)
    return torch.ops.h3plan.swiglu(x)


def vae_swiglu_check(x) -> str | None:
    """swiglu_check for the VAE decoder, whose decode may run in float32."""
    return swiglu_check(x, VAE_DTYPES)


# the kernel ops of this module a lever names (SPEC.kernels): op -> (function, its check), read by table.py
OPS = {"swiglu": ("swiglu", "swiglu_check"), "vae_swiglu": ("swiglu", "vae_swiglu_check")}
