"""Per-tensor dynamic e4m3 quantisation of activations (the FP8 GEMM's A operand), two Triton passes.

    amax = max |x|; scale = 448 / amax (1 if amax == 0); codes = e4m3(clamp(x * scale, +-448));
    descale = 1 / scale

the convention of h3plan.runtime.kernels.qk_norm_rope's FP8 cast and h3plan.runtime.attention.fp8. Pass 1 writes one
partial max per program (no atomics; the tiny final max and the IEEE scale division run in torch);
pass 2 scales in fp32 (one rounding) and rounds to nearest even through an explicit e4m3 rounding
(`round_to_e4m3` in the interpreter, the conversion's own round-to-nearest-even on the GPU), so the codes are identical
on the GPU, in the interpreter and in `quantize_ref`.
Versus torch's own ops this reads x twice and writes 1 byte per element (torch: an fp32 copy and three
elementwise passes). Refused inputs (`quantize_check`) go to `quantize_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from h3plan.runtime.kernels._common import INTERPRET, LAUNCH_OPTS, from_f32, guard, round_hw, tensor_checks, to_f32
from h3plan.runtime.kernels._registry import custom_op

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # largest finite e4m3fn value: the one FP8 range constant of h3plan
BLOCK = 4096


@triton.jit
def round_to_e4m3(x):
    """fp32 -> nearest-even e4m3fn value, kept in fp32 (exactly representable, so the final cast is exact
    on the GPU and in the interpreter). Callers clamp to +-448 first; NaN stays NaN, -0.0 stays -0.0."""
    ax = tl.abs(x)
    e = ((ax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)  # below 2^-6 the e4m3 grid is the subnormal quantum 2^-9
    q = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)  # grid step 2^(e-3)
    inv_q = ((127 - e + 3) << 23).to(tl.float32, bitcast=True)
    y = ax * inv_q  # exact: power-of-two scaling, y < 16
    f = tl.floor(y)
    rem = y - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    f = tl.where((rem > 0.5) | ((rem == 0.5) & odd), f + 1.0, f)
    r = f * q
    r = tl.where((x.to(tl.int32, bitcast=True) >> 31) != 0, -r, r)
    return tl.where(x != x, x, r)


@triton.jit
def e4m3_ready(x, HW: tl.constexpr):
    """x (clamped to +-448) for `.to(tl.float8e4nv)`. On the GPU that conversion rounds to nearest even
    itself (tt.fp_to_fp rtne -> cvt.rn.satfinite.e4m3x2.f32), so x goes as it is; the interpreter's
    conversion does not round that way, so there x is rounded first (round_to_e4m3, exact either way)."""
    if HW:
        return x
    else:
        return round_to_e4m3(x)


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
    tl.store(out_ptr + offs, e4m3_ready(y, HW).to(tl.float8e4nv), mask=m)


def scale_from_amax(amax: torch.Tensor, margin: float = 1.0) -> torch.Tensor:
    """fp32 scale(s) = 448 / (amax * margin), 1 where amax == 0 (the one FP8 scale convention of h3plan)."""
    a = amax.float() * margin
    return torch.where(a > 0, torch.full_like(a, E4M3_MAX) / a, torch.ones_like(a))


def quantize_ref(x: torch.Tensor, amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle and fallback: (codes e4m3 shaped like x, descale fp32 0-dim); `amax` (fp32 0-dim) replaces
    x's own when the scale must cover more than x (a sequence split over ranks)."""
    scale = scale_from_amax(x.abs().amax().float() if amax is None else amax)
    codes = (x.float() * scale).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return codes, torch.ones_like(scale) / scale


def quantize_check(x) -> str | None:
    def checks():
        yield from tensor_checks("x", x, (torch.bfloat16, torch.float16))
        yield x.numel() > 0, "x is empty"

    return guard(checks())


def _fake(x):
    return torch.empty_like(x, dtype=E4M3), x.new_empty((), dtype=torch.float32)


def _amax_fake(x):
    return x.new_empty((), dtype=torch.float32)


def _cast_fake(x, amax):
    return _fake(x)


