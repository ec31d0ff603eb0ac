"""FP8 (e4m3) codes written by the kernels that produce the block's FP8 GEMM inputs, one scale per row.

    rmsnorm_modulate_fp8(x, weight, scale, shift, index, eps, mode, act_scale)  # norm1/2 + AdaLN -> to_q/k/v,
                                                                                # ff.net.0.proj
    swiglu_fp8(x, act_scale)                                                    # hidden * silu(gate) -> ff.net.2
    cast_rows_fp8(x, act_scale)                                                 # attention output -> to_out.0

Each returns (codes e4m3 shaped like the bf16 output, descale fp32 (..., 1): one per row) and feeds a
rowwise-scaled FP8 GEMM (h3plan.runtime.quant.fp8_rowwise) with no amax pass and no cast pass in between.

Numerics. y is the producer's bf16 (fp16) output exactly as its bf16 kernel computes it --
runtime/kernels/modulation.py (exact: eager's rounding points; fp32: one rounding) and runtime/kernels/swiglu.py, the
same operations in the same order (the tests hold the two files together) -- kept in fp32 registers. Then
- per row (act_scale None): amax_r = max |y_r| (NaN if the row holds one, as torch's amax), scale_r =
  448 / amax_r (1 where amax_r is 0 or NaN), descale_r = 1 / scale_r (IEEE divisions): the convention of
  kernels.fp8.scale_from_amax, row by row. A row's scale depends on that row alone, so the codes are the
  same at every Ulysses degree with no all-reduce, and padding rows cannot move anyone's scale;
- static (act_scale, a number from a calibration table): scale = fp32(act_scale) for every row;
codes = e4m3(clamp(y * scale, +-448)), one fp32 multiply, round to nearest even; NaN stays NaN. Against
`<op>_ref` (the bf16 reference, then torch's amax / scale / clamp / `.to(float8_e4m3fn)`) the codes and
descales are bit-identical in the interpreter and on the GPU (explicit rounding helpers, `HW`).

Kernel shape. One program owns one whole row, held in registers as up to four power-of-two
chunks (5376 = 4096 + 1024 + 256, 7168 = 4096 + 2048 + 1024, 14336 = 8192 + 4096 + 2048), so no lane
works on padding, the row amax is a register reduction, and the codes are written without reading the
input again. Modulation still reads x twice, like runtime/kernels/modulation.py: once in torch's CUDA order for
the sum of squares, once (from L1/L2) for the outputs. Memory: modulation and the cast read 2 and write 1
byte per element, SwiGLU reads 4 and writes 1 per output, plus 4 bytes per row.

Fallback: `<op>_check` names the reason an input is refused; the public functions raise
ValueError(reason) and callers route refused inputs to `<op>_ref`.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from h3plan.runtime.kernels import modulation as _mod
from h3plan.runtime.kernels import swiglu as _sw
from h3plan.runtime.kernels._common import INTERPRET, LAUNCH_OPTS, guard, next_pow2, round_hw, tensor_checks, to_f32
from h3plan.runtime.kernels._registry import custom_op
from h3plan.runtime.kernels._rmsnorm import VEC, cuda_rms_iters, cuda_rms_rstd
from h3plan.runtime.kernels.fp8 import E4M3, E4M3_MAX, e4m3_ready, scale_from_amax

MAX_CHUNKS = 4
MAX_WIDTH = 32768  # a whole row lives in registers
# (chunks the row is split into, warps, register cap or None), keyed by row width. Chosen offline from the
# SM90 SASS of each kernel (registers, spills, instructions per element: benchmarks/probes/fp8_producers.py
# --sass); the H200 sweep of the same probe (--sweep) should replace them. SwiGLU's 14336-wide row needs
# 145 registers a thread at 8 warps, one program per SM; capped at 128 (19 spill stores, L1), two fit.
CONFIGS = {
    "modulation": {5376: (4, 4, None)},
    "swiglu": {14336: (4, 8, 128)},
    "cast": {7168: (4, 4, None)},
}
SWEEP_CONFIGS = {
    "modulation": [(4, 4, None), (4, 2, None), (4, 8, None), (1, 4, None), (4, 4, 64)],
    "swiglu": [(4, 8, 128), (4, 8, None), (4, 16, 64), (4, 16, None), (4, 32, None), (1, 16, None)],
    "cast": [(4, 4, None), (4, 2, None), (4, 8, None), (1, 4, None), (4, 4, 64)],
}


def chunks(n: int, max_chunks: int = MAX_CHUNKS) -> tuple[int, int, int, int]:
    """Power-of-two widths covering n: its leading binary digits, the last rounded up (and masked) when n has
    more than max_chunks of them; padded with zeros to four. 5376 -> (4096, 1024, 256, 0)."""
    out, rest = [], int(n)
    while rest and len(out) < max_chunks - 1:
        w = 1 << (rest.bit_length() - 1)
        out.append(w)
        rest -= w
    if rest:
        out.append(next_pow2(rest))
    return tuple(out + [0] * (4 - len(out)))


def _config(kind: str, n: int, config=None) -> tuple[int, dict]:
    """(chunks, launch options) for a row width: `config` (chunks, warps, maxnreg), else CONFIGS, else a default."""
    default = (MAX_CHUNKS, 4 if n <= 8192 else 8 if n <= 16384 else 16, None)
    nchunks, warps, maxnreg = config or CONFIGS[kind].get(n) or default
    opts = dict(LAUNCH_OPTS, num_warps=warps)
    if maxnreg and not INTERPRET:
        opts["maxnreg"] = maxnreg
    return nchunks, opts


# ---------------------------------------------------------------------------------------------- shared jit
# One program per row, the row as 1-D chunks: the row's amax and scale are scalars, so Triton keeps each chunk
# in the layout it was loaded in (a [ROWS] scale broadcast over [ROWS, W] chunks made it convert every chunk
# through shared memory to the smallest chunk's layout: SM90 SASS, benchmarks/probes/fp8_producers.py --sass).
@triton.jit
def _abs_max_bits(o):
    """max |o| of a chunk as int32 bits: NaN bits lie above +inf's, so a NaN wins as in torch's amax, in the
    interpreter and on the GPU alike."""
    return tl.max(o.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=0)


@triton.jit
def _store_codes(out_ptr, row_off, o, sc, C0: tl.constexpr, W: tl.constexpr, N: tl.constexpr, HW: tl.constexpr):
    """codes of o (columns C0..C0+W of a row of width N) = e4m3(clamp(o * scale, +-448))."""
    cols = C0 + tl.arange(0, W)
    z = tl.clamp(o * sc, -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)  # NaN passes, as torch.clamp
    if C0 + W <= N:
        tl.store(out_ptr + row_off + cols, e4m3_ready(z, HW).to(tl.float8e4nv))
    else:
        tl.store(out_ptr + row_off + cols, e4m3_ready(z, HW).to(tl.float8e4nv), mask=cols < N)


@triton.jit
def _finish(out_ptr, desc_ptr, row, out_off, static_scale, o0, o1, o2, o3,
            W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr, N: tl.constexpr,
            DYNAMIC: tl.constexpr, HW: tl.constexpr):
    """The row's scale from the chunks held in registers (o1..o3 unused where their width is 0; padding
    columns hold 0), then its descale and codes."""
    if DYNAMIC:
        a = _abs_max_bits(o0)
        if W1 > 0:
            a = tl.maximum(a, _abs_max_bits(o1))
        if W2 > 0:
            a = tl.maximum(a, _abs_max_bits(o2))
        if W3 > 0:
            a = tl.maximum(a, _abs_max_bits(o3))
        a = a.to(tl.float32, bitcast=True)
        # 448 / amax, 1 where amax is 0 or NaN (`a > 0` fails): scale_from_amax
        sc = tl.where(a > 0.0, tl.math.div_rn(448.0, tl.where(a > 0.0, a, 1.0)), 1.0)
    else:
        sc = static_scale
    tl.store(desc_ptr + row, tl.math.div_rn(1.0, sc))
    _store_codes(out_ptr, out_off, o0, sc, 0, W0, N, HW)
    if W1 > 0:
        _store_codes(out_ptr, out_off, o1, sc, W0, W1, N, HW)
    if W2 > 0:
        _store_codes(out_ptr, out_off, o2, sc, W0 + W1, W2, N, HW)
    if W3 > 0:
        _store_codes(out_ptr, out_off, o3, sc, W0 + W1 + W2, W3, N, HW)


@triton.jit
def rows_rstd(x_ptr, rows, N, eps, NITER: tl.constexpr, ROWS: tl.constexpr, IEEE_RSQRT: tl.constexpr,
              HW: tl.constexpr):
    """[ROWS] 1 / rms of rows `rows` (int64 [ROWS]) of x (N wide): torch's CUDA RMSNorm order (the modulation
    kernel's statistic), or IEEE division and sqrt."""
    return rstd_of(_mod._sumsq_vec(x_ptr, rows * N, rows >= 0, N, NITER, ROWS, HW), N, eps, IEEE_RSQRT)


