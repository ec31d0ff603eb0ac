"""Per-head Q/K RMSNorm + partial RoPE + per-tensor e4m3 cast of q, k, v (cuDNN FP8 attention's inputs):
the contract and bits of `qk_norm_rope_fp8_ref` (qk_norm_rope.py) in few instructions per element.

    qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, eps, scales=None, valid_len=None, amax_hook=None,
                          ulysses_degree=1) -> (q8, k8, v8, descales (3,)) | (packed (U,3,B,S,H/U,D), descales)

Dynamic scales take two passes (a global amax must exist before the first code is written), each lean:
- the e4m3 emit is clamp (NaN-propagating min/max) + the conversion, which rounds to nearest even and
  keeps the sign of a zero on the GPU: no compare/select clamp, no sign-bit fix-up;
- the amax pass writes one partial maximum per program and tensor (int32 bits of |y|: NaN wins, as in
  torch's amax) and torch reduces them: no atomics;
- the scales are computed once in torch (scale_from_amax, the one convention), not per program.
`LAUNCH` tiles are the H200 sweep's to pick. Why a plain two-pass kernel is bound by instruction issue, from its
SASS, and what this one was expected to reach: docs/measurements.md.

Numerics: y as qk_norm_rope.py's `_norm_rope` helper computes it for the norm + RoPE kernel; the reference
`qk_norm_rope_fp8_ref` is this kernel's oracle and fallback, its check this kernel's check.
"""

from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from h3plan.runtime.kernels import qk_norm_rope as _qk
from h3plan.runtime.kernels._common import INTERPRET, LAUNCH_OPTS, interpreter_tile, round_hw, to_f32
from h3plan.runtime.kernels._registry import custom_op
from h3plan.runtime.kernels.fp8 import E4M3, e4m3_ready, scale_from_amax

# Tiling: block_t tokens x block_h heads per program, warps. From the SM90 SASS (instructions per element,
# registers); the H200 sweep (benchmarks/probes/fp8_producers.py --sweep) should replace it.
LAUNCH = {"block_t": 1, "block_h": 8, "num_warps": 2}
SWEEP_CONFIGS = [dict(block_t=t, block_h=h, num_warps=w) for t, h, w in
                 ((1, 8, 2), (2, 8, 2), (2, 8, 4), (4, 8, 4), (1, 8, 4), (4, 8, 8))]

qk_norm_rope_fp8_lean_check = _qk.qk_norm_rope_fp8_check
qk_norm_rope_fp8_lean_ref = _qk.qk_norm_rope_fp8_ref


@triton.jit
def _emit(y, out_ptr, oo, m, sc, HW: tl.constexpr):
    z = tl.clamp(y * sc, -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)  # NaN passes, as torch.clamp
    tl.store(out_ptr + oo, e4m3_ready(z, HW).to(tl.float8e4nv), mask=m)


@triton.jit
def _amax_bits(y, valid):
    """max |y| over the valid elements of a tile, as int32 bits: NaN bits lie above +inf's."""
    return tl.max(tl.where(valid, y.to(tl.int32, bitcast=True) & 0x7FFFFFFF, 0))


