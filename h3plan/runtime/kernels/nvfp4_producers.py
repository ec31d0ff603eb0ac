"""NVFP4 codes written by the kernels that produce the block's NVFP4 GEMM inputs (nvfp4_producer_quant).

    rmsnorm_modulate_nvfp4(x, weight, scale, shift, index, eps, mode, global_scale)  # norm1 + AdaLN -> to_q/k/v
    gated_residual_modulate_nvfp4(h, gate, y, weight, scale, shift, index, eps, mode, global_scale)
        # the residual fold: h' = h + gate[index] * y (the attention's gated residual), then norm2 + AdaLN of h'
        # -> ff.net.0.proj; returns h' (bf16, the next residual) with the codes
    swiglu_nvfp4(x, global_scale)                                                    # SwiGLU -> ff.net.2
    (the attention output -> to_out.0: runtime/kernels/nvfp4.py `cast_nvfp4`)

Each returns (packed e2m1 uint8 (..., K/2), swizzled e4m3 block scales (flat), g fp32 0-dim) -- runtime/kernels/nvfp4.py
explains the format and its quantizer -- and the fold returns h' first. The TRT-LLM seed's residual fold
(docs/sources.md#trtllm-seed, "producer quantize fusion, residual fold") is read here as: the gated residual add
that ends the attention half of the block is folded into the kernel that normalises, modulates and quantizes
the FFN's input, so h' is written once and never read back by a second kernel.

Numerics. y is the producer's bf16 output exactly as its bf16 kernel computes it (runtime/kernels/modulation.py in
`exact` or `fp32` mode, runtime/kernels/swiglu.py, runtime/kernels/gated_residual.py: the same operations in the same
order, the jit helpers of runtime/kernels/fp8_producers.py), then runtime/kernels/nvfp4.py's quantizer. `<op>_ref` is
the unfused chain: the bf16 reference, then `cast_nvfp4_ref`. Bit-identical to it in the interpreter and on the GPU,
except that modulation's sum of squares follows torch's CUDA order (runtime/kernels/_rmsnorm.py), so CPU tests compare
against the CUDA-order emulation. Global scale: given (a checkpoint's input_scale: one pass) or from the output's amax
(a row-amax pass, g on the device, then the quantize pass: the producer computes y twice, reading its inputs
twice; the fold writes h' in the first pass and the second pass reads h'; the modulation's row statistic is
stored by the first pass and loaded by the second, not summed again). Launch layouts: runtime/kernels/nvfp4.py
`launch_config`.

Fallback: `<op>_check` names the reason an input is refused; the public functions raise ValueError(reason) and
callers route refused inputs to `<op>_ref` (the same bits).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from h3plan.runtime.kernels import gated_residual as _gr
from h3plan.runtime.kernels import modulation as _mod
from h3plan.runtime.kernels import swiglu as _sw
from h3plan.runtime.kernels._common import INTERPRET, from_f32, guard, round_hw, tensor_checks
from h3plan.runtime.kernels._registry import custom_op
from h3plan.runtime.kernels._rmsnorm import THREADS, VEC, cuda_rms_iters, cuda_rms_tree
from h3plan.runtime.kernels.fp8_producers import modulate_values, rows_rstd, rstd_of, silu_values, swiglu_values
from h3plan.runtime.kernels.nvfp4 import (bf16x2_modulate, bf16x2_mul_add, bf16x2_round_mul, bf16x2_unpack,
                                          cast_nvfp4_ref, fake_outputs, finish_chunk, global_scale_reason, launch_opts,
                                          load_global, load_pairs, load_words, next_chunk, outputs, pair_args,
                                          program_rows, row_base, stride_arg, two_pass, unpack_words, use_bf16x2,
                                          width_checks, word_offsets)
from h3plan.runtime.kernels.nvfp4 import E4M3

_T = tl.constexpr(THREADS)


# ---------------------------------------------------------------------------------------------- modulation (+ fold)
@triton.jit
def _fold_chunk(h_ptr, gate_ptr, gate_base, y_ptr, out_ptr, base, C0, W: tl.constexpr, N: tl.constexpr,
                MASK: tl.constexpr, KIND: tl.constexpr, X2: tl.constexpr, HW: tl.constexpr):
    """Columns C0..C0+W (runtime/kernels/nvfp4.py `load_pairs`) of h + gate * y, runtime/kernels/gated_residual.py's
    roundings, stored as bf16 (two values a word; KIND 0) or one by one (KIND 2). X2: in bf16x2 instructions on the
    words."""
    w = C0 // 2 + word_offsets(W)
    if X2:
        word = _fold_word(load_words(gate_ptr, gate_base, C0, W, N, MASK), load_words(y_ptr, base, C0, W, N, MASK),
                          load_words(h_ptr, base, C0, W, N, MASK), X2, HW)
        if not MASK:
            tl.store(out_ptr + base + w, word)
        else:
            tl.store(out_ptr + base + w, word, mask=w < N // 2)
    else:
        _fold_chunk_f32(h_ptr, gate_ptr, gate_base, y_ptr, out_ptr, base, w, C0, W, N, MASK, KIND, HW)


@triton.jit
def _fold_values(h, gate, y, HW: tl.constexpr):
    """h + gate * y from fp32 values of bf16 elements, runtime/kernels/gated_residual.py's roundings (bf16 values in
    fp32)."""
    return round_hw(h + round_hw(gate * y, True, HW), True, HW)


@triton.jit
def bf16_word(lo, hi):
    """The word of two bf16 values held in fp32 (their bits end in 16 zeros), lo in the low half."""
    return (hi.to(tl.int32, bitcast=True) & -65536) | ((lo.to(tl.int32, bitcast=True) >> 16) & 0xFFFF)


@triton.jit
def _fold_word(gw, yw, hw, X2: tl.constexpr, HW: tl.constexpr):
    """h' words from the gate, y and h words (bf16 pairs): bf16x2 instructions (X2) or the fp32 arithmetic and
    roundings, the same bits."""
    if X2:
        return bf16x2_mul_add(gw, yw, hw)
    gl, gh = bf16x2_unpack(gw)
    yl, yh = bf16x2_unpack(yw)
    hl, hh = bf16x2_unpack(hw)
    return bf16_word(_fold_values(hl, gl, yl, HW), _fold_values(hh, gh, yh, HW))


@triton.jit
def _fold_sumsq(h_ptr, gate_ptr, gate_base, y_ptr, out_ptr, base, N: tl.constexpr, NITER: tl.constexpr,
                ROWS: tl.constexpr, X2: tl.constexpr, HW: tl.constexpr):
    """The fold and the statistic in one pass (bf16 words): h' = h + gate * y as `_fold_chunk` computes it,
    written, and its rows' sums of squares ([ROWS]) with exactly runtime/kernels/modulation.py `_sumsq_vec`'s adds, both
    in torch's RMSNorm load order (thread t the 4-vectors t, t + 128, ...: two words), so h' is not read back for
    the statistic. base, gate_base: (ROWS, 1, 1) word offsets of the rows and of their gate rows."""
    col = tl.arange(0, _T)[:, None] * 2 + tl.arange(0, 2)[None, :]  # [threads, 2 words]
    acc = tl.zeros([ROWS, _T], dtype=tl.float32)
    for j in range(NITER):  # a loop, not unrolled: unrolled, the loads of every trip are hoisted (registers)
        w = col[None, :, :] + j * (_T * 2)  # the tensor first: the interpreter keeps constexpr + tensor a constexpr
        m = w < N // 2
        # h and y are read once (evict first); h' is read back by the quantize loop below (evict last: an L2 hit).
        # H200, Nsight Compute at the planned layout: 225.9 -> 214.6 us, DRAM 77% -> 67% (nvfp4-session11/ncu.md
        # "hints"; the same hint on the plain modulation's statistic loads measured 132.3 -> 134.7 us: not kept)
        word = _fold_word(tl.load(gate_ptr + gate_base + w, mask=m, other=0),
                          tl.load(y_ptr + base + w, mask=m, other=0, eviction_policy="evict_first"),
                          tl.load(h_ptr + base + w, mask=m, other=0, eviction_policy="evict_first"), X2, HW)
        tl.store(out_ptr + base + w, word, mask=m, eviction_policy="evict_last")
        lo, hi = bf16x2_unpack(word)  # lo: the vector's elements 0, 2; hi: 1, 3
        v0, v2 = tl.split(lo)
        v1, v3 = tl.split(hi)
        acc = tl.fma(v0, v0, acc)  # exact squares of bf16 values: the fma rounds as _sumsq_vec's does
        acc = tl.fma(v1, v1, acc)
        acc = tl.fma(v2, v2, acc)
        acc = tl.fma(v3, v3, acc)
    return cuda_rms_tree(acc, ROWS)


@triton.jit
def _fold_chunk_f32(h_ptr, gate_ptr, gate_base, y_ptr, out_ptr, base, w, C0, W: tl.constexpr, N: tl.constexpr,
                    MASK: tl.constexpr, KIND: tl.constexpr, HW: tl.constexpr):
    hl, hh = load_pairs(h_ptr, base, C0, W, N, MASK, KIND, HW)
    gl, gh = load_pairs(gate_ptr, gate_base, C0, W, N, MASK, KIND, HW)
    yl, yh = load_pairs(y_ptr, base, C0, W, N, MASK, KIND, HW)
    lo = _fold_values(hl, gl, yl, HW)
    hi = _fold_values(hh, gh, yh, HW)
    if KIND == 2:  # base counts elements
        e = out_ptr + base + 2 * w
        if not MASK:
            tl.store(e, from_f32(lo, tl.bfloat16, HW))
            tl.store(e + 1, from_f32(hi, tl.bfloat16, HW))
        else:
            tl.store(e, from_f32(lo, tl.bfloat16, HW), mask=w < N // 2)
            tl.store(e + 1, from_f32(hi, tl.bfloat16, HW), mask=w < N // 2)
    else:
        word = bf16_word(lo, hi)
        if not MASK:
            tl.store(out_ptr + base + w, word)
        else:
            tl.store(out_ptr + base + w, word, mask=w < N // 2)


@triton.jit
def _modulate_x(x_ptr, base, w_ptr, sc_ptr, sc_base, sh_ptr, sh_base, rstd, C0, W: tl.constexpr, N: tl.constexpr,
                MASK: tl.constexpr, HAS_W: tl.constexpr, EXACT: tl.constexpr, KIND: tl.constexpr,
                X2: tl.constexpr, HW: tl.constexpr):
    """Columns C0..C0+W of rmsnorm_modulate's output (runtime/kernels/fp8_producers.py `modulate_values`), even and odd
    columns. X2 (exact mode): the fp32 norm products, then the bf16 modulation in bf16x2 instructions on the table
    words."""
    xl, xh = load_pairs(x_ptr, base, C0, W, N, MASK, KIND, HW)
    return _modulate_pairs(xl, xh, w_ptr, sc_ptr, sc_base, sh_ptr, sh_base, rstd, C0, W, N, MASK, HAS_W, EXACT,
                           KIND, X2, HW)


@triton.jit
def _modulate_pairs(xl, xh, w_ptr, sc_ptr, sc_base, sh_ptr, sh_base, rstd, C0, W: tl.constexpr, N: tl.constexpr,
                    MASK: tl.constexpr, HAS_W: tl.constexpr, EXACT: tl.constexpr, KIND: tl.constexpr,
                    X2: tl.constexpr, HW: tl.constexpr):
    """`_modulate_x` from x's (even, odd) fp32 values."""
    wl = rstd
    wh = rstd
    if HAS_W:
        # loaded as a (ROWS, ...) tile, each row's threads the same words (L1 hits): a (W // 16, 2, 4) load gets a
        # layout of Triton's choosing and two conversions through shared memory a chunk, behind four barriers
        wl, wh = load_pairs(w_ptr, tl.zeros_like(sc_base), C0, W, N, MASK, KIND, HW)
    if X2 and EXACT:
        yl = rstd * xl
        yh = rstd * xh
        if HAS_W:
            yl = wl * yl
            yh = wh * yh
        return bf16x2_unpack(bf16x2_modulate(yl, yh, load_words(sc_ptr, sc_base, C0, W, N, MASK),
                                             load_words(sh_ptr, sh_base, C0, W, N, MASK)))
    scl, sch = load_pairs(sc_ptr, sc_base, C0, W, N, MASK, KIND, HW)
    shl, shh = load_pairs(sh_ptr, sh_base, C0, W, N, MASK, KIND, HW)
    return (modulate_values(xl, wl, scl, shl, rstd, HAS_W, EXACT, HW),
            modulate_values(xh, wh, sch, shh, rstd, HAS_W, EXACT, HW))


