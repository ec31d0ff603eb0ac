"""Per-head Q/K RMSNorm + partial rotate-half RoPE for MiniMax-H3 attention, in one launch.

Scope: q, k (B, S, H*D) or (B, S, H, D) projection outputs (any batch/row/head strides, last dim
contiguous: slices of a fused QKV projection work), RMSNorm weights (D,), cos/sin (S, R) fp32 exactly
as `MiniMaxH3RotaryPosEmbed` returns them (R = 2*3*rope_freq_dim = 96 of D = 128 for H3). Outputs:
degree 1 -> (B, S, H, D) contiguous tensors; Ulysses degree U -> one destination-major buffer
(U, n, B, S, H/U, D): `out[u]` is what rank u receives in one all-to-all (heads u*H/U .. (u+1)*H/U-1).
V (optional) is only copied/packed. The FP8 variant (norm + RoPE + per-tensor e4m3 cast of q, k, v) is
qk_fp8_lean.py; its reference `qk_norm_rope_fp8_ref` and check `qk_norm_rope_fp8_check` live here, beside the
norm + RoPE reference they build on.

Fallback: `qk_norm_rope_check` names the reason a call is refused; the installer then runs
`qk_norm_rope_ref` (the eager diffusers sequence). The public functions raise ValueError(reason).

Numerics (bit-exact vs diffusers eager on CUDA, torch 2.11): RMSNorm follows torch's fused CUDA kernel
(`vectorized_layer_norm_kernel<T, float, rms_norm=true>`, 128 threads per row; docs/numerics.md): for
D <= 128 only threads t < D/4 hold data, each sums squares 4t..4t+3 left to right, then a shuffle-down
tree adds lane t + 16, + 8, ..., + 1 (the order of runtime/kernels/_rmsnorm.py, computed here from the tile
already in registers; squares of bf16/fp16 values are exact in fp32, so nvcc's FMA there changes
nothing); mean = sum / D (IEEE); r = rsqrt(mean + eps) (the approximate rsqrtf torch uses); y = w * (r * x)
in fp32, rounded once to the storage dtype. RoPE rounds cos/sin, each product and the sum to the storage
dtype, as the eager bf16 ops do. `NUMERICS` (rsqrt "approx" | "rn", reduction "cuda_tree" | "triton") are
constexpr variants; the GPU suite reports which ones match eager. On the CPU, torch sums in another order
(and its fp32 sqrt is not always correctly rounded): CPU tests compare bit-exactly against
`emulate_cuda_rms_norm` and against CPU eager within 1 ulp on a small fraction.
FP8 (the reference below, qk_fp8_lean's contract): the q/k/v values above, then e4m3(clamp(x * scale, +-448)),
round-to-nearest-even; dynamic scale = 448 / amax (1 when amax == 0), descale = 1 / scale (both IEEE). Lossy by design:
relative error up to 2^-4 (3 mantissa bits) where |x * scale| >= 2^-6, absolute error up to 2^-10 / scale below; values
with |x * scale| > 448 saturate (static scales, or padding rows past valid_len in dynamic mode).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import INTERPRET, LAUNCH_OPTS, guard, interpreter_tile, negate, next_pow2, round_st, to_f32
from ._registry import custom_op
from .fp8 import E4M3_MAX

# Device-numerics variants (see module docstring); the GPU suite reports which matches eager.
NUMERICS = {"rsqrt": "approx", "reduction": "cuda_tree"}
_RSQRT = {"approx": 0, "rn": 1}
_REDUCTION = {"cuda_tree": 0, "triton": 1}
# Launch tiling: block_t tokens x block_h heads per program (None: 8 heads, 16 head rows per program).
# fastest exact tiling of the H200 sweep (sweeps/sweep-qk_norm_rope.md)
LAUNCH = {"block_t": 1, "block_h": 8, "num_warps": 2}
SWEEP_CONFIGS = [dict(block_t=t, block_h=h, num_warps=w)
                 for t, h, w in ((1, 8, 4), (2, 8, 4), (4, 8, 4), (2, 8, 8), (4, 8, 8), (8, 8, 8),
                                 (2, 4, 4), (1, 8, 2))]


# ---------------------------------------------------------------------------------------------- kernels
@triton.jit
def _sumsq_rows(x, ROWS: tl.constexpr, D_PAD: tl.constexpr, P: tl.constexpr, REDUCTION: tl.constexpr):
    """x (ROWS, D_PAD) fp32, zero past D -> (ROWS,) sum of squares."""
    sq = x * x
    if REDUCTION == 0:
        # torch CUDA order: thread t sums squares 4t..4t+3 left to right ...
        ev, od = tl.split(tl.reshape(sq, (ROWS, P, 2, 2)))
        k0, k2 = tl.split(ev)
        k1, k3 = tl.split(od)
        s = ((k0 + k1) + k2) + k3
        # ... then lane t adds lane t + P/2, t + P/4, ... (zero lanes above P add nothing).
        if P >= 32:
            s = tl.sum(tl.reshape(s, (ROWS, 2, 16)), axis=1)
        if P >= 16:
            s = tl.sum(tl.reshape(s, (ROWS, 2, 8)), axis=1)
        if P >= 8:
            s = tl.sum(tl.reshape(s, (ROWS, 2, 4)), axis=1)
        if P >= 4:
            s = tl.sum(tl.reshape(s, (ROWS, 2, 2)), axis=1)
        if P >= 2:
            s = tl.sum(tl.reshape(s, (ROWS, 2, 1)), axis=1)
        return tl.reshape(s, (ROWS,))
    else:
        return tl.sum(sq, axis=1)


@triton.jit
def _norm_rope(x_ptr, off, poff, m, mp, w, wp, cb, sb, c, eps,
               BT: tl.constexpr, BH: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, P: tl.constexpr,
               HALF: tl.constexpr, R: tl.constexpr, HAS_W: tl.constexpr, IS_BF16: tl.constexpr,
               RSQRT: tl.constexpr, REDUCTION: tl.constexpr, HW: tl.constexpr, IS_F32: tl.constexpr):
    """(BT, BH, D_PAD) tile of head rows -> normed + rotated values (exact storage-dtype values in fp32)."""
    x = to_f32(tl.load(x_ptr + off, mask=m, other=0.0), HW)
    # rotate-half partner (c + R/2 or c - R/2), reloaded (L1 hit) rather than permuted in registers
    xp = to_f32(tl.load(x_ptr + poff, mask=mp, other=0.0), HW)
    ss = _sumsq_rows(tl.reshape(x, (BT * BH, D_PAD)), BT * BH, D_PAD, P, REDUCTION)
    ms = tl.math.div_rn(ss, D * 1.0) + eps
    if RSQRT == 0:
        r = tl.rsqrt(ms)
    else:
        r = tl.math.div_rn(1.0, tl.sqrt_rn(ms))
    r = tl.reshape(r, (BT, BH, 1))
    n = r * x
    npart = r * xp
    if HAS_W:
        n = w * n
        npart = wp * npart
    n = round_st(n, IS_BF16, IS_F32, HW)
    npart = round_st(npart, IS_BF16, IS_F32, HW)
    rot = tl.where(c < HALF, negate(npart), npart)
    t1 = round_st(n * cb, IS_BF16, IS_F32, HW)
    t2 = round_st(rot * sb, IS_BF16, IS_F32, HW)
    return tl.where(c < R, round_st(t1 + t2, IS_BF16, IS_F32, HW), n)


@triton.jit
def _emit(y, out_ptr, oo, m, OUT_BF16: tl.constexpr, OUT_F32: tl.constexpr):
    if OUT_F32:
        tl.store(out_ptr + oo, y, mask=m)
    elif OUT_BF16:
        tl.store(out_ptr + oo, y.to(tl.bfloat16), mask=m)
    else:
        tl.store(out_ptr + oo, y.to(tl.float16), mask=m)


@triton.jit
def _tile(pid_t, pid_h, T, S, H, Hl, sou, sob, sos, D: tl.constexpr, D_PAD: tl.constexpr, R: tl.constexpr,
          BT: tl.constexpr, BH: tl.constexpr):
    """One program's (BT tokens, BH heads, D_PAD channels) tile: channel index c, batch / position / head indices
    b3 s3 h3, the token and element masks (m: c < D, mp: c < R), RoPE's partner channel pc, and the output offsets
    oo (head h to rank h // Hl, slot h % Hl). Both q/k kernels index with it (_qk_norm_rope_kernel, qk_fp8_lean)."""
    HALF: tl.constexpr = R // 2
    tok = pid_t * BT + tl.arange(0, BT).to(tl.int64)  # token = b * S + s
    h = pid_h * BH + tl.arange(0, BH).to(tl.int64)
    b = tok // S
    s = tok - b * S
    u = h // Hl  # destination rank
    hl = h - u * Hl
    c = tl.arange(0, D_PAD)[None, None, :]
    b3 = b[:, None, None]
    s3 = s[:, None, None]
    h3 = h[None, :, None]
    tok_ok = (tok < T)[:, None, None]
    mrow = tok_ok & (h < H)[None, :, None]
    m = mrow & (c < D)
    mp = mrow & (c < R)
    pc = tl.where(c < HALF, c + HALF, c - HALF)
    oo = u[None, :, None] * sou + b3 * sob + s3 * sos + hl[None, :, None] * D + c
    return c, b3, s3, h3, tok_ok, m, mp, pc, oo


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr, k_ptr, v_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr,
    oq_ptr, ok_ptr, ov_ptr,
    T, S, H, Hl,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh,
    scb, scs, ssb, sss,
    sou, sob, sos,
    eps,
    D: tl.constexpr, D_PAD: tl.constexpr, P: tl.constexpr, R: tl.constexpr,
    BT: tl.constexpr, BH: tl.constexpr,
    HAS_V: tl.constexpr, HAS_W: tl.constexpr, IS_BF16: tl.constexpr,
    RSQRT: tl.constexpr, REDUCTION: tl.constexpr, HW: tl.constexpr,
    IS_F32: tl.constexpr,
):
    HALF: tl.constexpr = R // 2
    pid_t = tl.program_id(0).to(tl.int64)
    pid_h = tl.program_id(1).to(tl.int64)
    c, b3, s3, h3, tok_ok, m, mp, pc, oo = _tile(pid_t, pid_h, T, S, H, Hl, sou, sob, sos, D, D_PAD, R, BT, BH)

    cm = tok_ok & (c < R)
    cb = round_st(tl.load(cos_ptr + b3 * scb + s3 * scs + c, mask=cm, other=0.0), IS_BF16, IS_F32, HW)
    sb = round_st(tl.load(sin_ptr + b3 * ssb + s3 * sss + c, mask=cm, other=0.0), IS_BF16, IS_F32, HW)

    wm = c < D
    wq = 1.0
    wqp = 1.0
    wk = 1.0
    wkp = 1.0
    if HAS_W:
        wq = to_f32(tl.load(wq_ptr + c, mask=wm, other=0.0), HW)
        wqp = to_f32(tl.load(wq_ptr + pc, mask=c < R, other=0.0), HW)
        wk = to_f32(tl.load(wk_ptr + c, mask=wm, other=0.0), HW)
        wkp = to_f32(tl.load(wk_ptr + pc, mask=c < R, other=0.0), HW)

    y = _norm_rope(q_ptr, b3 * sqb + s3 * sqs + h3 * sqh + c, b3 * sqb + s3 * sqs + h3 * sqh + pc,
                   m, mp, wq, wqp, cb, sb, c, eps, BT, BH, D, D_PAD, P, HALF, R, HAS_W, IS_BF16, RSQRT,
                   REDUCTION, HW, IS_F32)
    _emit(y, oq_ptr, oo, m, IS_BF16, IS_F32)
    y = _norm_rope(k_ptr, b3 * skb + s3 * sks + h3 * skh + c, b3 * skb + s3 * sks + h3 * skh + pc,
                   m, mp, wk, wkp, cb, sb, c, eps, BT, BH, D, D_PAD, P, HALF, R, HAS_W, IS_BF16, RSQRT,
                   REDUCTION, HW, IS_F32)
    _emit(y, ok_ptr, oo, m, IS_BF16, IS_F32)
    if HAS_V:
        vv = tl.load(v_ptr + b3 * svb + s3 * svs + h3 * svh + c, mask=m, other=0.0)
        tl.store(ov_ptr + oo, vv, mask=m)


