"""NVFP4 codes written by the kernels that produce the block's NVFP4 GEMM inputs (nvfp4_producer_quant).

    rmsnorm_modulate_nvfp4(x, weight, scale, shift, index, eps, mode, global_scale)           # norm1 + AdaLN -> to_q/k/v
    gated_residual_modulate_nvfp4(h, gate, y, weight, scale, shift, index, eps, mode, global_scale)
        # the residual fold: h' = h + gate[index] * y (the attention's gated residual), then norm2 + AdaLN of h'
        # -> ff.net.0.proj; returns h' (bf16, the next residual) with the codes
    swiglu_nvfp4(x, global_scale)                                                             # SwiGLU -> ff.net.2
    (the attention output -> to_out.0: kernels/nvfp4.py `cast_nvfp4`)

Each returns (packed e2m1 uint8 (..., K/2), swizzled e4m3 block scales (flat), g fp32 0-dim) -- kernels/nvfp4.py
explains the format and its quantizer -- and the fold returns h' first. The TRT-LLM seed's residual fold
(docs/sources.md#trtllm-seed, "producer quantize fusion, residual fold") is read here as: the gated residual add
that ends the attention half of the block is folded into the kernel that normalises, modulates and quantizes
the FFN's input, so h' is written once and never read back by a second kernel.

Numerics. y is the producer's bf16 output exactly as its bf16 kernel computes it (kernels/modulation.py in
`exact` or `fp32` mode, kernels/swiglu.py, kernels/gated_residual.py: the same operations in the same order,
the jit helpers of kernels/fp8_producers.py), then kernels/nvfp4.py's quantizer. `<op>_ref` is the unfused
chain: the bf16 reference, then `cast_nvfp4_ref`. Bit-identical to it in the interpreter and on the GPU, except
that modulation's sum of squares follows torch's CUDA order (kernels/_rmsnorm.py), so CPU tests compare against
the CUDA-order emulation. Global scale: given (a checkpoint's input_scale: one pass) or from the output's amax
(a row-amax pass, g on the device, then the quantize pass: the producer computes y twice, reading its inputs
twice; the fold writes h' in the first pass and the second pass reads h').

Fallback: `<op>_check` names the reason an input is refused; the public functions raise ValueError(reason) and
callers route refused inputs to `<op>_ref` (the same bits).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from h3plan.kernels import gated_residual as _gr
from h3plan.kernels import modulation as _mod
from h3plan.kernels import swiglu as _sw
from h3plan.kernels._common import INTERPRET, from_f32, guard, round_hw, tensor_checks
from h3plan.kernels._registry import custom_op
from h3plan.kernels._rmsnorm import VEC, cuda_rms_iters
from h3plan.kernels.fp8_producers import _load_chunk, _modulate_chunk, _swiglu_chunk, chunks, row_rstd
from h3plan.kernels.nvfp4 import (cast_nvfp4_ref, fake_outputs, finish_chunk, two_pass, global_scale_reason,
                                  launch_opts, load_global, outputs, width_checks)
from h3plan.kernels.nvfp4 import E4M3


# ---------------------------------------------------------------------------------------------- modulation (+ fold)
@triton.jit
def _fold_chunk(h_row, gate_row, y_row, out_row, C0: tl.constexpr, W: tl.constexpr, N: tl.constexpr, HW: tl.constexpr):
    """Columns C0..C0+W of h + gate * y, kernels/gated_residual.py's roundings, stored as bf16."""
    p = round_hw(_load_chunk(gate_row, C0, W, N, HW) * _load_chunk(y_row, C0, W, N, HW), True, HW)
    o = round_hw(_load_chunk(h_row, C0, W, N, HW) + p, True, HW)
    cols = C0 + tl.arange(0, W)
    if C0 + W <= N:
        tl.store(out_row + cols, from_f32(o, tl.bfloat16, HW))
    else:
        tl.store(out_row + cols, from_f32(o, tl.bfloat16, HW), mask=cols < N)


