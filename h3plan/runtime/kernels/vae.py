"""VAE decoder kernels of MiniMax-H3 (`AutoencoderKLMiniMaxH3`'s ViT decoder, FP16 under autocast).

`vae_qk_norm_rope(q, k, cos, sin, eps)`: what `MiniMaxH3VideoAttnProcessor` does between `to_q`/`to_k` and
attention: `norm_q(q.float()).to(q.dtype)` (RMSNorm without affine, in fp32) then rotate-half RoPE over
the first R = cos.shape[-1] channels (48 of 64 at the default config) with cos/sin cast to q's dtype.
q, k (B, S, H, D) in the decode's dtype (fp16, bf16 or fp32: no rounding step there) with any batch/row/head
strides and a contiguous last dim;
cos/sin fp32 (B, S, 1, R) as `MiniMaxH3VideoRotaryPosEmbed` returns them (or (S, R)). Returns
(q, k) (B, S, H, D) contiguous.

`scaled_residual(h, y, scale)`: the block's `h + y * scale` with h fp32 (fp16 at the first block, whose
input comes out of `proj_in` under autocast), y the fp16 attention / FFN output and scale the fp32
`scale1`/`scale2` (dim,). Eager promotes: p = float(y) * scale rounded to fp32, then float(h) + p rounded
to fp32; the kernel does the same two roundings with FMA contraction disabled. Output fp32.

Fallback: `<op>_check` names the reason a call is refused and the installer runs `<op>_ref` (the eager
expressions). Numerics: bit-exact vs eager on CUDA; the norm reproduces torch's CUDA fused rms-norm
order (see qk_norm_rope.py), so on the CPU the norm matches eager within 1 fp16 ulp on ~5e-5 of
elements and matches `emulate_cuda_rms_norm` exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import INTERPRET, LAUNCH_OPTS, guard, next_pow2
from ._registry import custom_op
from .qk_norm_rope import _launch, _norm_rope_checks, _out_buffers


# q/k the fused norm + RoPE takes (fp32: torch reduces in another order, benchmarks/probes/vae_fp32_ops.py)
QK_DTYPES = (torch.float16, torch.bfloat16)
RESIDUAL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # y (the attention / FFN output) scaled_residual takes


# ---------------------------------------------------------------------------------------------- qk norm + rope
def vae_qk_norm_rope_check(q, k, cos, sin, eps) -> str | None:
    """None when the kernel takes these inputs, else the one-line reason."""
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        return f"q must be a (B, S, H, D) tensor, got {getattr(q, 'shape', type(q).__name__)}"
    return guard(_norm_rope_checks(q, k, [], cos, sin, eps, QK_DTYPES, head_dim=int(q.shape[-1])))


def vae_qk_norm_rope_ref(q, k, cos, sin, eps):
    """The processor's eager sequence (its RMSNorm runs in fp32 whatever autocast says)."""
    def one(x):
        D = x.shape[-1]
        x = torch.nn.functional.rms_norm(x.float(), (D,), None, eps).to(x.dtype)
        c, s = cos.to(x.dtype), sin.to(x.dtype)
        if c.dim() == 2:
            c, s = c[None, :, None, :], s[None, :, None, :]
        elif c.dim() == 3:
            c, s = c[:, :, None, :], s[:, :, None, :]
        R = c.shape[-1]
        rot, rest = x[..., :R], x[..., R:]
        first, second = rot.chunk(2, dim=-1)
        rotated = torch.cat([-second, first], dim=-1)
        return torch.cat([rot * c + rotated * s, rest], dim=-1)
    return one(q), one(k)


@custom_op("vae_qk_norm_rope", fake=lambda q, k, cos, sin, eps: [q.new_empty(q.shape), q.new_empty(q.shape)])
def _vae_qk_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               eps: float) -> list[torch.Tensor]:
    outs, views, ostr = _out_buffers(q, 2, 1, q.dtype)
    _launch(q, k, None, None, None, cos, sin, eps, U=1, views=views, ostr=ostr)
    return outs