@triton.jit
def _modulate_chunk(x_ptr, base, w_ptr, sc_ptr, sc_base, sh_ptr, sh_base, rstd, a, g, inv_g, packed_ptr, sf_ptr, rows,
                    n_col_tiles, C0, W: tl.constexpr, N: tl.constexpr, MASK: tl.constexpr, HAS_W: tl.constexpr,
                    EXACT: tl.constexpr, KIND: tl.constexpr, X2: tl.constexpr, AMAX_ONLY: tl.constexpr,
                    HW: tl.constexpr):
    lo, hi = _modulate_x(x_ptr, base, w_ptr, sc_ptr, sc_base, sh_ptr, sh_base, rstd, C0, W, N, MASK, HAS_W, EXACT,
                            KIND, X2, HW)
    return finish_chunk(lo, hi, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, C0, W, N, MASK, AMAX_ONLY, HW)


@triton.jit
def _modulate_words(u, w_ptr, sc_ptr, sc_base, sh_ptr, sh_base, rstd, a, g, inv_g, packed_ptr, sf_ptr, rows,
                    n_col_tiles, C0, W: tl.constexpr, N: tl.constexpr, HAS_W: tl.constexpr, EXACT: tl.constexpr,
                    KIND: tl.constexpr, X2: tl.constexpr, AMAX_ONLY: tl.constexpr, HW: tl.constexpr):
    """`_modulate_chunk` of a full chunk whose x words u are already loaded."""
    xl, xh = unpack_words(u, KIND)
    lo, hi = _modulate_pairs(xl, xh, w_ptr, sc_ptr, sc_base, sh_ptr, sh_base, rstd, C0, W, N, False, HAS_W, EXACT,
                             KIND, X2, HW)
    return finish_chunk(lo, hi, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, C0, W, N, False, AMAX_ONLY, HW)