@triton.jit
def _lean_kernel(
    q_ptr, k_ptr, v_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr,
    oq_ptr, ok_ptr, ov_ptr, part_ptr, scale_ptr, descale_ptr,
    T, S, H, Hl, valid_len,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh,
    scb, scs, ssb, sss,
    sou, sob, sos,
    eps, sc_q, sc_k, sc_v,
    D: tl.constexpr, D_PAD: tl.constexpr, P: tl.constexpr, R: tl.constexpr,
    BT: tl.constexpr, BH: tl.constexpr, HAS_W: tl.constexpr, IS_BF16: tl.constexpr,
    AMAX: tl.constexpr, DYNAMIC: tl.constexpr, RSQRT: tl.constexpr, REDUCTION: tl.constexpr, HW: tl.constexpr,
):
    """AMAX: partial maxima of |q|, |k|, |v| over rows s < valid_len -> part_ptr[program, 3] (int32 bits);
    else: codes with the scales at scale_ptr (DYNAMIC) or sc_q/sc_k/sc_v, descales by program 0.
    The tile's indices and the norm + RoPE are runtime/kernels/qk_norm_rope.py's (`_tile`, `_norm_rope`)."""
    HALF: tl.constexpr = R // 2
    pid_t = tl.program_id(0).to(tl.int64)
    pid_h = tl.program_id(1).to(tl.int64)
    c, b3, s3, h3, tok_ok, m, mp, pc, oo = _qk._tile(pid_t, pid_h, T, S, H, Hl, sou, sob, sos, D, D_PAD, R, BT, BH)

    cm = tok_ok & (c < R)
    cb = round_hw(tl.load(cos_ptr + b3 * scb + s3 * scs + c, mask=cm, other=0.0), IS_BF16, HW)
    sb = round_hw(tl.load(sin_ptr + b3 * ssb + s3 * sss + c, mask=cm, other=0.0), IS_BF16, HW)
    wq = 1.0
    wqp = 1.0
    wk = 1.0
    wkp = 1.0
    if HAS_W:
        wq = to_f32(tl.load(wq_ptr + c, mask=c < D, other=0.0), HW)
        wqp = to_f32(tl.load(wq_ptr + pc, mask=c < R, other=0.0), HW)
        wk = to_f32(tl.load(wk_ptr + c, mask=c < D, other=0.0), HW)
        wkp = to_f32(tl.load(wk_ptr + pc, mask=c < R, other=0.0), HW)
    valid = m & (s3 < valid_len)
    part = part_ptr + (pid_t * tl.num_programs(1) + pid_h) * 3
    if not AMAX:
        if DYNAMIC:
            sc_q = tl.load(scale_ptr + 0)
            sc_k = tl.load(scale_ptr + 1)
            sc_v = tl.load(scale_ptr + 2)
        first = (pid_t == 0) & (pid_h == 0)
        tl.store(descale_ptr + 0, tl.math.div_rn(1.0, sc_q), mask=first)
        tl.store(descale_ptr + 1, tl.math.div_rn(1.0, sc_k), mask=first)
        tl.store(descale_ptr + 2, tl.math.div_rn(1.0, sc_v), mask=first)

    y = _qk._norm_rope(q_ptr, b3 * sqb + s3 * sqs + h3 * sqh + c, b3 * sqb + s3 * sqs + h3 * sqh + pc,
                       m, mp, wq, wqp, cb, sb, c, eps, BT, BH, D, D_PAD, P, HALF, R, HAS_W, IS_BF16, RSQRT,
                       REDUCTION, HW, False)
    if AMAX:
        tl.store(part + 0, _amax_bits(y, valid))
    else:
        _emit(y, oq_ptr, oo, m, sc_q, HW)
    y = _qk._norm_rope(k_ptr, b3 * skb + s3 * sks + h3 * skh + c, b3 * skb + s3 * sks + h3 * skh + pc,
                       m, mp, wk, wkp, cb, sb, c, eps, BT, BH, D, D_PAD, P, HALF, R, HAS_W, IS_BF16, RSQRT,
                       REDUCTION, HW, False)
    if AMAX:
        tl.store(part + 1, _amax_bits(y, valid))
    else:
        _emit(y, ok_ptr, oo, m, sc_k, HW)
    y = to_f32(tl.load(v_ptr + b3 * svb + s3 * svs + h3 * svh + c, mask=m, other=0.0), HW)
    if AMAX:
        tl.store(part + 2, _amax_bits(y, valid))
    else:
        _emit(y, ov_ptr, oo, m, sc_v, HW)


def _launch(q, k, v, wq, wk, cos, sin, eps, *, U, amax_pass, views, ostr, part=None, scale=None, descale=None,
            static=(1.0, 1.0, 1.0), valid_len=0, launch=None):
    launch = _launch_config(launch)
    D = wq.shape[0]
    q4, k4, v4 = _qk._as4d(q, D), _qk._as4d(k, D), _qk._as4d(v, D)
    B, S, H, _ = q4.shape
    T = B * S
    BT, BH = launch["block_t"], launch["block_h"]
    scb, scs = _qk._cos_strides(cos)
    ssb, sss = _qk._cos_strides(sin)
    D_PAD = max(4, triton.next_power_of_2(D))
    grid = _grid(T, H, BT, BH)
    _lean_kernel[grid](
        q4, k4, v4, wq, wk, cos, sin, views[0], views[1], views[2],
        part if part is not None else q4, scale if scale is not None else q4, descale if descale is not None else q4,
        T, S, H, H // U, valid_len,
        *q4.stride()[:3], *k4.stride()[:3], *v4.stride()[:3],
        scb, scs, ssb, sss, *ostr,
        float(eps), *[float(x) for x in static],
        D=D, D_PAD=D_PAD, P=D_PAD // 4, R=cos.shape[-1], BT=BT, BH=BH, HAS_W=True,
        IS_BF16=q.dtype == torch.bfloat16, AMAX=amax_pass, DYNAMIC=scale is not None,
        RSQRT=_qk._RSQRT[_qk.NUMERICS["rsqrt"]], REDUCTION=_qk._REDUCTION[_qk.NUMERICS["reduction"]],
        HW=not INTERPRET, num_warps=launch["num_warps"], **LAUNCH_OPTS)


def _launch_config(launch=None) -> dict:
    """LAUNCH (the interpreter's token tile in place of the GPU's: `interpreter_tile`), then `launch`'s keys."""
    return {**LAUNCH, "block_t": interpreter_tile(LAUNCH["block_t"]), **(launch or {})}