def vae_qk_norm_rope(q, k, cos, sin, eps):
    """Fused fp32 RMSNorm (no affine) -> storage dtype -> RoPE for the VAE decoder's q and k. Exact."""
    reason = vae_qk_norm_rope_check(q, k, cos, sin, eps)
    if reason:
        raise ValueError(reason)
    return tuple(torch.ops.h3plan.vae_qk_norm_rope(q, k, cos, sin, float(eps)))


# ---------------------------------------------------------------------------------------------- scaled residual
@triton.jit
def _scaled_residual_kernel(h_ptr, y_ptr, s_ptr, o_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1).to(tl.int64)
    rows = pid_m * BM + tl.arange(0, BM).to(tl.int64)
    cols = pid_n * BN + tl.arange(0, BN).to(tl.int64)
    cm = cols < N
    m = (rows < M)[:, None] & cm[None, :]
    off = rows[:, None] * N + cols[None, :]
    sc = tl.load(s_ptr + cols, mask=cm, other=0.0)
    y = tl.load(y_ptr + off, mask=m, other=0.0).to(tl.float32)
    h = tl.load(h_ptr + off, mask=m, other=0.0).to(tl.float32)
    p = y * sc[None, :]  # rounded to fp32 on its own: no FMA (enable_fp_fusion=False)
    tl.store(o_ptr + off, h + p, mask=m)


def scaled_residual_check(h, y, scale) -> str | None:
    def checks():
        for name, t in (("h", h), ("y", y), ("scale", scale)):
            yield isinstance(t, torch.Tensor), f"{name} is not a tensor"
        dev = h.device
        yield (dev.type == "cuda" or (INTERPRET and dev.type == "cpu"),
               f"h is on {dev.type}; Triton needs CUDA (or TRITON_INTERPRET=1 on the CPU)")
        yield h.dtype in (torch.float32, torch.float16, torch.bfloat16), f"h dtype {h.dtype} not supported"
        yield y.dtype in RESIDUAL_DTYPES, f"y dtype {y.dtype} not supported"
        yield (scale.dtype == torch.float32,
               f"scale dtype {scale.dtype} must be float32 (diffusers keeps scale1/scale2 in fp32)")
        yield y.device == dev and scale.device == dev, "h, y and scale must be on one device"
        yield h.dim() >= 1 and y.shape == h.shape, f"y shape {tuple(y.shape)} != h shape {tuple(h.shape)}"
        yield (scale.dim() == 1 and scale.shape[0] == h.shape[-1],
               f"scale must be ({h.shape[-1]},), got {tuple(scale.shape)}")
        for name, t in (("h", h), ("y", y), ("scale", scale)):
            yield t.is_contiguous(), f"{name} is not contiguous (strides {tuple(t.stride())})"
        yield h.numel() < 2**62, "tensor too large for int64 offsets"
    return guard(checks())


def scaled_residual_ref(h, y, scale):
    return h + y * scale


@custom_op("scaled_residual", fake=lambda h, y, scale: h.new_empty(h.shape, dtype=torch.float32))
def _scaled_residual_op(h: torch.Tensor, y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    out = torch.empty(h.shape, device=h.device, dtype=torch.float32)
    N = h.shape[-1]
    M = h.numel() // N if N else 0
    if M and N:
        BN = min(next_pow2(N), 1024)
        BM = max(1, 4096 // BN)
        _scaled_residual_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN))](
            h, y, scale, out, M, N, BM=BM, BN=BN, num_warps=8, **LAUNCH_OPTS)
    return out


def scaled_residual(h, y, scale):
    """h + y * scale with eager's promotion and rounding (fp32 result). Exact."""
    reason = scaled_residual_check(h, y, scale)
    if reason:
        raise ValueError(reason)
    return torch.ops.h3plan.scaled_residual(h, y, scale)


# the kernel ops of this module a lever names (SPEC.kernels): op -> (function, its check), read by table.py
OPS = {"vae_qk_norm_rope": ("vae_qk_norm_rope", "vae_qk_norm_rope_check"),
       "vae_scaled_residual": ("scaled_residual", "scaled_residual_check")}