@triton.jit
def _modulate_nvfp4_kernel(x_ptr, xw_ptr, w_ptr, scale_ptr, shift_ptr, idx_ptr, packed_ptr, sf_ptr, amax_ptr, g_ptr,
                           rstd_ptr, h_ptr, gate_ptr, y_ptr, M, S, scale_stride, shift_stride, gate_stride, eps,
                           n_col_tiles, N: tl.constexpr, HAS_W: tl.constexpr, EXACT: tl.constexpr,
                           AMAX_ONLY: tl.constexpr, FOLD: tl.constexpr, RSTD: tl.constexpr, NITER: tl.constexpr,
                           ROWS: tl.constexpr, CH: tl.constexpr, NFULL: tl.constexpr, T0: tl.constexpr,
                           T1: tl.constexpr, T2: tl.constexpr, PREFETCH: tl.constexpr, KIND: tl.constexpr,
                           X2: tl.constexpr, IEEE_RSQRT: tl.constexpr, HW: tl.constexpr):
    """x_ptr: x (bf16 elements, the statistic's loads); xw_ptr, w_ptr, scale_ptr, shift_ptr, h_ptr, gate_ptr, y_ptr:
    as `pair_args` gives them (KIND), the strides as `stride_arg` does. ROWS rows a program in `row_plan`'s chunks.
    RSTD 0: the rows' statistic computed; 1: computed and stored to rstd_ptr (the amax pass); 2: loaded from it (the
    quantize pass after that amax pass: the same bits, the sum of squares not read and reduced again)."""
    rows = program_rows(M, ROWS)
    base = row_base(rows[:, None, None, None], N, KIND)
    idx1 = tl.load(idx_ptr + rows.to(tl.int32) % S)  # 32-bit: no 64-bit remainder call (M < 2^31)
    idx = idx1[:, None, None, None]
    FUSED: tl.constexpr = FOLD and KIND == 0 and RSTD < 2  # the fold and the statistic in one pass (`_fold_sumsq`)
    if FUSED:  # xw_ptr is h' (written here, read back below by this program's threads)
        ss = _fold_sumsq(h_ptr, gate_ptr, (idx1 * gate_stride)[:, None, None], y_ptr, xw_ptr,
                         (rows * (N // 2))[:, None, None], N, NITER, ROWS, X2, HW)
        tl.debug_barrier()
    elif FOLD:  # xw_ptr is h' (written here, read back below by this program's threads)
        gate_base = idx * gate_stride
        for i in range(NFULL):  # a loop, not unrolled: compile time and code size
            _fold_chunk(h_ptr, gate_ptr, gate_base, y_ptr, xw_ptr, base, i * CH, CH, N, False, KIND, X2, HW)
        if T0 > 0:
            _fold_chunk(h_ptr, gate_ptr, gate_base, y_ptr, xw_ptr, base, NFULL * CH, T0, N, NFULL * CH + T0 > N, KIND,
                        X2, HW)
        if T1 > 0:
            _fold_chunk(h_ptr, gate_ptr, gate_base, y_ptr, xw_ptr, base, NFULL * CH + T0, T1, N,
                        NFULL * CH + T0 + T1 > N, KIND, X2, HW)
        if T2 > 0:
            _fold_chunk(h_ptr, gate_ptr, gate_base, y_ptr, xw_ptr, base, NFULL * CH + T0 + T1, T2, N,
                        NFULL * CH + T0 + T1 + T2 > N, KIND, X2, HW)
        tl.debug_barrier()
    if RSTD == 2:
        rstd = tl.load(rstd_ptr + rows)
    elif FUSED:
        rstd = rstd_of(ss, N, eps, IEEE_RSQRT)
        if RSTD == 1:
            tl.store(rstd_ptr + rows, rstd)
    else:
        rstd = rows_rstd(x_ptr, rows, N, eps, NITER, ROWS, IEEE_RSQRT, HW)
        if RSTD == 1:
            tl.store(rstd_ptr + rows, rstd)
    rstd = rstd[:, None, None, None]
    sc_base = idx * scale_stride
    sh_base = idx * shift_stride
    g, inv_g = load_global(g_ptr)
    a = tl.zeros((ROWS,), tl.float32)
    if PREFETCH and KIND != 2 and NFULL > 0:  # chunk i + 1's x words loaded first (nvfp4.py _cast_kernel)
        u = load_words(xw_ptr, base, 0, CH, N, False)
        for i in range(NFULL):  # a loop, not unrolled: compile time and code size
            nxt = load_words(xw_ptr, base, next_chunk(i, NFULL, CH), CH, N, False)
            a = _modulate_words(u, w_ptr, scale_ptr, sc_base, shift_ptr, sh_base, rstd, a, g, inv_g, packed_ptr,
                                sf_ptr, rows, n_col_tiles, i * CH, CH, N, HAS_W, EXACT, KIND, X2, AMAX_ONLY, HW)
            u = nxt
    else:
        for i in range(NFULL):
            a = _modulate_chunk(xw_ptr, base, w_ptr, scale_ptr, sc_base, shift_ptr, sh_base, rstd, a, g, inv_g,
                                packed_ptr, sf_ptr, rows, n_col_tiles, i * CH, CH, N, False, HAS_W, EXACT, KIND, X2,
                                AMAX_ONLY, HW)
    if T0 > 0:
        a = _modulate_chunk(xw_ptr, base, w_ptr, scale_ptr, sc_base, shift_ptr, sh_base, rstd, a, g, inv_g,
                            packed_ptr, sf_ptr, rows, n_col_tiles, NFULL * CH, T0, N, NFULL * CH + T0 > N, HAS_W,
                            EXACT, KIND, X2, AMAX_ONLY, HW)
    if T1 > 0:
        a = _modulate_chunk(xw_ptr, base, w_ptr, scale_ptr, sc_base, shift_ptr, sh_base, rstd, a, g, inv_g,
                            packed_ptr, sf_ptr, rows, n_col_tiles, NFULL * CH + T0, T1, N, NFULL * CH + T0 + T1 > N,
                            HAS_W, EXACT, KIND, X2, AMAX_ONLY, HW)
    if T2 > 0:
        a = _modulate_chunk(xw_ptr, base, w_ptr, scale_ptr, sc_base, shift_ptr, sh_base, rstd, a, g, inv_g,
                            packed_ptr, sf_ptr, rows, n_col_tiles, NFULL * CH + T0 + T1, T2, N,
                            NFULL * CH + T0 + T1 + T2 > N, HAS_W, EXACT, KIND, X2, AMAX_ONLY, HW)
    if AMAX_ONLY:
        tl.store(amax_ptr + rows, a)


# ---------------------------------------------------------------------------------------------- swiglu
@triton.jit
def _swiglu_chunk(x_ptr, base, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, C0, W: tl.constexpr,
                  F: tl.constexpr, MASK: tl.constexpr, KIND: tl.constexpr, X2: tl.constexpr, AMAX_ONLY: tl.constexpr,
                  IS_BF16: tl.constexpr, HW: tl.constexpr, LIBDEVICE_EXP: tl.constexpr):
    """Columns C0..C0+W of hidden * silu(gate) (runtime/kernels/fp8_producers.py `swiglu_values`), then
    `finish_chunk`."""
    gate = base + row_base(1, F, KIND)  # the gate half's row
    lo, hi = _swiglu_cols(x_ptr, base, gate, C0, W, F, MASK, KIND, X2, IS_BF16, HW, LIBDEVICE_EXP)
    return finish_chunk(lo, hi, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, C0, W, F, MASK, AMAX_ONLY, HW)


@triton.jit
def _swiglu_cols(x_ptr, base, gate, C0, W: tl.constexpr, F: tl.constexpr, MASK: tl.constexpr,
                 KIND: tl.constexpr, X2: tl.constexpr, IS_BF16: tl.constexpr, HW: tl.constexpr,
                 LIBDEVICE_EXP: tl.constexpr):
    """Columns C0..C0+W of hidden * silu(gate), even and odd columns. X2: silu in fp32 as `swiglu_values`, then its bf16
    rounding and the product with the hidden words in bf16x2 instructions."""
    gl, gh = load_pairs(x_ptr, gate, C0, W, F, MASK, KIND, HW)
    if X2:
        return bf16x2_unpack(bf16x2_round_mul(silu_values(gl, LIBDEVICE_EXP), silu_values(gh, LIBDEVICE_EXP),
                                              load_words(x_ptr, base, C0, W, F, MASK)))
    al, ah = load_pairs(x_ptr, base, C0, W, F, MASK, KIND, HW)
    return swiglu_values(al, gl, IS_BF16, HW, LIBDEVICE_EXP), swiglu_values(ah, gh, IS_BF16, HW, LIBDEVICE_EXP)


@triton.jit
def _swiglu_words(gw, hw, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, C0, W: tl.constexpr, F: tl.constexpr,
                  KIND: tl.constexpr, X2: tl.constexpr, AMAX_ONLY: tl.constexpr, IS_BF16: tl.constexpr,
                  HW: tl.constexpr, LIBDEVICE_EXP: tl.constexpr):
    """`_swiglu_chunk` of a full chunk whose gate (gw) and hidden (hw) words are already loaded."""
    lo, hi = _swiglu_pairs(gw, hw, KIND, X2, IS_BF16, HW, LIBDEVICE_EXP)
    return finish_chunk(lo, hi, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, C0, W, F, False, AMAX_ONLY, HW)


@triton.jit
def _swiglu_pairs(gw, hw, KIND: tl.constexpr, X2: tl.constexpr, IS_BF16: tl.constexpr, HW: tl.constexpr,
                  LIBDEVICE_EXP: tl.constexpr):
    """`_swiglu_cols` from the gate's and the hidden's words."""
    gl, gh = unpack_words(gw, KIND)
    if X2:
        return bf16x2_unpack(bf16x2_round_mul(silu_values(gl, LIBDEVICE_EXP), silu_values(gh, LIBDEVICE_EXP), hw))
    al, ah = unpack_words(hw, KIND)
    return swiglu_values(al, gl, IS_BF16, HW, LIBDEVICE_EXP), swiglu_values(ah, gh, IS_BF16, HW, LIBDEVICE_EXP)


@triton.jit
def _swiglu_nvfp4_kernel(x_ptr, packed_ptr, sf_ptr, amax_ptr, g_ptr, M, n_col_tiles, F: tl.constexpr,
                         ROWS: tl.constexpr, CH: tl.constexpr, NFULL: tl.constexpr, T0: tl.constexpr,
                         T1: tl.constexpr, T2: tl.constexpr, PREFETCH: tl.constexpr, KIND: tl.constexpr,
                         X2: tl.constexpr, AMAX_ONLY: tl.constexpr, IS_BF16: tl.constexpr, HW: tl.constexpr,
                         LIBDEVICE_EXP: tl.constexpr):
    rows = program_rows(M, ROWS)
    base = row_base(rows[:, None, None, None], 2 * F, KIND)
    g, inv_g = load_global(g_ptr)
    a = tl.zeros((ROWS,), tl.float32)
    if PREFETCH and KIND != 2 and NFULL > 0:  # chunk i + 1's words loaded first (runtime/kernels/nvfp4.py _cast_kernel)
        gate = base + row_base(1, F, KIND)
        gw = load_words(x_ptr, gate, 0, CH, F, False)
        hw = load_words(x_ptr, base, 0, CH, F, False)
        for i in range(NFULL):  # a loop, not unrolled: compile time and code size
            c = next_chunk(i, NFULL, CH)
            ngw = load_words(x_ptr, gate, c, CH, F, False)
            nhw = load_words(x_ptr, base, c, CH, F, False)
            a = _swiglu_words(gw, hw, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, i * CH, CH, F, KIND, X2,
                              AMAX_ONLY, IS_BF16, HW, LIBDEVICE_EXP)
            gw = ngw
            hw = nhw
    else:
        for i in range(NFULL):
            a = _swiglu_chunk(x_ptr, base, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, i * CH, CH, F, False,
                              KIND, X2, AMAX_ONLY, IS_BF16, HW, LIBDEVICE_EXP)
    if T0 > 0:
        a = _swiglu_chunk(x_ptr, base, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, NFULL * CH, T0, F,
                          NFULL * CH + T0 > F, KIND, X2,
                          AMAX_ONLY, IS_BF16, HW, LIBDEVICE_EXP)
    if T1 > 0:
        a = _swiglu_chunk(x_ptr, base, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, NFULL * CH + T0, T1, F,
                          NFULL * CH + T0 + T1 > F, KIND, X2, AMAX_ONLY, IS_BF16, HW, LIBDEVICE_EXP)
    if T2 > 0:
        a = _swiglu_chunk(x_ptr, base, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, NFULL * CH + T0 + T1, T2, F,
                          NFULL * CH + T0 + T1 + T2 > F, KIND, X2, AMAX_ONLY, IS_BF16, HW, LIBDEVICE_EXP)
    if AMAX_ONLY:
        tl.store(amax_ptr + rows, a)


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
def rmsnorm_modulate_nvfp4_check(x, weight, scale, shift, index, eps=None, mode="exact",
                                 global_scale=None) -> str | None:
    """rmsnorm_modulate's own check (same modes, same exact-mode requirements), NVFP4 widths, the global scale."""
    reason = _mod.rmsnorm_modulate_check(x, weight, scale, shift, index, eps, mode)
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    return (reason or guard(width_checks("x", x.shape[-1])) or global_scale_reason(global_scale, x.device)
            or (f"x has {rows} rows, at least 2^31 (the kernel indexes rows in 32 bits)" if rows >= 2 ** 31 else None))


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
    eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
    h, gate, y = fold if fold is not None else (x, scale, x)
    *words, kind = pair_args(x, x if weight is None else weight, scale, shift, h, gate, y)
    rows, opts = launch_opts("fold" if fold is not None else "modulation", D)
    common = dict(N=D, HAS_W=weight is not None, EXACT=mode == "exact", NITER=cuda_rms_iters(triton.cdiv(D, VEC) * VEC),
                  KIND=kind, X2=use_bf16x2(kind), IEEE_RSQRT=(rsqrt or _mod.RSQRT) == "ieee", HW=not INTERPRET, **opts)
    # dynamic: the amax pass stores each row's statistic, the quantize pass loads it (RSTD 1, 2)
    rstd = torch.empty(M if g is None else 0, dtype=torch.float32, device=x.device)

    def launch(amax_or_g, amax_only):
        # the fold writes h' once: in the amax pass when there is one, else in the quantize pass
        with_fold = fold is not None and (amax_only or g is not None)
        xw, wt, sc, sh, hw, gw, yw = words
        _modulate_nvfp4_kernel[(triton.cdiv(M, rows),)](
            x, xw, wt, sc, sh, index, packed, sf, amax_or_g, amax_or_g, rstd if g is None else amax_or_g, hw, gw, yw,
            M, S, stride_arg(scale.stride(0), kind), stride_arg(shift.stride(0), kind),
            stride_arg(gate.stride(0), kind), eps, nct, AMAX_ONLY=amax_only, FOLD=with_fold,
            RSTD=0 if g is not None else 1 if amax_only else 2, **common)

    gb = two_pass(launch, M, g, x.device)
    return packed, sf.view(E4M3), gb.reshape(())


def _launch_swiglu(x, g, exp=None):
    F = x.shape[-1] // 2
    M = x.numel() // (2 * F)
    packed, sf, nct = outputs(M, F, tuple(x.shape[:-1]), x.device)
    xw, kind = pair_args(x)
    rows, opts = launch_opts("swiglu", F)
    common = dict(F=F, KIND=kind, X2=use_bf16x2(kind), IS_BF16=x.dtype == torch.bfloat16,
                  HW=not INTERPRET, LIBDEVICE_EXP=(exp or _sw.EXP) == "libdevice" and not INTERPRET, **opts)
    grid = (triton.cdiv(M, rows),)
    gb = two_pass(lambda buf, amax_only: _swiglu_nvfp4_kernel[grid](xw, packed, sf, buf, buf, M, nct,
                                                                     AMAX_ONLY=amax_only, **common), M, g, x.device)
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
    return torch.ops.h3plan.gated_residual_modulate_nvfp4(h, gate, y, weight, scale, shift, index, eps, mode,
                                                          global_scale)


def swiglu_nvfp4(x, global_scale=None):
    """NVFP4 codes of `swiglu(x)` (..., F): (packed (..., F/2), swizzled scales, g); ValueError if refused."""
    reason = swiglu_nvfp4_check(x, global_scale)
    if reason is not None:
        raise ValueError(reason)
    return torch.ops.h3plan.swiglu_nvfp4(x, global_scale)


# the kernel ops of this module a lever names (SPEC.kernels): op -> (function, its check), read by table.py
OPS = {"rmsnorm_modulate_nvfp4": ("rmsnorm_modulate_nvfp4", "rmsnorm_modulate_nvfp4_check"),
       "gated_residual_modulate_nvfp4": ("gated_residual_modulate_nvfp4", "gated_residual_modulate_nvfp4_check"),
       "swiglu_nvfp4": ("swiglu_nvfp4", "swiglu_nvfp4_check")}