@triton.jit
def rstd_of(ss, N, eps, IEEE_RSQRT: tl.constexpr):
    """1 / rms from the sums of squares ss: torch's CUDA RMSNorm steps, or IEEE division and sqrt."""
    if IEEE_RSQRT:
        ms = tl.math.div_rn(ss, tl.full(ss.shape, N, tl.float32))
        return tl.math.div_rn(tl.full(ss.shape, 1.0, tl.float32), tl.math.sqrt_rn(ms + eps))
    return cuda_rms_rstd(ss, N, eps)


@triton.jit
def row_rstd(x_ptr, row, N, eps, NITER: tl.constexpr, IEEE_RSQRT: tl.constexpr, HW: tl.constexpr):
    """`rows_rstd` of the one row `row` as a scalar."""
    rstd = rows_rstd(x_ptr, row + tl.arange(0, 1).to(tl.int64), N, eps, NITER, 1, IEEE_RSQRT, HW)
    return tl.sum(rstd, axis=0)  # the one row's value as a scalar (a sum of one element: exact)


@triton.jit
def _load_chunk(ptr, C0: tl.constexpr, W: tl.constexpr, N: tl.constexpr, HW: tl.constexpr):
    """Columns C0..C0+W of a row (0 past N) in fp32."""
    cols = C0 + tl.arange(0, W)
    if C0 + W <= N:
        return to_f32(tl.load(ptr + cols), HW)
    else:
        return to_f32(tl.load(ptr + cols, mask=cols < N, other=0.0), HW)