# ---------------------------------------------------------------------------------------------- launch
def _as4d(x: torch.Tensor, D: int) -> torch.Tensor:
    return x.unflatten(-1, (x.shape[-1] // D, D)) if x.dim() == 3 else x


def _cos_strides(cos: torch.Tensor) -> tuple[int, int]:
    """(batch, seq) strides of cos/sin given as (S, R), (B, S, R) or (B, S, 1, R)."""
    if cos.dim() == 2:
        return 0, cos.stride(0)
    return (cos.stride(0) if cos.shape[0] > 1 else 0), cos.stride(1)


def _out_buffers(q4, n, U, dtype):
    """Output tensors and their (u, b, s) strides: separate (B,S,H,D) tensors for U == 1, else one
    (U, n, B, S, H/U, D) buffer whose [:, i] slices are written through the same strides."""
    B, S, H, D = q4.shape
    if U == 1:
        outs = [torch.empty((B, S, H, D), device=q4.device, dtype=dtype) for _ in range(n)]
        return outs, outs, (0, S * H * D, H * D)
    buf = torch.empty((U, n, B, S, H // U, D), device=q4.device, dtype=dtype)
    views = [buf[:, i] for i in range(n)]
    return [buf], views, (n * B * S * (H // U) * D, S * (H // U) * D, (H // U) * D)


def _launch(q, k, v, wq, wk, cos, sin, eps, *, U, views, ostr, numerics=None, block_t=None, block_h=None,
            num_warps=None):
    """One launch over (token blocks, head blocks): store q, k (, v)."""
    numerics = NUMERICS if numerics is None else numerics
    block_t = block_t or interpreter_tile(LAUNCH["block_t"])
    block_h = block_h or LAUNCH["block_h"]
    num_warps = num_warps or LAUNCH["num_warps"]
    has_w = wq is not None
    D = wq.shape[0] if has_w else q.shape[-1]
    q4, k4 = _as4d(q, D), _as4d(k, D)
    v4 = _as4d(v, D) if v is not None else None
    B, S, H, _ = q4.shape
    T = B * S
    if T == 0 or H == 0:
        return
    R = cos.shape[-1]
    D_PAD = max(4, next_pow2(D))
    BH = block_h or min(next_pow2(H), 8)
    BT = block_t or max(1, 16 // BH)
    scb, scs = _cos_strides(cos)
    ssb, sss = _cos_strides(sin)
    vs = v4.stride()[:3] if v4 is not None else (0, 0, 0)
    grid = (triton.cdiv(T, BT), triton.cdiv(H, BH))
    _qk_norm_rope_kernel[grid](
        q4, k4, v4 if v4 is not None else q4, wq if has_w else q4, wk if has_w else q4, cos, sin,
        views[0], views[1], views[2] if v4 is not None else views[0],  # unused pointers: any tensor
        T, S, H, H // U,
        *q4.stride()[:3], *k4.stride()[:3], *vs,
        scb, scs, ssb, sss,
        *ostr,
        float(eps),
        D=D, D_PAD=D_PAD, P=D_PAD // 4, R=R, BT=BT, BH=BH,
        HAS_V=v4 is not None, HAS_W=has_w, IS_BF16=q.dtype == torch.bfloat16,
        RSQRT=_RSQRT[numerics["rsqrt"]],
        REDUCTION=_REDUCTION[numerics["reduction"]], HW=not INTERPRET, IS_F32=q.dtype == torch.float32,
        num_warps=num_warps, **LAUNCH_OPTS,
    )


# ---------------------------------------------------------------------------------------------- checks
def _tensor_ok(name, t, dtypes, device):
    yield isinstance(t, torch.Tensor), f"{name} is not a tensor"
    yield t.dtype in dtypes, f"{name} dtype {t.dtype} not in {sorted(str(d) for d in dtypes)}"
    yield t.device == device, f"{name} is on {t.device}, expected {device}"
    yield (t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] == 1,
           f"{name} last dim is not contiguous (strides {tuple(t.stride())})")


def _norm_rope_checks(q, k, w_list, cos, sin, eps, dtypes, v=None, ulysses_degree=1, head_dim=None):
    """Shared guard checks for the transformer and VAE variants, as (ok, message) pairs."""
    yield isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor), "q and k must be tensors"
    dev = q.device
    yield (dev.type == "cuda" or (INTERPRET and dev.type == "cpu"),
           f"q is on {dev.type}; Triton needs CUDA (or TRITON_INTERPRET=1 on the CPU)")
    yield from _tensor_ok("q", q, dtypes, dev)
    yield from _tensor_ok("k", k, (q.dtype,), dev)
    yield q.dim() in (3, 4), f"q must be (B, S, H*D) or (B, S, H, D), got shape {tuple(q.shape)}"
    yield k.shape == q.shape, f"k shape {tuple(k.shape)} != q shape {tuple(q.shape)}"
    if v is not None:
        yield from _tensor_ok("v", v, (q.dtype,), dev)
        yield v.shape == q.shape, f"v shape {tuple(v.shape)} != q shape {tuple(q.shape)}"
    for name, w in w_list:
        yield from _tensor_ok(name, w, (q.dtype,), dev)
        yield w.dim() == 1, f"{name} must be 1-D (head_dim,), got shape {tuple(w.shape)}"
    D = head_dim
    yield isinstance(D, int) and D > 0, "head_dim is unknown"
    yield (4 <= D <= 128 and D % 4 == 0,
           f"head_dim {D} must be a multiple of 4 in [4, 128] (torch's CUDA rms-norm order is reproduced for one warp)")
    for name, w in w_list:
        yield w.shape[0] == D, f"{name} has {w.shape[0]} elements, head_dim is {D}"
    if q.dim() == 3:
        yield q.shape[-1] % D == 0, f"q last dim {q.shape[-1]} is not a multiple of head_dim {D}"
    else:
        yield q.shape[-1] == D, f"q head_dim {q.shape[-1]} != {D}"
    B, S = q.shape[0], q.shape[1]
    H = q.shape[2] if q.dim() == 4 else q.shape[-1] // D
    for name, t in (("cos", cos), ("sin", sin)):
        yield from _tensor_ok(name, t, (torch.float32,), dev)
        yield t.dim() in (2, 3, 4), f"{name} must be (S, R), (B, S, R) or (B, S, 1, R), got {tuple(t.shape)}"
        if t.dim() == 4:
            yield t.shape[2] == 1, f"{name} (B, S, 1, R) must broadcast over heads, got {tuple(t.shape)}"
        if t.dim() >= 3:
            yield t.shape[0] in (1, B), f"{name} batch {t.shape[0]} does not broadcast to {B}"
        yield (t.shape[-2 if t.dim() < 4 else 1] == S,
               f"{name} has {t.shape[-2 if t.dim() < 4 else 1]} rows, q has S={S}")
    yield sin.shape == cos.shape, f"sin shape {tuple(sin.shape)} != cos shape {tuple(cos.shape)}"
    R = cos.shape[-1]
    yield 2 <= R <= D and R % 2 == 0, f"rotary dim {R} must be even and in [2, head_dim={D}]"
    yield isinstance(eps, (int, float)) and eps >= 0 and eps == eps, f"eps {eps!r} must be a finite float >= 0"
    yield (isinstance(ulysses_degree, int) and ulysses_degree >= 1,
           f"ulysses_degree {ulysses_degree!r} must be an int >= 1")
    yield H % ulysses_degree == 0, f"{H} heads do not split over ulysses_degree {ulysses_degree}"
    yield B * S * H * D < 2**62, "tensor too large for int64 offsets"


def _head_dim(q, wq):
    if isinstance(wq, torch.Tensor) and wq.dim() == 1:
        return int(wq.shape[0])
    return None


def qk_norm_rope_check(q, k, wq, wk, cos, sin, eps, v=None, ulysses_degree=1) -> str | None:
    """None when the kernel takes these inputs, else the one-line reason."""
    return guard(_norm_rope_checks(q, k, [("wq", wq), ("wk", wk)], cos, sin, eps, (torch.bfloat16, torch.float16),
                                   v=v, ulysses_degree=ulysses_degree, head_dim=_head_dim(q, wq)))


def _static_scales(scales) -> tuple[float, float, float]:
    """Validate a static scale table on the host: (3,) finite, > 0. A CUDA tensor costs one sync."""
    try:
        t = torch.as_tensor(scales, dtype=torch.float32).detach().cpu()
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"static FP8 scales are not a numeric table: {e}") from None
    if t.shape != (3,):
        raise ValueError(f"static FP8 scales must have shape (3,) for q, k, v, got {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()) or not bool((t > 0).all()):
        raise ValueError(f"static FP8 scales must be finite and > 0, got {t.tolist()}")
    return tuple(float(x) for x in t.tolist())


def qk_norm_rope_fp8_check(q, k, v, wq, wk, cos, sin, eps, scales=None, valid_len=None, amax_hook=None,
                           ulysses_degree=1) -> str | None:
    """None when the FP8 kernel (qk_fp8_lean's `qk_norm_rope_fp8_lean`, same signature) takes these inputs, else
    the reason."""
    reason = guard(_norm_rope_checks(q, k, [("wq", wq), ("wk", wk)], cos, sin, eps, (torch.bfloat16, torch.float16),
                                     v=v, ulysses_degree=ulysses_degree, head_dim=_head_dim(q, wq)))
    if reason:
        return reason
    if v is None:
        return "the FP8 path casts v too: v is required"
    if valid_len is not None and not (isinstance(valid_len, int) and 0 <= valid_len <= q.shape[1]):
        return f"valid_len {valid_len!r} must be an int in [0, S={q.shape[1]}]"
    if amax_hook is not None and not callable(amax_hook):
        return "amax_hook must be callable"
    if scales is not None:
        try:
            _static_scales(scales)
        except ValueError as e:
            return str(e)
    return None


# ---------------------------------------------------------------------------------------------- references
def _rms_norm_ref(x4, w, eps):
    return torch.nn.functional.rms_norm(x4, (x4.shape[-1],), w, eps)


def _rope_ref(x, cos, sin):
    """diffusers' `_apply_rotary_emb` for (B, S, H, D) with cos/sin (S, R) or (B, S, 1, R)."""
    R = cos.shape[-1]
    rot, rest = x[..., :R], x[..., R:]
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    if cos.dim() == 2:
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    elif cos.dim() == 3:
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    x1, x2 = rot.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((rot * cos + rotated * sin, rest), dim=-1).contiguous()


def _pack_ref(ts, U):
    """[(B,S,H,D)] * n -> (U, n, B, S, H/U, D) destination-major."""
    B, S, H, D = ts[0].shape
    x = torch.stack(ts, 0).view(len(ts), B, S, U, H // U, D)
    return x.permute(3, 0, 1, 2, 4, 5).contiguous()


def qk_norm_rope_ref(q, k, wq, wk, cos, sin, eps, v=None, ulysses_degree=1):
    """Eager diffusers sequence (norm_q/norm_k as nn.RMSNorm, `_apply_rotary_emb`), then the pack."""
    D = wq.shape[0]
    q4, k4 = _as4d(q, D), _as4d(k, D)
    outs = [_rope_ref(_rms_norm_ref(q4, wq, eps), cos, sin), _rope_ref(_rms_norm_ref(k4, wk, eps), cos, sin)]
    if v is not None:
        outs.append(_as4d(v, D).contiguous())
    if ulysses_degree == 1:
        return tuple(outs)
    return _pack_ref(outs, ulysses_degree)


def emulate_cuda_rms_norm(x4, w, eps, rsqrt: str = "rn"):
    """torch's CUDA vectorized rms-norm order in plain torch ops (the kernel's exact contract):
    sum of 4 consecutive squares per thread, then the lane tree, IEEE mean; rsqrt 'rn' = correctly rounded
    1/sqrt (what the interpreter computes); 'approx' = torch.rsqrt (on CUDA the rsqrtf eager uses)."""
    x = x4.float()
    D = x.shape[-1]
    P = next_pow2(D // 4)
    sq = (x * x).unflatten(-1, (D // 4, 4))
    s = ((sq[..., 0] + sq[..., 1]) + sq[..., 2]) + sq[..., 3]
    s = torch.nn.functional.pad(s, (0, P - D // 4))
    while s.shape[-1] > 1:
        half = s.shape[-1] // 2
        s = s[..., :half] + s[..., half:]
    # IEEE fp32 division and sqrt, computed in fp64 and rounded once (innocuous double rounding: 53 >= 2*24+2);
    # torch's CPU fp32 sqrt is not always correctly rounded.
    ms = (s.double() / D).float() + torch.tensor(eps, dtype=torch.float32)
    if rsqrt == "approx":
        r = torch.rsqrt(ms)
    else:
        r = (1.0 / torch.sqrt(ms.double()).float().double()).float()
    y = r * x
    if w is not None:
        y = w.float() * y
    return y.to(x4.dtype)


def _fp8_scales_ref(ts, valid_len, scales, amax_hook):
    if scales is None:
        amax = torch.stack([t[:, :valid_len].float().abs().amax() if valid_len > 0 else
                            torch.zeros((), device=t.device) for t in ts])
        if amax_hook is not None:
            amax_hook(amax)
        scale = torch.where(amax > 0, torch.full_like(amax, E4M3_MAX) / amax, torch.ones_like(amax))
    else:
        scale = torch.tensor(_static_scales(scales), dtype=torch.float32, device=ts[0].device)
    return scale, torch.ones_like(scale) / scale


def qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, eps, scales=None, valid_len=None, amax_hook=None,
                         ulysses_degree=1):
    """Eager norm + RoPE (identical bf16 values to `qk_norm_rope_ref`), then torch amax / scale /
    clamp / cast. Returns (q8, k8, v8, descales), or (packed (U,3,B,S,H/U,D), descales) for U > 1."""
    qo, ko, vo = qk_norm_rope_ref(q, k, wq, wk, cos, sin, eps, v=v)
    S = qo.shape[1]
    scale, descale = _fp8_scales_ref((qo, ko, vo), S if valid_len is None else valid_len, scales, amax_hook)
    outs = [(t.float() * scale[i]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
            for i, t in enumerate((qo, ko, vo))]
    if ulysses_degree == 1:
        return (*outs, descale)
    return _pack_ref([o.view(torch.uint8) for o in outs], ulysses_degree).view(torch.float8_e4m3fn), descale


# ---------------------------------------------------------------------------------------------- custom ops
def _fake_qk(q, k, wq, wk, cos, sin, eps, v, ulysses_degree):
    D = wq.shape[0]
    B, S, H, _ = _as4d(q, D).shape
    n = 2 if v is None else 3
    if ulysses_degree == 1:
        return [q.new_empty((B, S, H, D)) for _ in range(n)]
    return [q.new_empty((ulysses_degree, n, B, S, H // ulysses_degree, D))]


def _run(q, k, wq, wk, cos, sin, eps, v=None, ulysses_degree=1, **launch):
    n = 2 if v is None else 3
    outs, views, ostr = _out_buffers(_as4d(q, wq.shape[0]), n, ulysses_degree, q.dtype)
    _launch(q, k, v, wq, wk, cos, sin, eps, U=ulysses_degree, views=views, ostr=ostr, **launch)
    return outs


@custom_op("qk_norm_rope", fake=_fake_qk)
def _qk_norm_rope_op(q: torch.Tensor, k: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, eps: float, v: torch.Tensor | None, ulysses_degree: int) -> list[torch.Tensor]:
    return _run(q, k, wq, wk, cos, sin, eps, v, ulysses_degree)


def _fake_fp8_cast(q, k, v, wq, wk, cos, sin, eps, amax, static_scales, ulysses_degree):
    """The FP8 cast op's outputs (qk_fp8_lean's cast op fakes with it)."""
    D = wq.shape[0]
    B, S, H, _ = _as4d(q, D).shape
    f8 = torch.float8_e4m3fn
    d = q.new_empty((3,), dtype=torch.float32)
    if ulysses_degree == 1:
        return [q.new_empty((B, S, H, D), dtype=f8) for _ in range(3)] + [d]
    return [q.new_empty((ulysses_degree, 3, B, S, H // ulysses_degree, D), dtype=f8), d]


# ---------------------------------------------------------------------------------------------- public
def qk_norm_rope(q, k, wq, wk, cos, sin, eps, v=None, ulysses_degree=1):
    """Fused per-head RMSNorm + partial RoPE of q and k (v copied/packed). Degree 1 -> (q, k[, v]) as
    (B, S, H, D) contiguous; degree U > 1 -> one (U, n, B, S, H/U, D) destination-major tensor.
    Bit-exact vs `qk_norm_rope_ref` on CUDA (see module docstring)."""
    reason = qk_norm_rope_check(q, k, wq, wk, cos, sin, eps, v=v, ulysses_degree=ulysses_degree)
    if reason:
        raise ValueError(reason)
    outs = torch.ops.h3plan.qk_norm_rope(q, k, wq, wk, cos, sin, float(eps), v, int(ulysses_degree))
    return tuple(outs) if ulysses_degree == 1 else outs[0]


# the kernel ops of this module a lever names (SPEC.kernels): op -> (function, its check), read by table.py
OPS = {"qk_norm_rope": ("qk_norm_rope", "qk_norm_rope_check")}