@triton.jit
def _modulate_nvfp4_kernel(x_ptr, w_ptr, scale_ptr, shift_ptr, idx_ptr, packed_ptr, sf_ptr, amax_ptr, g_ptr,
                           h_ptr, gate_ptr, y_ptr, S, scale_stride, shift_stride, gate_stride, eps, n_col_tiles,
                           N: tl.constexpr, HAS_W: tl.constexpr, EXACT: tl.constexpr, AMAX_ONLY: tl.constexpr,
                           FOLD: tl.constexpr, NITER: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr,
                           W2: tl.constexpr, W3: tl.constexpr, IEEE_RSQRT: tl.constexpr, HW: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_off = row * N
    idx = tl.load(idx_ptr + row % S)
    x_row = x_ptr + row_off
    if FOLD:  # x_ptr is h' (written here, read back below by this program's threads)
        gate_row = gate_ptr + idx * gate_stride
        _fold_chunk(h_ptr + row_off, gate_row, y_ptr + row_off, x_row, 0, W0, N, HW)
        if W1 > 0:
            _fold_chunk(h_ptr + row_off, gate_row, y_ptr + row_off, x_row, W0, W1, N, HW)
        if W2 > 0:
            _fold_chunk(h_ptr + row_off, gate_row, y_ptr + row_off, x_row, W0 + W1, W2, N, HW)
        if W3 > 0:
            _fold_chunk(h_ptr + row_off, gate_row, y_ptr + row_off, x_row, W0 + W1 + W2, W3, N, HW)
        tl.debug_barrier()
    rstd = row_rstd(x_ptr, row, N, eps, NITER, IEEE_RSQRT, HW)
    sc_row = scale_ptr + idx * scale_stride
    sh_row = shift_ptr + idx * shift_stride
    g, inv_g = load_global(g_ptr)
    a = tl.zeros((1,), tl.float32).sum(axis=0)
    a = finish_chunk(_modulate_chunk(x_row, w_ptr, sc_row, sh_row, rstd, 0, W0, N, HAS_W, EXACT, HW), a, g, inv_g,
                     packed_ptr, sf_ptr, row, n_col_tiles, 0, W0, N, AMAX_ONLY)
    if W1 > 0:
        a = finish_chunk(_modulate_chunk(x_row, w_ptr, sc_row, sh_row, rstd, W0, W1, N, HAS_W, EXACT, HW), a, g,
                         inv_g, packed_ptr, sf_ptr, row, n_col_tiles, W0, W1, N, AMAX_ONLY)
    if W2 > 0:
        a = finish_chunk(_modulate_chunk(x_row, w_ptr, sc_row, sh_row, rstd, W0 + W1, W2, N, HAS_W, EXACT, HW), a, g,
                         inv_g, packed_ptr, sf_ptr, row, n_col_tiles, W0 + W1, W2, N, AMAX_ONLY)
    if W3 > 0:
        a = finish_chunk(_modulate_chunk(x_row, w_ptr, sc_row, sh_row, rstd, W0 + W1 + W2, W3, N, HAS_W, EXACT, HW),
                         a, g, inv_g, packed_ptr, sf_ptr, row, n_col_tiles, W0 + W1 + W2, W3, N, AMAX_ONLY)
    if AMAX_ONLY:
        tl.store(amax_ptr + row, a)


# ---------------------------------------------------------------------------------------------- swiglu
@triton.jit
def _swiglu_nvfp4_kernel(x_ptr, packed_ptr, sf_ptr, amax_ptr, g_ptr, n_col_tiles, F: tl.constexpr,
                         W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr,
                         AMAX_ONLY: tl.constexpr, IS_BF16: tl.constexpr, HW: tl.constexpr, LIBDEVICE_EXP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * (2 * F)
    g, inv_g = load_global(g_ptr)
    a = tl.zeros((1,), tl.float32).sum(axis=0)
    a = finish_chunk(_swiglu_chunk(x_row, 0, W0, F, IS_BF16, HW, LIBDEVICE_EXP), a, g, inv_g, packed_ptr, sf_ptr, row,
                     n_col_tiles, 0, W0, F, AMAX_ONLY)
    if W1 > 0:
        a = finish_chunk(_swiglu_chunk(x_row, W0, W1, F, IS_BF16, HW, LIBDEVICE_EXP), a, g, inv_g, packed_ptr, sf_ptr,
                         row, n_col_tiles, W0, W1, F, AMAX_ONLY)
    if W2 > 0:
        a = finish_chunk(_swiglu_chunk(x_row, W0 + W1, W2, F, IS_BF16, HW, LIBDEVICE_EXP), a, g, inv_g, packed_ptr,
                         sf_ptr, row, n_col_tiles, W0 + W1, W2, F, AMAX_ONLY)
    if W3 > 0:
        a = finish_chunk(_swiglu_chunk(x_row, W0 + W1 + W2, W3, F, IS_BF16, HW, LIBDEVICE_EXP), a, g, inv_g,
                         packed_ptr, sf_ptr, row, n_col_tiles, W0 + W1 + W2, W3, F, AMAX_ONLY)
    if AMAX_ONLY:
        tl.store(amax_ptr + row, a)


# ---------------------------------------------------------------------------------------------- references
def rmsnorm_modulate_nvfp4_ref(x, weight, scale, shift, index, eps=None, mode="exact", global_scale=None):
    """Oracle and fallback: kernels.modulation's reference (eager's sequence), then `cast_nvfp4_ref`."""
    return cast_nvfp4_ref(_mod.rmsnorm_modulate_ref(x, weight, scale, shift, index, eps, mode), global_scale)


def gated_residual_modulate_nvfp4_ref(h, gate, y, weight, scale, shift, index, eps=None, mode="exact",
                                      global_scale=None):
    """Oracle and fallback: h' = the block's gated residual (eager), then `rmsnorm_modulate_nvfp4_ref(h', ...)`."""
    h2 = _gr.gated_residual_ref(h, gate, index, y)
    return (h2, *rmsnorm_modulate_nvfp4_ref(h2, weight, scale, shift, index, eps, mode, global_scale))


def swiglu_nvfp4_ref(x, global_scale=None):
    """Oracle and fallback: diffusers' SwiGLU after its proj (kernels.swiglu's reference), then the cast."""
    return cast_nvfp4_ref(_sw.swiglu_ref(x), global_scale)


# ---------------------------------------------------------------------------------------------- checks
def rmsnorm_modulate_nvfp4_check(x, weight, scale, shift, index, eps=None, mode="exact", global_scale=None) -> str | None:
    """rmsnorm_modulate's own check (same modes, same exact-mode requirements), NVFP4 widths, the global scale."""
    reason = _mod.rmsnorm_modulate_check(x, weight, scale, shift, index, eps, mode)
    return reason or guard(width_checks("x", x.shape[-1])) or global_scale_reason(global_scale, x.device)


def gated_residual_modulate_nvfp4_check(h, gate, y, weight, scale, shift, index, eps=None, mode="exact",
                                        global_scale=None) -> str | None:
    return _gr.gated_residual_check(h, gate, index, y) or rmsnorm_modulate_nvfp4_check(
        h, weight, scale, shift, index, eps, mode, global_scale)


def swiglu_nvfp4_check(x, global_scale=None) -> str | None:
    def checks():
        yield from tensor_checks("x", x, (torch.bfloat16, torch.float16))
        yield x.dim() >= 1 and x.shape[-1] % 2 == 0, f"x last dim {tuple(x.shape)[-1:]} is not even"
        yield from width_checks("output", x.shape[-1] // 2 if x.dim() else 0)
    return guard(checks()) or global_scale_reason(global_scale, x.device)


# ---------------------------------------------------------------------------------------------- launches
def _launch_modulate(x, weight, scale, shift, index, eps, mode, g, fold=None, rsqrt=None):
    """fold: (h, gate, y) -> x is h' and is written by the kernel."""
    B, S, D = x.shape
    M = B * S
    packed, sf, nct = outputs(M, D, (B, S), x.device)
    w = chunks(D)
    eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
    h, gate, y = fold if fold is not None else (x, scale, x)
    common = dict(N=D, HAS_W=weight is not None, EXACT=mode == "exact", NITER=cuda_rms_iters(triton.cdiv(D, VEC) * VEC),
                  W0=w[0], W1=w[1], W2=w[2], W3=w[3], IEEE_RSQRT=(rsqrt or _mod.RSQRT) == "ieee", HW=not INTERPRET,
                  **launch_opts("fold" if fold is not None else "modulation", D))

    def launch(amax_or_g, amax_only):
        # the fold writes h' once: in the amax pass when there is one, else in the quantize pass
        with_fold = fold is not None and (amax_only or g is not None)
        _modulate_nvfp4_kernel[(M,)](
            x, x if weight is None else weight, scale, shift, index, packed, sf, amax_or_g, amax_or_g, h, gate, y,
            S, scale.stride(0), shift.stride(0), gate.stride(0), eps, nct, AMAX_ONLY=amax_only, FOLD=with_fold, **common)

    gb = two_pass(launch, M, g, x.device)
    return packed, sf.view(E4M3), gb.reshape(())


def _launch_swiglu(x, g, exp=None):
    F = x.shape[-1] // 2
    M = x.numel() // (2 * F)
    packed, sf, nct = outputs(M, F, tuple(x.shape[:-1]), x.device)
    w = chunks(F)
    common = dict(F=F, W0=w[0], W1=w[1], W2=w[2], W3=w[3], IS_BF16=x.dtype == torch.bfloat16, HW=not INTERPRET,
                  LIBDEVICE_EXP=(exp or _sw.EXP) == "libdevice" and not INTERPRET, **launch_opts("swiglu", F))
    gb = two_pass(lambda buf, amax_only: _swiglu_nvfp4_kernel[(M,)](x, packed, sf, buf, buf, nct, AMAX_ONLY=amax_only,
                                                                     **common), M, g, x.device)
    return packed, sf.view(E4M3), gb.reshape(())


# ---------------------------------------------------------------------------------------------- custom ops
def _fake_mod(x, *args):
    B, S, D = x.shape
    return fake_outputs(x, B * S, D, (B, S))


@custom_op("rmsnorm_modulate_nvfp4", fake=_fake_mod)
def _modulate_op(x: torch.Tensor, weight: Optional[torch.Tensor], scale: torch.Tensor, shift: torch.Tensor,
                 index: torch.Tensor, eps: Optional[float], mode: str,
                 g: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    reason = rmsnorm_modulate_nvfp4_check(x, weight, scale, shift, index, eps, mode, g)
    if reason is not None:
        raise ValueError(reason)
    return _launch_modulate(x, weight, scale, shift, index, eps, mode, g)


@custom_op("gated_residual_modulate_nvfp4", fake=lambda h, *a: (torch.empty_like(h), *_fake_mod(h)))
def _fold_op(h: torch.Tensor, gate: torch.Tensor, y: torch.Tensor, weight: Optional[torch.Tensor], scale: torch.Tensor,
             shift: torch.Tensor, index: torch.Tensor, eps: Optional[float], mode: str,
             g: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    reason = gated_residual_modulate_nvfp4_check(h, gate, y, weight, scale, shift, index, eps, mode, g)
    if reason is not None:
        raise ValueError(reason)
    h2 = torch.empty_like(h)
    return (h2, *_launch_modulate(h2, weight, scale, shift, index, eps, mode, g, fold=(h, gate, y)))


@custom_op("swiglu_nvfp4", fake=lambda x, g: fake_outputs(x, x.numel() // x.shape[-1], x.shape[-1] // 2,
                                                          tuple(x.shape[:-1])))
def _swiglu_op(x: torch.Tensor, g: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    reason = swiglu_nvfp4_check(x, g)
    if reason is not None:
        raise ValueError(reason)
    return _launch_swiglu(x, g)


# ---------------------------------------------------------------------------------------------- public
def rmsnorm_modulate_nvfp4(x, weight, scale, shift, index, eps=None, mode="exact", global_scale=None):
    """NVFP4 codes of `rmsnorm_modulate(...)` (B, S, D): (packed (B, S, D/2), swizzled scales, g); one pass
    with `global_scale`, two without. ValueError(reason) on inputs the kernel does not take."""
    reason = rmsnorm_modulate_nvfp4_check(x, weight, scale, shift, index, eps, mode, global_scale)
    if reason is not None:
        raise ValueError(reason)
    return torch.ops.h3plan.rmsnorm_modulate_nvfp4(x, weight, scale, shift, index, eps, mode, global_scale)


def gated_residual_modulate_nvfp4(h, gate, y, weight, scale, shift, index, eps=None, mode="exact", global_scale=None):
    """The residual fold: (h' = h + gate[index] * y (bf16, eager's bits), packed, swizzled scales, g) of
    `rmsnorm_modulate(h', ...)`. ValueError(reason) if refused."""
    reason = gated_residual_modulate_nvfp4_check(h, gate, y, weight, scale, shift, index, eps, mode, global_scale)
    if reason is not None:
        raise ValueError(reason)
    return torch.ops.h3plan.gated_residual_modulate_nvfp4(h, gate, y, weight, scale, shift, index, eps, mode, global_scale)


def swiglu_nvfp4(x, global_scale=None):
    """NVFP4 codes of `swiglu(x)` (..., F): (packed (..., F/2), swizzled scales, g); ValueError if refused."""
    reason = swiglu_nvfp4_check(x, global_scale)
    if reason is not None:
        raise ValueError(reason)
    return torch.ops.h3plan.swiglu_nvfp4(x, global_scale)