# ---------------------------------------------------------------------------------------------- modulation
@triton.jit
def _modulate_chunk(x_row, w_ptr, sc_row, sh_row, rstd, C0: tl.constexpr, W: tl.constexpr, N: tl.constexpr,
                    HAS_W: tl.constexpr, EXACT: tl.constexpr, HW: tl.constexpr):
    """Columns C0..C0+W of rmsnorm_modulate's output, bf16 values in fp32 (`modulate_values`)."""
    w = rstd
    if HAS_W:
        w = _load_chunk(w_ptr, C0, W, N, HW)
    return modulate_values(_load_chunk(x_row, C0, W, N, HW), w, _load_chunk(sc_row, C0, W, N, HW),
                           _load_chunk(sh_row, C0, W, N, HW), rstd, HAS_W, EXACT, HW)


@triton.jit
def modulate_values(x, w, sc, sh, rstd, HAS_W: tl.constexpr, EXACT: tl.constexpr, HW: tl.constexpr):
    """rmsnorm_modulate's output from fp32 x, weight, scale and shift values (elementwise), bf16 values in fp32:
    the operations and rounding points of runtime/kernels/modulation.py's `_rmsnorm_modulate_kernel`, in its order."""
    y = rstd * x
    if HAS_W:
        y = w * y
    if EXACT:
        n = round_hw(y, True, HW)
        o = round_hw(n * round_hw(1.0 + sc, True, HW), True, HW) + sh
    else:
        o = y * (1.0 + sc) + sh
    return round_hw(o, True, HW)


