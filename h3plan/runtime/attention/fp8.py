"""Per-tensor FP8 (e4m3) scales for cuDNN FP8 attention, and a torch emulation of its numerics.

Convention (the same as h3plan.runtime.kernels.qk_norm_rope's FP8 cast, so both paths give the same codes):
scale = 448 / amax (1 when amax == 0), codes = e4m3(clamp(x * scale, +-448)) with round-to-nearest-
even, and `descale` = 1 / scale is the dequantisation multiplier (real ~= code * descale). Static
scales come from a calibrated amax table with a margin: scale = 448 / (amax * margin).

Output scale (scale_o): softmax rows sum to 1, so every output row is a convex combination of V rows
and |O| <= amax(V). scale_o = 448 / amax(V) = 1 / descale_v therefore never overflows and puts the
largest possible |O| at the top of the e4m3 range; the output is dequantised with descale_o = descale_v
(scale_o = 1 pushes small |O| into e4m3 subnormals: docs/measurements.md). The bf16 dequantised output carries about
2^-4 relative rounding per element from the e4m3 output on top of the Q/K/V/P quantisation; this is the lossy part of
the cudnn_fp8 lever.
"""

from __future__ import annotations

import math

import torch

from h3plan.runtime.kernels.fp8 import E4M3, E4M3_MAX, quantize as cast, scale_from_amax


def _amax(x: torch.Tensor) -> torch.Tensor:
    return x.abs().amax().float()


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 codes of x * scale (fp32 math, round to nearest even, saturated to +-448)."""
    return (x.float() * scale).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3)


def quantize_qkv(q, k, v, descales: torch.Tensor | None = None, amax: torch.Tensor | None = None):
    """(q8, k8, v8, descales (3,) fp32): dynamic per-tensor scales from the tensors' own amax, or from `amax`
    (3,) fp32 when given (the amax over more than these tensors: the whole sequence under Ulysses), unless
    `descales` (static) is given. Dynamic scales on contiguous CUDA tensors use the Triton cast
    (h3plan.runtime.kernels.fp8, same bits as the torch path)."""
    if descales is None:
        if q.is_cuda and all(t.is_contiguous() for t in (q, k, v)):
            fns = [None] * 3 if amax is None else [(lambda x, a=a: a) for a in amax.float().unbind(0)]
            (q8, dq), (k8, dk), (v8, dv) = (cast(t, fn) for t, fn in zip((q, k, v), fns))
            return q8, k8, v8, torch.stack([dq, dk, dv])
        own = torch.stack([_amax(q), _amax(k), _amax(v)]) if amax is None else amax.float()
        scales = scale_from_amax(own)
    else:
        scales = torch.ones_like(descales) / descales
    d = torch.ones_like(scales) / scales
    return quantize(q, scales[0]), quantize(k, scales[1]), quantize(v, scales[2]), d


def emulate(q, k, v, descales=None, scale_o: float | torch.Tensor | None = None, out_dtype=torch.bfloat16, amax=None):
    """What cuDNN's FP8 forward computes, in torch, for CPU tests of the scale bookkeeping (not bits).

    q, k, v (B, S, H, D). P is flash-style unnormalised exp(s - rowmax) in [0, 1], quantised with
    scale_s = 448; O is normalised by the fp32 row sum, then quantised with scale_o (default
    1 / descale_v, see the module docstring) and dequantised. cuDNN's internal order is not published:
    results agree with it to rounding, not bit for bit.
    """
    if q.dtype == E4M3:
        q8, k8, v8, d = q, k, v, descales
    else:
        q8, k8, v8, d = quantize_qkv(q, k, v, descales, amax=amax)
    qf, kf, vf = (t.float().permute(0, 2, 1, 3) for t in (q8, k8, v8))
    s = (qf @ kf.transpose(-1, -2)) * (d[0] * d[1] / math.sqrt(q.shape[-1]))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    p8 = (p * E4M3_MAX).to(E4M3).float()
    o = (p8 @ vf) * (d[2] / E4M3_MAX) / p.sum(-1, keepdim=True)
    so = (1.0 / d[2]) if scale_o is None else torch.as_tensor(scale_o, dtype=torch.float32)
    o8 = (o * so).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return (o8.float() / so).permute(0, 2, 1, 3).to(out_dtype)