def _grid(T, H, BT, BH):
    return (triton.cdiv(T, BT), triton.cdiv(H, BH))


def _amax(q, k, v, wq, wk, cos, sin, eps, valid_len, launch=None):
    D = wq.shape[0]
    B, S, H, _ = _qk._as4d(q, D).shape
    lt = _launch_config(launch)
    g = _grid(B * S, H, lt["block_t"], lt["block_h"])
    part = torch.zeros(g[0] * g[1], 3, device=q.device, dtype=torch.int32)
    if B * S and H:
        _launch(q, k, v, wq, wk, cos, sin, eps, U=1, amax_pass=True, views=[q] * 3, ostr=(0, 0, 0), part=part,
                valid_len=valid_len, launch=launch)
    if part.shape[0] == 0:
        return torch.zeros(3, device=q.device, dtype=torch.float32)
    return part.amax(0).view(torch.float32)  # non-negative floats order like their bits; NaN bits on top


def _cast(q, k, v, wq, wk, cos, sin, eps, scale, static_scales, U, launch=None):
    outs, views, ostr = _qk._out_buffers(_qk._as4d(q, wq.shape[0]), 3, U, E4M3)
    descale = torch.empty(3, device=q.device, dtype=torch.float32)
    if q.numel():
        _launch(q, k, v, wq, wk, cos, sin, eps, U=U, amax_pass=False, views=views, ostr=ostr, scale=scale,
                descale=descale, static=tuple(static_scales) if static_scales is not None else (1.0, 1.0, 1.0),
                launch=launch)
    elif scale is not None:
        descale = torch.ones_like(scale) / scale
    else:
        descale = torch.ones(3, device=q.device) / torch.tensor(static_scales, device=q.device, dtype=torch.float32)
    return [*outs, descale]


@custom_op("qk_norm_rope_fp8_lean_amax",
           fake=lambda q, k, v, wq, wk, cos, sin, eps, valid_len: q.new_empty((3,), dtype=torch.float32))
def _amax_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor,
             cos: torch.Tensor, sin: torch.Tensor, eps: float, valid_len: int) -> torch.Tensor:
    return _amax(q, k, v, wq, wk, cos, sin, eps, valid_len)


def _fake_cast(q, k, v, wq, wk, cos, sin, eps, scale, static_scales, ulysses_degree):
    return _qk._fake_fp8_cast(q, k, v, wq, wk, cos, sin, eps, scale, static_scales, ulysses_degree)


@custom_op("qk_norm_rope_fp8_lean_cast", fake=_fake_cast)
def _cast_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor,
             cos: torch.Tensor, sin: torch.Tensor, eps: float, scale: torch.Tensor | None,
             static_scales: list[float] | None, ulysses_degree: int) -> list[torch.Tensor]:
    return _cast(q, k, v, wq, wk, cos, sin, eps, scale, static_scales, ulysses_degree)


def qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, eps, scales=None, valid_len=None,
                          amax_hook: Callable[[torch.Tensor], None] | None = None, ulysses_degree=1):
    """The FP8 cast's contract and bits (dynamic: partial-amax pass, `amax_hook(amax)` may all-reduce the
    (3,) fp32 amax in place, then the cast pass; static: `scales` (3,)). Returns (q8, k8, v8, descales), or
    (packed (U,3,B,S,H/U,D), descales) for U > 1; ValueError(reason) on refused inputs."""
    reason = qk_norm_rope_fp8_lean_check(q, k, v, wq, wk, cos, sin, eps, scales=scales, valid_len=valid_len,
                                         amax_hook=amax_hook, ulysses_degree=ulysses_degree)
    if reason:
        raise ValueError(reason)
    if scales is not None:
        scale, static = None, list(_qk._static_scales(scales))
    else:
        S = _qk._as4d(q, wq.shape[0]).shape[1]
        amax = torch.ops.h3plan.qk_norm_rope_fp8_lean_amax(q, k, v, wq, wk, cos, sin, float(eps),
                                                           S if valid_len is None else int(valid_len))
        if amax_hook is not None:
            amax_hook(amax)
        scale, static = scale_from_amax(amax), None
    outs = torch.ops.h3plan.qk_norm_rope_fp8_lean_cast(q, k, v, wq, wk, cos, sin, float(eps), scale, static,
                                                       int(ulysses_degree))
    return tuple(outs)


# the kernel ops of this module a lever names (SPEC.kernels): op -> (function, its check), read by table.py;
# the lean FP8 cast: the bits of a two-pass norm + RoPE + cast in fewer instructions (0.95 vs 1.21 ms dynamic
# at 19,000 on the H200, bit-identical: benchmarks/results/probes/fp8-producers-h200.json)
OPS = {"qk_norm_rope_fp8": ("qk_norm_rope_fp8_lean", "qk_norm_rope_fp8_lean_check")}