@triton.jit
def _modulate_fp8_kernel(x_ptr, w_ptr, scale_ptr, shift_ptr, idx_ptr, out_ptr, desc_ptr,
                         S, scale_stride, shift_stride, eps, static_scale,
                         N: tl.constexpr, HAS_W: tl.constexpr, EXACT: tl.constexpr, DYNAMIC: tl.constexpr,
                         NITER: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr,
                         W3: tl.constexpr, IEEE_RSQRT: tl.constexpr, HW: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_off = row * N
    rstd = row_rstd(x_ptr, row, N, eps, NITER, IEEE_RSQRT, HW)
    idx = tl.load(idx_ptr + row % S)
    x_row = x_ptr + row_off
    sc_row = scale_ptr + idx * scale_stride
    sh_row = shift_ptr + idx * shift_stride
    o0 = _modulate_chunk(x_row, w_ptr, sc_row, sh_row, rstd, 0, W0, N, HAS_W, EXACT, HW)
    o1 = o0
    o2 = o0
    o3 = o0
    if W1 > 0:
        o1 = _modulate_chunk(x_row, w_ptr, sc_row, sh_row, rstd, W0, W1, N, HAS_W, EXACT, HW)
    if W2 > 0:
        o2 = _modulate_chunk(x_row, w_ptr, sc_row, sh_row, rstd, W0 + W1, W2, N, HAS_W, EXACT, HW)
    if W3 > 0:
        o3 = _modulate_chunk(x_row, w_ptr, sc_row, sh_row, rstd, W0 + W1 + W2, W3, N, HAS_W, EXACT, HW)
    _finish(out_ptr, desc_ptr, row, row_off, static_scale, o0, o1, o2, o3, W0, W1, W2, W3, N, DYNAMIC, HW)


# ---------------------------------------------------------------------------------------------- swiglu
@triton.jit
def _swiglu_chunk(x_row, C0: tl.constexpr, W: tl.constexpr, F: tl.constexpr, IS_BF16: tl.constexpr,
                  HW: tl.constexpr, LIBDEVICE_EXP: tl.constexpr):
    """Columns C0..C0+W of hidden * silu(gate) (`swiglu_values`)."""
    return swiglu_values(_load_chunk(x_row, C0, W, F, HW), _load_chunk(x_row + F, C0, W, F, HW), IS_BF16, HW,
                         LIBDEVICE_EXP)


@triton.jit
def swiglu_values(a, g, IS_BF16: tl.constexpr, HW: tl.constexpr, LIBDEVICE_EXP: tl.constexpr):
    """hidden * silu(gate) from fp32 values (elementwise): the operations and roundings of runtime/kernels/swiglu.py."""
    s = round_hw(silu_values(g, LIBDEVICE_EXP), IS_BF16, HW)
    return round_hw(a * s, IS_BF16, HW)


@triton.jit
def silu_values(g, LIBDEVICE_EXP: tl.constexpr):
    """silu(g) in fp32 before its rounding, as runtime/kernels/swiglu.py computes it."""
    if LIBDEVICE_EXP:
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    return tl.where(tl.abs(g) < 1e-30, g * 0.5, tl.math.div_rn(g, 1.0 + e))  # see runtime/kernels/swiglu.py


@triton.jit
def _swiglu_fp8_kernel(x_ptr, out_ptr, desc_ptr, static_scale, F: tl.constexpr,
                       W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr,
                       DYNAMIC: tl.constexpr, IS_BF16: tl.constexpr, HW: tl.constexpr,
                       LIBDEVICE_EXP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * (2 * F)
    o0 = _swiglu_chunk(x_row, 0, W0, F, IS_BF16, HW, LIBDEVICE_EXP)
    o1 = o0
    o2 = o0
    o3 = o0
    if W1 > 0:
        o1 = _swiglu_chunk(x_row, W0, W1, F, IS_BF16, HW, LIBDEVICE_EXP)
    if W2 > 0:
        o2 = _swiglu_chunk(x_row, W0 + W1, W2, F, IS_BF16, HW, LIBDEVICE_EXP)
    if W3 > 0:
        o3 = _swiglu_chunk(x_row, W0 + W1 + W2, W3, F, IS_BF16, HW, LIBDEVICE_EXP)
    _finish(out_ptr, desc_ptr, row, row * F, static_scale, o0, o1, o2, o3, W0, W1, W2, W3, F, DYNAMIC, HW)


# ---------------------------------------------------------------------------------------------- plain cast
@triton.jit
def _cast_rows_kernel(x_ptr, out_ptr, desc_ptr, static_scale, N: tl.constexpr,
                      W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr,
                      DYNAMIC: tl.constexpr, HW: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * N
    o0 = _load_chunk(x_row, 0, W0, N, HW)
    o1 = o0
    o2 = o0
    o3 = o0
    if W1 > 0:
        o1 = _load_chunk(x_row, W0, W1, N, HW)
    if W2 > 0:
        o2 = _load_chunk(x_row, W0 + W1, W2, N, HW)
    if W3 > 0:
        o3 = _load_chunk(x_row, W0 + W1 + W2, W3, N, HW)
    _finish(out_ptr, desc_ptr, row, row * N, static_scale, o0, o1, o2, o3, W0, W1, W2, W3, N, DYNAMIC, HW)


# ---------------------------------------------------------------------------------------------- references
def rows_to_e4m3_ref(y: torch.Tensor, act_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes e4m3 like y, descale fp32 (..., 1)) of a produced bf16/fp16 tensor y: per-row dynamic scales
    (act_scale None) or one static scale, in torch ops (the oracle of every kernel in this file)."""
    yf = y.float()
    if act_scale is None:
        amax = yf.abs().amax(dim=-1, keepdim=True) if y.shape[-1] else yf.new_zeros(y.shape[:-1] + (1,))
        scale = scale_from_amax(amax)
    else:
        scale = torch.full(y.shape[:-1] + (1,), float(act_scale), dtype=torch.float32, device=y.device)
    codes = (yf * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return codes, torch.ones_like(scale) / scale


def rmsnorm_modulate_fp8_ref(x, weight, scale, shift, index, eps=None, mode="exact", act_scale=None):
    """Oracle and fallback: kernels.modulation's reference (eager's sequence), then `rows_to_e4m3_ref`."""
    return rows_to_e4m3_ref(_mod.rmsnorm_modulate_ref(x, weight, scale, shift, index, eps, mode), act_scale)


def swiglu_fp8_ref(x, act_scale=None):
    """Oracle and fallback: diffusers' SwiGLU after its proj (kernels.swiglu's reference), then the cast."""
    return rows_to_e4m3_ref(_sw.swiglu_ref(x), act_scale)


def cast_rows_fp8_ref(x, act_scale=None):
    """Oracle and fallback: x itself, cast."""
    return rows_to_e4m3_ref(x, act_scale)


# ---------------------------------------------------------------------------------------------- checks
def act_scale_reason(act_scale) -> str | None:
    """None when act_scale is None (per-row scales) or a usable static scale: a real number whose fp32
    value is finite and > 0 with a finite reciprocal."""
    if act_scale is None:
        return None
    if isinstance(act_scale, bool) or not isinstance(act_scale, (int, float)):
        return f"static FP8 act_scale must be a number, got {type(act_scale).__name__}"
    try:
        f = float(act_scale)
    except OverflowError:
        f = math.inf
    s = torch.tensor(f, dtype=torch.float32)
    if not (math.isfinite(f) and torch.isfinite(s) and s > 0 and torch.isfinite(1.0 / s)):
        return f"static FP8 act_scale must be finite and > 0 in fp32 (with a finite reciprocal), got {act_scale!r}"
    return None


def _width_checks(name, n):
    yield 0 < n <= MAX_WIDTH, f"{name} row length {n} outside [1, {MAX_WIDTH}] (a whole row lives in registers)"


def rmsnorm_modulate_fp8_check(x, weight, scale, shift, index, eps=None, mode="exact", act_scale=None) -> str | None:
    """rmsnorm_modulate's own check (same modes, same exact-mode requirements) plus the static scale."""
    return _mod.rmsnorm_modulate_check(x, weight, scale, shift, index, eps, mode) or act_scale_reason(act_scale)


def swiglu_fp8_check(x, act_scale=None) -> str | None:
    def checks():
        yield from tensor_checks("x", x, (torch.bfloat16, torch.float16))
        yield x.dim() >= 1 and x.shape[-1] % 2 == 0, f"x last dim {tuple(x.shape)[-1:]} is not even"
        yield from _width_checks("output", x.shape[-1] // 2)
    return guard(checks()) or act_scale_reason(act_scale)


def cast_rows_fp8_check(x, act_scale=None) -> str | None:
    def checks():
        yield from tensor_checks("x", x, (torch.bfloat16, torch.float16))
        yield x.dim() >= 1, "x is 0-dim"
        yield from _width_checks("x", x.shape[-1] if x.dim() else 0)
    return guard(checks()) or act_scale_reason(act_scale)


# ---------------------------------------------------------------------------------------------- launches
def _outputs(y_shape, device):
    codes = torch.empty(y_shape, dtype=E4M3, device=device)
    return codes, torch.empty(tuple(y_shape[:-1]) + (1,), dtype=torch.float32, device=device)


def _static(act_scale):
    return 1.0 if act_scale is None else float(act_scale)


def _launch_modulate(x, weight, scale, shift, index, eps, mode, act_scale, config=None, rsqrt=None):
    B, S, D = x.shape
    codes, desc = _outputs(x.shape, x.device)
    M = B * S
    if M == 0:
        return codes, desc
    nchunks, opts = _config("modulation", D, config)
    w = chunks(D, nchunks)
    eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
    _modulate_fp8_kernel[(M,)](
        x, x if weight is None else weight, scale, shift, index, codes, desc, S, scale.stride(0),
        shift.stride(0), eps, _static(act_scale), N=D, HAS_W=weight is not None, EXACT=mode == "exact",
        DYNAMIC=act_scale is None, NITER=cuda_rms_iters(triton.cdiv(D, VEC) * VEC),
        W0=w[0], W1=w[1], W2=w[2], W3=w[3], IEEE_RSQRT=(rsqrt or _mod.RSQRT) == "ieee", HW=not INTERPRET,
        **opts)
    return codes, desc


def _launch_swiglu(x, act_scale, config=None, exp=None):
    F = x.shape[-1] // 2
    codes, desc = _outputs(x.shape[:-1] + (F,), x.device)
    M = x.numel() // (2 * F) if F else 0
    if M == 0:
        return codes, desc
    nchunks, opts = _config("swiglu", F, config)
    w = chunks(F, nchunks)
    _swiglu_fp8_kernel[(M,)](
        x, codes, desc, _static(act_scale), F=F, W0=w[0], W1=w[1], W2=w[2], W3=w[3],
        DYNAMIC=act_scale is None, IS_BF16=x.dtype == torch.bfloat16, HW=not INTERPRET,
        LIBDEVICE_EXP=(exp or _sw.EXP) == "libdevice" and not INTERPRET, **opts)
    return codes, desc


def _launch_cast(x, act_scale, config=None):
    N = x.shape[-1]
    codes, desc = _outputs(x.shape, x.device)
    M = x.numel() // N if N else 0
    if M == 0:
        return codes, desc
    nchunks, opts = _config("cast", N, config)
    w = chunks(N, nchunks)
    _cast_rows_kernel[(M,)](
        x, codes, desc, _static(act_scale), N=N, W0=w[0], W1=w[1], W2=w[2], W3=w[3],
        DYNAMIC=act_scale is None, HW=not INTERPRET, **opts)
    return codes, desc


# ---------------------------------------------------------------------------------------------- custom ops
def _fake_rows(shape, like):
    return (like.new_empty(shape, dtype=E4M3), like.new_empty(tuple(shape[:-1]) + (1,), dtype=torch.float32))


@custom_op("rmsnorm_modulate_fp8",
           fake=lambda x, weight, scale, shift, index, eps, mode, act_scale: _fake_rows(x.shape, x))
def _modulate_op(x: torch.Tensor, weight: Optional[torch.Tensor], scale: torch.Tensor, shift: torch.Tensor,
                 index: torch.Tensor, eps: Optional[float], mode: str,
                 act_scale: Optional[float]) -> tuple[torch.Tensor, torch.Tensor]:
    reason = rmsnorm_modulate_fp8_check(x, weight, scale, shift, index, eps, mode, act_scale)
    if reason is not None:
        raise ValueError(reason)
    return _launch_modulate(x, weight, scale, shift, index, eps, mode, act_scale)


@custom_op("swiglu_fp8", fake=lambda x, act_scale: _fake_rows(x.shape[:-1] + (x.shape[-1] // 2,), x))
def _swiglu_op(x: torch.Tensor, act_scale: Optional[float]) -> tuple[torch.Tensor, torch.Tensor]:
    reason = swiglu_fp8_check(x, act_scale)
    if reason is not None:
        raise ValueError(reason)
    return _launch_swiglu(x, act_scale)


@custom_op("cast_rows_fp8", fake=lambda x, act_scale: _fake_rows(x.shape, x))
def _cast_op(x: torch.Tensor, act_scale: Optional[float]) -> tuple[torch.Tensor, torch.Tensor]:
    reason = cast_rows_fp8_check(x, act_scale)
    if reason is not None:
        raise ValueError(reason)
    return _launch_cast(x, act_scale)


# ---------------------------------------------------------------------------------------------- public
def _scale_arg(act_scale):
    return None if act_scale is None else float(act_scale)


def rmsnorm_modulate_fp8(x, weight, scale, shift, index, eps=None, mode="exact", act_scale=None):
    """(codes (B, S, D) e4m3, descale (B, S, 1) fp32) of `rmsnorm_modulate(...)` in one pass: per-row
    dynamic scales, or `act_scale` for every row. ValueError(reason) on inputs the kernel does not take."""
    reason = rmsnorm_modulate_fp8_check(x, weight, scale, shift, index, eps, mode, act_scale)
    if reason is not None:
        raise ValueError(reason)
    return torch.ops.h3plan.rmsnorm_modulate_fp8(x, weight, scale, shift, index, eps, mode, _scale_arg(act_scale))


def swiglu_fp8(x, act_scale=None):
    """(codes (..., F) e4m3, descale (..., 1) fp32) of `swiglu(x)` in one pass; ValueError if refused."""
    reason = swiglu_fp8_check(x, act_scale)
    if reason is not None:
        raise ValueError(reason)
    return torch.ops.h3plan.swiglu_fp8(x, _scale_arg(act_scale))


def cast_rows_fp8(x, act_scale=None):
    """(codes like x e4m3, descale (..., 1) fp32) of a contiguous bf16/fp16 tensor in one pass (one read of x,
    no amax pass); ValueError if refused."""
    reason = cast_rows_fp8_check(x, act_scale)
    if reason is not None:
        raise ValueError(reason)
    return torch.ops.h3plan.cast_rows_fp8(x, _scale_arg(act_scale))


# the kernel ops of this module a lever names (SPEC.kernels): op -> (function, its check), read by table.py
OPS = {"rmsnorm_modulate_fp8": ("rmsnorm_modulate_fp8", "rmsnorm_modulate_fp8_check"),
       "swiglu_fp8": ("swiglu_fp8", "swiglu_fp8_check"), "cast_rows_fp8": ("cast_rows_fp8", "cast_rows_fp8_check")}