@custom_op("fp8_amax_per_tensor", fake=_amax_fake)
def _amax_op(x: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    grid = (triton.cdiv(n, BLOCK),)
    part = torch.empty(grid[0], device=x.device, dtype=torch.float32)
    _partial_amax_kernel[grid](x, part, n, BLOCK=BLOCK, HW=not INTERPRET, num_warps=8, **LAUNCH_OPTS)
    return part.amax()


@custom_op("fp8_cast_per_tensor", fake=_cast_fake)
def _cast_op(x: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = scale_from_amax(amax)
    out = torch.empty_like(x, dtype=E4M3)
    _cast_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, scale, out, x.numel(), BLOCK=BLOCK, HW=not INTERPRET, num_warps=8,
                                                 **LAUNCH_OPTS)
    return out, torch.ones_like(scale) / scale


def amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| (fp32 0-dim) of a contiguous bf16/fp16 tensor, pass 1 alone; ValueError(reason) on refused inputs."""
    reason = quantize_check(x)
    if reason:
        raise ValueError(reason)
    return torch.ops.h3plan.fp8_amax_per_tensor(x)


def quantize(x: torch.Tensor, amax_fn=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, descale) of a contiguous bf16/fp16 tensor; raises ValueError(reason) on refused inputs.
    `amax_fn(x) -> fp32 0-dim` replaces pass 1 (an amax over the whole sequence across ranks)."""
    reason = quantize_check(x)
    if reason:
        raise ValueError(reason)
    a = torch.ops.h3plan.fp8_amax_per_tensor(x) if amax_fn is None else amax_fn(x)
    return torch.ops.h3plan.fp8_cast_per_tensor(x, a)


# ---------------------------------------------------------------------------------------------- dequantise
@triton.jit
def _dequant_kernel(c_ptr, d_ptr, out_ptr, N, BLOCK: tl.constexpr, IS_BF16: tl.constexpr, HW: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    m = offs < N
    b = tl.load(c_ptr + offs, mask=m, other=0).to(tl.int32)  # e4m3 codes as bytes: s eeee fff
    e = (b >> 3) & 0xF
    f = b & 7
    pow2 = ((e - 10 + 127) << 23).to(tl.float32, bitcast=True)  # 2^(e-10), exact
    mag = tl.where(e == 0, f.to(tl.float32) * 0.001953125, (f + 8).to(tl.float32) * pow2)  # both exact
    # the sign through its bit: Triton's `-x` of +0.0 gives +0.0 on the GPU, and code 0x80 is -0.0
    x = (mag.to(tl.uint32, bitcast=True) | ((b & 0x80).to(tl.uint32) << 24)).to(tl.float32, bitcast=True)
    x = tl.where((e == 15) & (f == 7), float("nan"), x)
    y = round_hw(x * tl.load(d_ptr), IS_BF16, HW)  # one fp32 rounding, then one to the output dtype
    tl.store(out_ptr + offs, from_f32(y, out_ptr.dtype.element_ty, HW), mask=m)


def dequantize_ref(codes: torch.Tensor, descale: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """Oracle and fallback: (codes.float() * descale).to(dtype)."""
    return (codes.float() * descale.float()).to(dtype)


def dequantize_check(codes, descale, dtype=torch.bfloat16) -> str | None:
    def checks():
        yield from tensor_checks("codes", codes, (E4M3,))
        yield isinstance(descale, torch.Tensor) and descale.numel() == 1, "descale must be a one-element tensor"
        yield (descale.dtype == torch.float32 and descale.device == codes.device,
               "descale must be fp32 on the codes' device")
        yield dtype in (torch.bfloat16, torch.float16), f"output dtype {dtype} not in (bf16, fp16)"
        yield codes.numel() > 0, "codes is empty"

    return guard(checks())


@custom_op("fp8_dequantize_per_tensor", fake=lambda codes, descale, half: torch.empty_like(
    codes, dtype=torch.float16 if half else torch.bfloat16))
def _dequantize_op(codes: torch.Tensor, descale: torch.Tensor, half: bool) -> torch.Tensor:
    out = torch.empty_like(codes, dtype=torch.float16 if half else torch.bfloat16)
    n = codes.numel()
    _dequant_kernel[(triton.cdiv(n, BLOCK),)](codes.view(torch.uint8), descale.reshape(1), out, n, BLOCK=BLOCK,
                                               IS_BF16=not half, HW=not INTERPRET, num_warps=8, **LAUNCH_OPTS)
    return out


def dequantize(codes: torch.Tensor, descale: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """(codes.float() * descale).to(dtype) in one pass (1 byte read, 2 written per element), bit-identical
    to `dequantize_ref`; raises ValueError(reason) on inputs `dequantize_check` refuses."""
    reason = dequantize_check(codes, descale, dtype)
    if reason:
        raise ValueError(reason)
    return torch.ops.h3plan.fp8_dequantize_per_tensor(codes, descale, dtype == torch.float16)
