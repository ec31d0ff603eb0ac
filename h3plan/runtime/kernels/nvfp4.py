"""NVFP4: the one home of the format, its torch reference quantizer and the one-pass Triton cast.

    cast_nvfp4(x, global_scale=None) -> (packed uint8 (..., K/2), block scales e4m3 swizzled (flat), g fp32 0-dim)

Format (NVIDIA NVFP4, as torch's float4_e2m1fn_x2 and torch._scaled_mm on SM100 take it): e2m1 codes (magnitudes
0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 the sign), two a byte, element 2i in the low nibble; one e4m3 scale per 16
consecutive values along K; one fp32 global scale g per tensor. The block scales are stored in cuBLAS's
swizzled layout: 128 x 4 tiles (rows x scale columns) in row-major tile order, row r of a tile at byte
(r % 32) * 16 + (r // 32) * 4 (+ column), zero padding to whole tiles (torchao's `to_blocked`, pytorch's
test_scaled_matmul_cuda.py `to_blocked`).

Quantizer (`quantize_ref`), torchao 0.18's `nvfp4_quantize` with a per-tensor scale, operation for operation:
    g   = amax(x) / (448 * 6)                     (torchao per_tensor_amax_to_scale; 1 where amax is 0, below)
    s_b = e4m3(clamp((amax_b / 6) / g, 2^-6, 448)) (two IEEE divisions; e4m3 round to nearest even)
    v   = clamp(x * ((1 / g) / s_b), -6, 6)       (the reciprocal multiply of torchao, MSLK and TRT-LLM)
    code = e2m1 round to nearest, ties to the even code, sign from v's sign bit (-0.0 and negative values
           that round to 0 give code 8, as the hardware cvt.rn.satfinite.e2m1x2.f32 and torchao's
           _f32_to_floatx_unpacked do)
Scales clamp below at 2^-6 = torch.finfo(float8_e4m3fn).tiny like torchao (no subnormal scale is emitted:
a tiny block next to a large one loses its low bits rather than take a subnormal scale; TRT-LLM's
cvt_warp_fp16_to_fp4 does not clamp below and uses approximate reciprocals: docs/numerics.md). Deviation from torchao:
an all-zero tensor gets g = 1 (torchao divides by a zero per-tensor scale and writes NaN scales). Non-finite
inputs are outside the contract. Dequantize: value(code) * s_b * g.

Kernel numerics: fp32 math with correctly rounded divisions (`div_rn`, per block only), the e2m1 rounding in
integer and one-fma arithmetic (`e2m1_code`: a multiply, a clamp and a few integer ops per element, no compare
chain), the e4m3 scale by the hardware conversion on the GPU and `round_to_e4m3` in the interpreter (the same
bits), so both give the bits of `quantize_ref`; products are single multiplies (no FMA question; the one fma of
`e2m1_code` has an exact product). One program owns ROWS rows (`program_rows`; lanes past the last row repeat it)
and walks them in chunks (`row_plan`: a loop of CH-column chunks, then up to three power-of-two tails of whole
64-column groups, the last masked), each held as (ROWS, W/16, 2, 4) tiles of even and odd elements read from int32
words (`load_pairs`): a thread holds 16 contiguous bytes of input, its neighbour the next 16, so loads and code
stores are whole sectors; a block's two threads reduce its amax with one shuffle and both compute its scale, and
the scale bytes are stored from the reduction's layout (`store_bytes`), so no chunk goes through shared memory.
Where the layout says so, the full-chunk loop loads chunk i + 1 before it computes chunk i. The launch layout
(rows, warps, chunk, prefetch) per kernel and width is `launch_config` (TUNED, from the H200 probe). With a given
global scale the cast is one pass; without, a row-amax pass, g on the device (no host sync), then the cast pass.
Refused inputs (`cast_nvfp4_check`) go to `cast_nvfp4_ref`.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from h3plan.runtime.kernels._common import INTERPRET, LAUNCH_OPTS, guard, tensor_checks, to_f32
from h3plan.runtime.kernels._registry import custom_op
from h3plan.runtime.kernels.fp8 import E4M3, E4M3_MAX, round_to_e4m3
from h3plan.runtime.kernels.fp8_producers import MAX_WIDTH, chunks

BLOCK = 16  # values per e4m3 block scale
E2M1_MAX = 6.0
E4M3_TINY = 2.0 ** -6  # torch.finfo(torch.float8_e4m3fn).tiny: torchao's lower clamp of the block scales
GLOBAL_DIV = E4M3_MAX * E2M1_MAX  # 2688: g = amax / 2688 lets a block scale reach 448 when amax_b = amax
TILE_ROWS, TILE_COLS = 128, 4  # a swizzled scale tile: 128 rows x 4 scale columns, 512 bytes
_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# e2m1 magnitude code of |v| = number of thresholds passed; ">" at a midpoint whose lower neighbour has the even
# code (0.25, 1.25, 2.5, 5), ">=" where the upper one has (0.75, 1.75, 3.5): round to nearest, ties to even
_UP = (0.25, 1.25, 2.5, 5.0)
_UP_EQ = (0.75, 1.75, 3.5)


# ---------------------------------------------------------------------------------------------- torch reference
def global_scale(amax: torch.Tensor) -> torch.Tensor:
    """fp32 g = amax / 2688 (torchao per_tensor_amax_to_scale), 1 where amax is 0."""
    a = amax.float()
    return torch.where(a > 0, a / GLOBAL_DIV, torch.ones_like(a))


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 of fp32 values already clamped to [-6, 6] (see the module docstring)."""
    a = v.abs()
    mag = sum((a > t).to(torch.uint8) for t in _UP) + sum((a >= t).to(torch.uint8) for t in _UP_EQ)
    sign = ((v.view(torch.int32) >> 31) & 1).to(torch.uint8)
    return mag | (sign << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    grid = torch.tensor(_GRID, dtype=torch.float32, device=codes.device)
    mag = grid[(codes & 7).long()]
    return torch.where((codes & 8) > 0, -mag, mag)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """(..., K) codes -> (..., K/2) bytes, element 2i in the low nibble (float4_e2m1fn_x2)."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def blocked_numel(rows: int, cols: int) -> int:
    """Entries of the swizzled layout of a (rows, cols) scale matrix: whole 128 x 4 tiles."""
    return -(-rows // TILE_ROWS) * TILE_ROWS * -(-cols // TILE_COLS) * TILE_COLS


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """(rows, cols) block scales -> the flat swizzled layout (module docstring), zero padding."""
    rows, cols = scales.shape
    rt, ct = -(-rows // TILE_ROWS), -(-cols // TILE_COLS)
    padded = torch.zeros((rt * TILE_ROWS, ct * TILE_COLS), dtype=scales.dtype, device=scales.device)
    padded[:rows, :cols] = scales
    return padded.view(rt, 4, 32, ct, 4).permute(0, 3, 2, 1, 4).reshape(-1)


def from_blocked(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The inverse of `to_blocked`: the (rows, cols) scales."""
    rt, ct = -(-rows // TILE_ROWS), -(-cols // TILE_COLS)
    return flat.view(rt, ct, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(rt * TILE_ROWS, ct * TILE_COLS)[:rows, :cols]


def quantize_ref(x: torch.Tensor, g: torch.Tensor | None = None):
    """x (..., K), K % 16 == 0 -> (packed uint8 (..., K/2), block scales e4m3 (..., K/16), g fp32 0-dim):
    torchao's two-level quantizer (module docstring); g from x's amax when not given."""
    if x.shape[-1] % BLOCK:
        raise ValueError(f"NVFP4 needs the last dim divisible by {BLOCK}, got {x.shape[-1]}")
    xf = x.detach().float()
    g = global_scale(xf.abs().amax() if xf.numel() else xf.new_zeros(())) if g is None else g.float().reshape(())
    blocks = xf.unflatten(-1, (-1, BLOCK))
    bs = ((blocks.abs().amax(-1) / E2M1_MAX) / g).clamp(E4M3_TINY, E4M3_MAX).to(E4M3)
    r = (1.0 / g) / bs.float()
    v = (blocks * r[..., None]).clamp(-E2M1_MAX, E2M1_MAX)
    return pack(e2m1_codes(v).flatten(-2)), bs, g


def dequantize_ref(packed: torch.Tensor, block_scales: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 value(code) * s_b (* g when given); block_scales (..., K/16) in the linear layout."""
    vals = e2m1_values(unpack(packed)).unflatten(-1, (-1, BLOCK))
    out = (vals * block_scales.float()[..., None]).flatten(-2)
    return out if g is None else out * g.float()


def cast_nvfp4_ref(x: torch.Tensor, global_scale: torch.Tensor | None = None):
    """Oracle and fallback of `cast_nvfp4`: (packed (..., K/2), swizzled scales e4m3 (flat), g fp32 0-dim)."""
    K = x.shape[-1]
    packed, bs, g = quantize_ref(x, global_scale)
    return packed, to_blocked(bs.reshape(-1, K // BLOCK)), g


# ---------------------------------------------------------------------------------------------- jit pieces
# A chunk of W columns (W a power of two >= 64) of ROWS rows is held as two fp32 tiles of shape (ROWS, W // 16, 2, 4)
# (`word_offsets` gives the column part; the row bases broadcast over it): block b, half h (its first or last eight
# elements), word j of the half, each word two 16-bit elements (even: `lo`, odd: `hi`). The words of a chunk are
# contiguous in that order, and Triton gives each thread the four words of one (b, h): 16 bytes, the neighbouring
# thread the next 16, so every warp load and code store is whole 32-byte sectors (a layout of a thread a whole block,
# profiled on the H200, showed L2 throughput near its peak at 42% of DRAM's: each sector requested twice).
# A block is two neighbouring threads: its amax is a register reduction and one shuffle, its scale and divisions
# are computed by both (the same bits), each thread packs its eight codes into one 32-bit store, and the scale
# bytes are stored from the reduction's own layout (`store_bytes`).
@triton.jit
def word_offsets(W: tl.constexpr):
    """Word offsets (W // 16, 2, 4) of a W-wide chunk: block b, half h, word j (b * 8 + h * 4 + j)."""
    blk = tl.arange(0, W // 16)[:, None, None]
    half = tl.arange(0, 2)[None, :, None]
    return blk * 8 + half * 4 + tl.arange(0, 4)[None, None, :]


@triton.jit
def load_words(ptr, base, C0, W: tl.constexpr, N: tl.constexpr, MASK: tl.constexpr):
    """The int32 words (two 16-bit elements each) of columns C0..C0+W (0 past N) of the row starting at word `base`
    of an int32 view."""
    w = C0 // 2 + word_offsets(W)
    if not MASK:
        return tl.load(ptr + base + w)
    else:
        return tl.load(ptr + base + w, mask=w < N // 2, other=0)


@triton.jit
def bf16x2_unpack(u):
    """(even, odd) fp32 values of words holding two bf16 elements (exact: the bits shifted into place)."""
    return (u << 16).to(tl.float32, bitcast=True), (u & -65536).to(tl.float32, bitcast=True)


@triton.jit
def load_pairs(ptr, base, C0, W: tl.constexpr, N: tl.constexpr, MASK: tl.constexpr, KIND: tl.constexpr,
               HW: tl.constexpr):
    """(even, odd) fp32 elements of columns C0..C0+W (0 past N) of the row starting at `base`. KIND 0/1: ptr is an
    int32 view of bf16/fp16 data, base counts words (exact widening through the bits); 2: ptr is the 16-bit data
    itself, base counts elements (each element loaded on its own). `row_base` gives base."""
    w = C0 // 2 + word_offsets(W)
    if KIND == 2:
        e = ptr + base + 2 * w
        if not MASK:
            return to_f32(tl.load(e), HW), to_f32(tl.load(e + 1), HW)
        else:
            m = w < N // 2
            return to_f32(tl.load(e, mask=m, other=0.0), HW), to_f32(tl.load(e + 1, mask=m, other=0.0), HW)
    else:
        return unpack_words(load_words(ptr, base, C0, W, N, MASK), KIND)


@triton.jit
def unpack_words(u, KIND: tl.constexpr):
    """(even, odd) fp32 values of int32 words holding two bf16 (KIND 0) or fp16 (KIND 1) elements (exact)."""
    if KIND == 0:
        return bf16x2_unpack(u)
    else:
        lo = (u & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        return lo, (u >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def row_base(row, stride: tl.constexpr, KIND: tl.constexpr):
    """`load_pairs`'s base of row `row` of a tensor with an (even) row stride in elements: in words (KIND 0/1, a
    constexpr multiple, so the loads vectorize) or elements (KIND 2)."""
    if KIND == 2:
        return row * stride
    else:
        return row * (stride // 2)


@triton.jit
def e2m1_code(v):
    """int32 e2m1 code of fp32 v: `e2m1_codes` of clamp(v, -6, 6), sign from v's sign bit (so -0.0 -> 8), in integer
    and one-fma arithmetic (no compare chain): a = min(|v|, 6) in binade [2^e, 2^(e+1)) (e >= 0; below 1 as e = 0);
    E = 2^e (max(a, 1) with its mantissa cleared), a + E * 2^22 (one fma: the product is exact, so one rounding, as
    the add of C = 2^(e + 22) would) rounds a to the e2m1 step 2^(e-1) (nearest, ties to even), so
    bits(a + C) - bits(C) = k, the rounded a in steps (ties to the even k, the even code), and the code is k + 2e,
    2e = bits(E) >> 22 - 254. NaN gives code 7 with its sign (fmin, like the interpreter's; the reference's 0 would
    cost a select per element: non-finite inputs are outside the contract)."""
    a = tl.minimum(tl.abs(v), 6.0)
    eb = tl.maximum(a, 1.0).to(tl.int32, bitcast=True) & 0x7F800000
    t = tl.fma(eb.to(tl.float32, bitcast=True), 4194304.0, a)
    m = t.to(tl.int32, bitcast=True) - eb + (eb >> 22) - (0x0B000000 + 254)
    return m | ((v.to(tl.int32, bitcast=True) >> 28) & 8)


@triton.jit
def e4m3_normal_byte(s):
    """The e4m3fn byte of s, an e4m3 value in [2^-6, 448] (a normal number) or NaN (0x7F)."""
    u = s.to(tl.int32, bitcast=True)
    b = ((((u >> 23) & 0xFF) - 120) << 3) | ((u >> 20) & 7)  # exponent bias 127 -> 7
    return tl.where(s != s, 0x7F, b).to(tl.uint8)


@triton.jit
def abs_max(lo, hi):
    """[ROWS] max |.| of each row of a chunk's two tiles as fp32 (NaN bits lie above +inf's, so a NaN wins as in
    torch's amax)."""
    m = tl.maximum(lo.to(tl.int32, bitcast=True) & 0x7FFFFFFF, hi.to(tl.int32, bitcast=True) & 0x7FFFFFFF)
    return tl.max(tl.max(tl.max(m, axis=3), axis=2), axis=1).to(tl.float32, bitcast=True)


@triton.jit
def store_bytes(ptr, b):
    """st.global.b8 of each byte b at ptr, in b's own layout: a tl.store of the swizzled scales gets a layout of
    Triton's choosing, converted through shared memory behind two barriers a chunk (GPU only)."""
    tl.inline_asm_elementwise("st.global.b8 [$1], $2;", "=r,l,r", [ptr, b.to(tl.int32)], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def quantize_store(lo, hi, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, C0, W: tl.constexpr, N: tl.constexpr,
                   MASK: tl.constexpr, HW: tl.constexpr):
    """Codes and swizzled block scales of a chunk's two tiles (columns C0..C0+W of `rows`, 0 past N; C0 % 64 == 0)."""
    bmax = tl.max(tl.max(tl.maximum(tl.abs(lo), tl.abs(hi)), axis=3), axis=2)  # (ROWS, W // 16)
    s = tl.math.div_rn(tl.math.div_rn(bmax, 6.0), g)
    s = tl.clamp(s, 0.015625, 448.0, propagate_nan=tl.PropagateNan.ALL)
    if HW:  # cvt.rn.satfinite.e4m3x2.f32: round to nearest even, NaN -> 0x7F (runtime/kernels/fp8.py e4m3_ready)
        s8 = s.to(tl.float8e4nv)
        sbyte = s8.to(tl.uint8, bitcast=True)
        s = s8.to(tl.float32)
    else:
        s = round_to_e4m3(s)
        sbyte = e4m3_normal_byte(s)
    r = tl.math.div_rn(inv_g, s)[:, :, None, None]
    byte = (e2m1_code(lo * r) | (e2m1_code(hi * r) << 4)).to(tl.uint8)  # element 2i in the low nibble
    w = C0 // 2 + word_offsets(W)
    p = packed_ptr + rows[:, None, None, None] * (N // 2) + w
    if not MASK:
        tl.store(p, byte)
    else:
        tl.store(p, byte, mask=w < N // 2)
    col = C0 // 16 + tl.arange(0, W // 16)[None, :]
    row = rows[:, None]
    off = ((row // 128) * n_col_tiles + col // 4) * 512 + (row % 32) * 16 + ((row // 32) % 4) * 4 + col % 4
    if MASK:
        tl.store(sf_ptr + off, sbyte, mask=col < N // 16)
    elif HW:
        store_bytes(sf_ptr + off, sbyte)
    else:
        tl.store(sf_ptr + off, sbyte)


@triton.jit
def finish_chunk(lo, hi, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, C0, W: tl.constexpr, N: tl.constexpr,
                 MASK: tl.constexpr, AMAX_ONLY: tl.constexpr, HW: tl.constexpr):
    """AMAX_ONLY: the running row amaxes a ([ROWS]), updated with the chunk's; else the chunk quantized and stored
    (a as it is)."""
    if AMAX_ONLY:
        a = tl.maximum(a, abs_max(lo, hi))
    else:
        quantize_store(lo, hi, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, C0, W, N, MASK, HW)
    return a


@triton.jit
def program_rows(M, ROWS: tl.constexpr):
    """This program's ROWS row indices (int64 [ROWS]), those past the last row clamped to it: a clamped lane
    recomputes the last row and writes the same bytes to the same places, so no row mask is needed."""
    return tl.minimum(tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64), M - 1)


@triton.jit
def load_global(g_ptr):
    """(g, 1 / g) from a 1-element fp32 buffer; 1 / g correctly rounded like torch's `1.0 / g`."""
    g = tl.load(g_ptr)
    return g, tl.math.div_rn(1.0, g)


@triton.jit
def _cast_chunk(x_ptr, base, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, C0, W: tl.constexpr,
                N: tl.constexpr, MASK: tl.constexpr, KIND: tl.constexpr, AMAX_ONLY: tl.constexpr, HW: tl.constexpr):
    lo, hi = load_pairs(x_ptr, base, C0, W, N, MASK, KIND, HW)
    return finish_chunk(lo, hi, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, C0, W, N, MASK, AMAX_ONLY, HW)


@triton.jit
def next_chunk(i, NFULL: tl.constexpr, CH: tl.constexpr):
    """First column of the chunk after chunk i of the full-chunk loop (the last chunk again on its last trip: an
    L1 hit, where a scalar-masked load would cost a predicate per word)."""
    return tl.minimum(i + 1, NFULL - 1) * CH


@triton.jit
def _cast_kernel(x_ptr, packed_ptr, sf_ptr, amax_ptr, g_ptr, M, n_col_tiles, N: tl.constexpr, ROWS: tl.constexpr,
                 CH: tl.constexpr, NFULL: tl.constexpr, T0: tl.constexpr, T1: tl.constexpr, T2: tl.constexpr,
                 PREFETCH: tl.constexpr, KIND: tl.constexpr, AMAX_ONLY: tl.constexpr, HW: tl.constexpr):
    """ROWS rows a program, each in NFULL chunks of CH columns, then tail chunks T0, T1, T2 (`row_plan`). Words
    (KIND 0/1) with PREFETCH: the loop loads chunk i + 1 before it quantizes chunk i, so a warp's loads are in flight
    while it computes (program order: the compiler may not move a load above the previous chunk's stores, which
    could alias it); it costs a second chunk of registers (occupancy)."""
    rows = program_rows(M, ROWS)
    base = row_base(rows[:, None, None, None], N, KIND)
    g, inv_g = load_global(g_ptr)
    a = tl.zeros((ROWS,), tl.float32)
    if PREFETCH and KIND != 2 and NFULL > 0:
        u = load_words(x_ptr, base, 0, CH, N, False)
        for i in range(NFULL):  # a loop, not unrolled: compile time and code size
            nxt = load_words(x_ptr, base, next_chunk(i, NFULL, CH), CH, N, False)
            lo, hi = unpack_words(u, KIND)
            a = finish_chunk(lo, hi, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, i * CH, CH, N, False,
                             AMAX_ONLY, HW)
            u = nxt
    else:
        for i in range(NFULL):
            a = _cast_chunk(x_ptr, base, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, i * CH, CH, N, False,
                            KIND, AMAX_ONLY, HW)
    if T0 > 0:
        a = _cast_chunk(x_ptr, base, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, NFULL * CH, T0, N,
                        NFULL * CH + T0 > N, KIND, AMAX_ONLY, HW)
    if T1 > 0:
        a = _cast_chunk(x_ptr, base, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, NFULL * CH + T0, T1, N,
                        NFULL * CH + T0 + T1 > N, KIND, AMAX_ONLY, HW)
    if T2 > 0:
        a = _cast_chunk(x_ptr, base, a, g, inv_g, packed_ptr, sf_ptr, rows, n_col_tiles, NFULL * CH + T0 + T1, T2, N,
                        NFULL * CH + T0 + T1 + T2 > N, KIND, AMAX_ONLY, HW)
    if AMAX_ONLY:
        tl.store(amax_ptr + rows, a)


# bf16 products and sums of two bf16 values as PTX bf16x2 instructions (sm_90+), two elements an instruction, where
# the bf16 kernels compute them in fp32 and round to bf16: the same bits. A product of two bf16 values is exact in
# fp32, so its one rounding is the correctly rounded bf16 product; an fp32 sum of two bf16 values rounded again to
# bf16 is the correctly rounded bf16 sum (24 >= 2 * 8 + 2 bits: double rounding is innocuous, Figueroa 1995).
@triton.jit
def bf16x2_round_mul(lo, hi, b):
    """Words of bf16(bf16(lo, hi) * b): fp32 (lo, hi) rounded to a bf16 pair, times the bf16 pair b, rounded."""
    return tl.inline_asm_elementwise("{ .reg .b32 t; cvt.rn.bf16x2.f32 t, $2, $1; mul.rn.bf16x2 $0, t, $3; }",
                                     "=r,f,f,r", [lo, hi, b], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def bf16x2_mul_add(a, b, c):
    """Words of bf16(c + bf16(a * b)) for bf16 pairs a, b, c."""
    return tl.inline_asm_elementwise("{ .reg .b32 t; mul.rn.bf16x2 t, $1, $2; add.rn.bf16x2 $0, $3, t; }",
                                     "=r,r,r,r", [a, b, c], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def bf16x2_modulate(lo, hi, sc, sh):
    """Words of bf16(bf16(bf16(lo, hi) * bf16(1 + sc)) + sh): exact-mode modulation after the fp32 norm products."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 t, c; cvt.rn.bf16x2.f32 t, $2, $1; mov.b32 c, 0x3F803F80; add.rn.bf16x2 c, $3, c; "
        "mul.rn.bf16x2 t, t, c; add.rn.bf16x2 $0, t, $4; }",
        "=r,f,f,r,r", [lo, hi, sc, sh], dtype=tl.int32, is_pure=True, pack=1)


# ---------------------------------------------------------------------------------------------- launch helpers
# A launch's layout per (kernel kind, row width): (rows a program, warps, chunk columns, prefetch). A program owns ROWS
# rows (`program_rows`) and walks them in chunks of CH columns (`row_plan`), each chunk one (ROWS, CH // 16, 2, 4) tile
# (`word_offsets`): ROWS * CH / 8 half blocks over 32 * warps threads, so what a thread holds (registers) stays the
# same whatever the width, and no thread repeats another's (they do where the tile has fewer half blocks than
# threads: the one-row layout's 256-column tail). prefetch: the full-chunk loop loads chunk i + 1 before it computes
# chunk i (a second chunk of registers: fewer warps resident). The H200 probe (benchmarks/probes/nvfp4_producers.py)
# times every SWEEP layout with and without the prefetch, checks each bit-exact, and prints the winners as this
# table's line.
# Measured: the H200 probe's sweep (benchmarks/results/probes/nvfp4-session11/probe-call4-sweep.{json,log}), at
# 19,000 rows: the bf16x2 layout with the least static time per kind (the served mode), every candidate bit-exact
# in both modes. The kernels alone at these layouts (Nsight Compute, that folder's
# ncu.md: call 6, "committed", the fold "hints"), static us and fraction of copy (4.26 TB/s): modulation 132 (0.46),
# fold 215 (0.73), SwiGLU 544 (0.54), cast 104 (0.79); the dynamic modes (call 4) 0.28, 0.49, 0.29, 0.49.
TUNED: dict[tuple[str, int], tuple[int, int, int, bool]] = {
    ("modulation", 5376): (2, 1, 512, True), ("fold", 5376): (2, 1, 512, True), ("swiglu", 14336): (1, 4, 1024, False),
    ("cast", 7168): (4, 4, 1024, False)}
# The probe's layouts per kind (rows, warps, chunk), each with and without the prefetch (the interpreter tests check
# every one bit-exact at small shapes): each tile at least half a block (16 bytes of input) a thread
# (ROWS * CH / 8 >= 32 * warps). (1, w, 0): the one-row layout (chunk 0: the largest power of two in the row).
_ROWS_LAYOUTS = ((1, 4, 0), (1, 2, 0), (4, 4, 512), (8, 4, 256), (4, 2, 256), (8, 2, 256), (8, 8, 512), (2, 4, 1024),
                 (8, 4, 512), (4, 4, 1024), (4, 4, 256), (2, 4, 512), (2, 2, 512), (1, 2, 512), (2, 2, 256),
                 (4, 2, 512), (2, 1, 256), (2, 1, 512))
SWEEP: dict[str, tuple[tuple[int, int, int], ...]] = {
    "modulation": _ROWS_LAYOUTS,
    "fold": _ROWS_LAYOUTS,
    # SwiGLU is compute-bound: the tiles from (2, 4, 512) on hold fewer registers a thread (more warps resident)
    "swiglu": ((1, 8, 0), (4, 4, 512), (8, 4, 256), (4, 8, 1024), (8, 8, 512), (2, 4, 1024), (8, 4, 512),
               (4, 4, 1024), (2, 4, 512), (4, 4, 256), (2, 2, 512), (4, 2, 256), (1, 4, 1024), (2, 8, 1024),
               (1, 2, 512)),
    "cast": _ROWS_LAYOUTS,
}
BF16X2 = True  # the bf16x2 instructions above on the GPU for bf16 inputs (False: the fp32 arithmetic and roundings)


def use_bf16x2(kind: int) -> bool:
    """The X2 constexpr of a launch: `BF16X2` on the GPU, for bf16 data read as words (pair_args KIND 0)."""
    return BF16X2 and kind == 0 and not INTERPRET


def launch_config(kind: str, n: int) -> tuple[int, int, int, bool]:
    """(rows, warps, chunk, prefetch) of a launch: TUNED, else one row a program at 4 warps up to 8192 columns, 8
    above, with the prefetch."""
    return TUNED.get((kind, n)) or (1, 4 if n <= 8192 else 8, 0, True)


def row_plan(n: int, chunk: int) -> dict:
    """A row of n columns as NFULL chunks of CH columns, then up to three power-of-two tail chunks T0 >= T1 >= T2
    (whole groups of 64 columns, the last masked past n). chunk 0: CH the largest power of two <= n (the one-row
    layout: 5376 -> 4096 + 1024 + 256)."""
    n64 = -(-n // 64) * 64
    ch = chunk or max(64, 1 << (n.bit_length() - 1))
    if ch < 64 or ch & (ch - 1):
        raise ValueError(f"NVFP4 chunk {chunk} is not a power of two >= 64")
    nfull = n // ch  # unmasked: whole inside the row
    t = chunks(n64 - nfull * ch, 3)
    return dict(CH=ch, NFULL=nfull, T0=t[0], T1=t[1], T2=t[2])


def launch_opts(kind: str, n: int) -> tuple[int, dict]:
    """(rows a program, the launch's constexprs and options: ROWS, `row_plan`, PREFETCH, warps) for (kind, width)."""
    rows, warps, chunk, prefetch = launch_config(kind, n)
    return rows, dict(LAUNCH_OPTS, ROWS=rows, num_warps=warps, PREFETCH=bool(prefetch), **row_plan(n, chunk))


def full_config(config) -> tuple[int, int, int, bool]:
    """(rows, warps, chunk, prefetch) of a SWEEP layout (rows, warps, chunk: with the prefetch) or a TUNED entry."""
    config = tuple(config)
    return (*config, True) if len(config) == 3 else (*config[:3], bool(config[3]))


class tuned:
    """`with tuned(kind, n, (rows, warps, chunk[, prefetch]), bf16x2)`: that launch layout (and BF16X2) in force, the
    planned table restored after (the probe's and the GPU sweep's candidates)."""

    def __init__(self, kind: str, n: int, config, bf16x2: bool = True):
        self.key, self.config, self.bf16x2 = (kind, n), full_config(config), bf16x2

    def __enter__(self):
        global BF16X2
        self.planned, self.planned_x2 = dict(TUNED), BF16X2
        TUNED[self.key], BF16X2 = self.config, self.bf16x2
        return self

    def __exit__(self, *exc):
        global BF16X2
        TUNED.clear()
        TUNED.update(self.planned)
        BF16X2 = self.planned_x2


def config_name(config, bf16x2: bool = True) -> str:
    """'r4w4c512' (rows, warps, chunk; c0: the one-row layout's chunks), 'n' appended without the prefetch, 'f'
    without bf16x2."""
    rows, warps, chunk, prefetch = full_config(config)
    return f"r{rows}w{warps}c{chunk}" + ("" if prefetch else "n") + ("" if bf16x2 else "f")


def _words_ok(t: torch.Tensor) -> bool:
    return (t.dtype in (torch.bfloat16, torch.float16) and t.dim() >= 1 and t.stride(-1) == 1 and t.shape[-1] % 2 == 0
            and t.storage_offset() % 2 == 0 and t.data_ptr() % 4 == 0 and all(s % 2 == 0 for s in t.stride()[:-1]))


def stride_arg(stride: int, kind: int) -> int:
    """A runtime row stride in `load_pairs`'s base units: words (KIND 0/1; even there) or elements."""
    return stride if kind == 2 else stride // 2


def pair_args(*tensors: torch.Tensor) -> tuple:
    """(kernel arguments..., KIND) for 16-bit tensors read in element pairs (`load_pairs`): their int32 views
    (KIND 0 bf16, 1 fp16) where every pair of every tensor is one aligned 4-byte word, else the tensors themselves
    (KIND 2). Row strides passed to the kernels: `stride_arg`."""
    if all(_words_ok(t) for t in tensors) and len({t.dtype for t in tensors}) == 1:
        return (*(t.view(torch.int32) for t in tensors), 0 if tensors[0].dtype == torch.bfloat16 else 1)
    return (*tensors, 2)


def outputs(rows: int, n: int, lead: tuple, device):
    """(packed (lead..., n/2) uint8, swizzled scales (flat) uint8, n_col_tiles). The kernels write every scale of the
    rows x n/16 matrix, so only the padding is zeroed here: the last row tile (its 128 x 4 tiles are the buffer's
    last n_col_tiles * 512 bytes) when rows % 128, the whole buffer when n/16 % 4 (padding columns in every tile);
    at H3 widths and 19,000 rows that is 43 KB, not 6.4 MB, a call."""
    packed = torch.empty(lead + (n // 2,), dtype=torch.uint8, device=device)
    cols = n // BLOCK
    nct = -(-cols // TILE_COLS)
    if cols % TILE_COLS:
        return packed, torch.zeros(blocked_numel(rows, cols), dtype=torch.uint8, device=device), nct
    sf = torch.empty(blocked_numel(rows, cols), dtype=torch.uint8, device=device)
    if rows % TILE_ROWS:
        sf[-nct * TILE_ROWS * TILE_COLS:].zero_()
    return packed, sf, nct


def global_buffer(g: torch.Tensor | None, row_amax: torch.Tensor | None, device) -> torch.Tensor:
    """The kernels' 1-element g: the given one (fp32) or `global_scale` of the row amaxes' max (on the device)."""
    if g is not None:
        return g.float().reshape(1).to(device).clone()  # a custom op's output may not alias its input
    return global_scale(row_amax.amax() if row_amax.numel() else row_amax.new_zeros(())).reshape(1)


def two_pass(launch, M: int, g: torch.Tensor | None, device) -> torch.Tensor:
    """A producer's launches: with a static g the quantize pass only (launch(g, False)); dynamic (g None) first the
    amax pass into per-row amaxes (launch(row_amax, True)), then the quantize pass on their global scale. Returns
    the 1-element g the codes were made with."""
    row_amax = None
    if g is None:
        row_amax = torch.empty(M, dtype=torch.float32, device=device)
        if M:
            launch(row_amax, True)
    gb = global_buffer(g, row_amax, device)
    if M:
        launch(gb, False)
    return gb


def global_scale_reason(g, device) -> str | None:
    """None when g is None (dynamic) or a 1-element fp32 tensor on `device`."""
    if g is None:
        return None
    if not isinstance(g, torch.Tensor) or g.numel() != 1 or g.dtype != torch.float32:
        return "global_scale must be a 1-element fp32 tensor"
    if g.device != device:
        return f"global_scale is on {g.device}, the input on {device}"
    return None


def width_checks(name: str, n: int):
    yield n % BLOCK == 0, f"{name} row length {n} is not a multiple of {BLOCK} (NVFP4 blocks)"
    yield 0 < n <= MAX_WIDTH, f"{name} row length {n} outside [1, {MAX_WIDTH}] (a whole row lives in registers)"


def fake_outputs(like: torch.Tensor, rows: int, n: int, lead: tuple):
    return (like.new_empty(lead + (n // 2,), dtype=torch.uint8),
            like.new_empty((blocked_numel(rows, n // BLOCK),), dtype=E4M3),
            like.new_empty((), dtype=torch.float32))


# ---------------------------------------------------------------------------------------------- the cast
def cast_nvfp4_check(x, global_scale=None) -> str | None:
    def checks():
        yield from tensor_checks("x", x, (torch.bfloat16, torch.float16))
        yield x.dim() >= 1, "x is 0-dim"
        yield from width_checks("x", x.shape[-1] if x.dim() else 0)
    return guard(checks()) or global_scale_reason(global_scale, x.device)


def _launch_cast(x, global_scale=None):
    N = x.shape[-1]
    M = x.numel() // N
    packed, sf, nct = outputs(M, N, tuple(x.shape[:-1]), x.device)
    xw, kind = pair_args(x)
    rows, opts = launch_opts("cast", N)
    grid = (triton.cdiv(M, rows),)
    g = two_pass(lambda buf, amax_only: _cast_kernel[grid](xw, packed, sf, buf, buf, M, nct, N=N, KIND=kind,
                                                           AMAX_ONLY=amax_only, HW=not INTERPRET, **opts),
                 M, global_scale, x.device)
    return packed, sf.view(E4M3), g.reshape(())


@custom_op("cast_nvfp4", fake=lambda x, g: fake_outputs(x, x.numel() // x.shape[-1], x.shape[-1], tuple(x.shape[:-1])))
def _cast_op(x: torch.Tensor, g: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    reason = cast_nvfp4_check(x, g)
    if reason is not None:
        raise ValueError(reason)
    return _launch_cast(x, g)


def cast_nvfp4(x: torch.Tensor, global_scale: torch.Tensor | None = None):
    """NVFP4 codes of a contiguous bf16/fp16 tensor (..., K): (packed uint8 (..., K/2), swizzled block scales
    e4m3 (flat, rows = the product of the leading dims), g fp32 0-dim), bit-identical to `cast_nvfp4_ref`.
    global_scale: a 1-element fp32 tensor (a checkpoint's input_scale) or None (from x's amax).
    ValueError(reason) on inputs `cast_nvfp4_check` refuses."""
    reason = cast_nvfp4_check(x, global_scale)
    if reason is not None:
        raise ValueError(reason)
    return torch.ops.h3plan.cast_nvfp4(x, global_scale)


# the kernel ops of this module a lever names (SPEC.kernels): op -> (function, its check), read by table.py
OPS = {"cast_nvfp4": ("cast_nvfp4", "cast_nvfp4_check")}
