"""Shared pieces of the Triton kernels: explicit rounding, launch options, guard helpers.

Numerics contract (docs/numerics.md): kernels do fp32 math and round to the storage
dtype only where eager rounds, through `round_to_bf16` / `round_to_fp16` below. Those helpers produce an
fp32 value that is exactly representable in the target dtype, so the final `.to(dtype)` is exact both on
the GPU and in Triton's CPU interpreter (whose fp32->bf16 cast truncates). Kernels launch with
`enable_fp_fusion=False` so a separate eager mul and add never become one FMA.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Passed to every launch: no FMA contraction where eager does a separate multiply and add.
LAUNCH_OPTS = {"enable_fp_fusion": False}

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Rows (tokens) a program takes in Triton's interpreter. The interpreter runs each program as numpy calls whose
# cost is per op, not per element: a GPU tile of one token a program made qk_norm_rope at 256 tokens take 20 s, at 64
# tokens 0.33 s, bitwise the same (each row's math is its own). The GPU launches keep their tuned tiles.
INTERPRET_ROWS = 64


def interpreter_tile(rows: int) -> int:
    """A kernel's default rows per program: `rows` (its tuned GPU tile) on a GPU, at least INTERPRET_ROWS in the
    interpreter. Rows never share arithmetic in these kernels, so the count changes no bit (tests/kernels check
    the interpreter's tiles against the references)."""
    return max(int(rows), INTERPRET_ROWS) if INTERPRET else int(rows)


@triton.jit
def round_to_bf16(x):
    """fp32 -> nearest-even bf16 value, kept in fp32. NaN stays NaN, inf stays inf."""
    u = x.to(tl.uint32, bitcast=True)
    lsb = (u >> 16) & 1
    r = (u + 0x7FFF + lsb) & 0xFFFF0000
    r = tl.where(x != x, u | 0x00400000, r)  # quiet NaN, never rounded into inf
    return r.to(tl.float32, bitcast=True)


@triton.jit
def negate(x):
    """-x for fp32 x by flipping the sign bit, as torch's neg does for every non-NaN value. Triton's unary
    minus gives +0.0 for +0.0 on the GPU (torch: -0.0), which changes the sign of a zero that later survives
    an addition (H200: tests/kernels/test_negate.py prints it). NaN stays NaN (payload unspecified)."""
    return (x.to(tl.uint32, bitcast=True) ^ 0x80000000).to(tl.float32, bitcast=True)


@triton.jit
def round_to_fp16(x):
    """fp32 -> nearest-even fp16 value (subnormals and overflow to inf included), kept in fp32."""
    ax = tl.abs(x)
    # Quantum of the fp16 grid at |x|: 2^(e-10) for normals (e >= -14), 2^-24 for subnormals.
    e = tl.floor(tl.log2(tl.maximum(ax, 6.103515625e-05)))
    e = tl.maximum(e, -14.0)
    # log2 can be off by one ulp near powers of two: fix the exponent exactly with a compare.
    p = tl.exp2(e)
    e = tl.where(p > tl.maximum(ax, 6.103515625e-05), e - 1.0, e)
    e = tl.where(tl.exp2(e + 1.0) <= ax, e + 1.0, e)
    e = tl.maximum(e, -14.0)
    q = tl.exp2(e - 10.0)
    y = ax / q  # exact: q is a power of two
    f = tl.floor(y)
    rem = y - f
    half = rem == 0.5
    odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    f = tl.where((rem > 0.5) | (half & odd), f + 1.0, f)
    r = f * q
    r = tl.where(r > 65504.0, float("inf"), r)
    neg = (x.to(tl.uint32, bitcast=True) >> 31) == 1  # sign bit, so -0.0 stays -0.0
    r = tl.where(neg, -r, r)
    r = tl.where(x != x, x, r)
    r = tl.where(ax == float("inf"), x, r)
    return r


@triton.jit
def round_to(x, IS_BF16: tl.constexpr):
    if IS_BF16:
        return round_to_bf16(x)
    else:
        return round_to_fp16(x)


@triton.jit
def round_hw(x, IS_BF16: tl.constexpr, HW: tl.constexpr):
    """Like `round_to`, but with HW (on the GPU) through the hardware cvt.rn.{bf16,f16}.f32, the instruction
    torch's CUDA casts use (NaN -> canonical NaN like theirs) and a fraction of the emulation's integer ops;
    without HW (interpreter, whose casts truncate) through `round_to`. Same bits for every non-NaN input."""
    if HW:
        if IS_BF16:
            return x.to(tl.bfloat16).to(tl.float32)
        else:
            return x.to(tl.float16).to(tl.float32)
    else:
        return round_to(x, IS_BF16)


@triton.jit
def round_st(x, IS_BF16: tl.constexpr, IS_F32: tl.constexpr, HW: tl.constexpr):
    """`round_hw` to the storage dtype, or nothing where that dtype is float32 (every fp32 op already rounded)."""
    if IS_F32:
        return x
    else:
        return round_hw(x, IS_BF16, HW)


@triton.jit
def to_f32(x, HW: tl.constexpr):
    """Exact upcast to fp32. The interpreter's bf16 -> fp32 cast mangles subnormals, so without HW a bf16
    value is widened through its bits (a 16-bit shift, which is all the cast is)."""
    if HW:
        return x.to(tl.float32)
    elif x.dtype != tl.bfloat16:
        return x.to(tl.float32)
    else:
        bits = x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16
        return bits.to(tl.float32, bitcast=True)


@triton.jit
def from_f32(x, dtype: tl.constexpr, HW: tl.constexpr):
    """Cast an fp32 value that is exactly representable in `dtype` (a `round_hw` result) to `dtype`. The
    interpreter's fp32 -> bf16 cast mangles subnormals, so without HW bf16 takes the high 16 bits."""
    if HW:
        return x.to(dtype)
    elif dtype != tl.bfloat16:
        return x.to(dtype)
    else:
        bits = (x.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16)
        return bits.to(tl.bfloat16, bitcast=True)


def guard(checks) -> str | None:
    """First failing check's message, or None. `checks` is an iterable of (ok, message)."""
    for ok, msg in checks:
        if not ok:
            return msg
    return None


def tensor_checks(name: str, t: torch.Tensor, dtypes, *, ndim=None, contiguous=True, device=None):
    """Standard per-tensor guard checks, as (ok, message) pairs for `guard`."""
    yield isinstance(t, torch.Tensor), f"{name} is not a tensor"
    yield t.dtype in dtypes, f"{name} dtype {t.dtype} not in {sorted(str(d) for d in dtypes)}"
    if ndim is not None:
        yield t.dim() == ndim, f"{name} has {t.dim()} dims, expected {ndim}"
    if contiguous:
        yield t.is_contiguous(), f"{name} is not contiguous (strides {tuple(t.stride())})"
    if device is not None:
        yield t.device == device, f"{name} is on {t.device}, expected {device}"
    yield (t.device.type == "cuda" or INTERPRET,
           f"{name} is on {t.device.type}; Triton needs CUDA (or TRITON_INTERPRET=1)")


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
