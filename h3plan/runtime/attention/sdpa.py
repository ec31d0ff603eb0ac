"""torch SDPA, called exactly as diffusers' `native` backend calls it (so the bits match).

diffusers 0.42.1 `_native_attention` permutes (B, S, H, D) -> (B, H, S, D), calls
`F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
enable_gqa=False)` and permutes back; this backend does the same, so a plan with `attention=sdpa`
is bitwise equal to diffusers' default processor. Runs on any device torch supports.

Ring blocks (h3plan/runtime/parallel/lse.py) through torch's own kernels, which return their log-sum-exp:
`sdpa_flash_lse` (`aten._scaled_dot_product_flash_attention`, the sdpa backend's) and `sdpa_cudnn_lse`
(`aten._scaled_dot_product_cudnn_attention` with compute_log_sumexp, the cudnn_bf16 backend's; some torch
versions give the lse as (B, h, Lq, 1): it is reshaped). Both CUDA, bf16/fp16, head_dim <= 256.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import AttentionBackend, write_out


class SDPABackend(AttentionBackend):
    name = "sdpa"

    def __call__(self, q, k, v, out=None):
        q, k, v = (x.permute(0, 2, 1, 3) for x in (q, k, v))
        o = F.scaled_dot_product_attention(
            query=q, key=k, value=v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
        )
        return write_out(o.permute(0, 2, 1, 3), out)



def sdpa_flash_lse(q, k, v):
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, False, False)[:2]
    return o.transpose(1, 2), lse.float()


def _head_dim_reason(name, q) -> str | None:
    D = q.shape[-1]
    return f"{name} needs head_dim <= 256 and a multiple of 8, got {D}" if D > 256 or D % 8 else None


def sdpa_flash_lse_reason(q) -> str | None:
    return _head_dim_reason("sdpa_flash", q)


def sdpa_cudnn_lse(q, k, v):
    o, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, True, 0.0, False, False)[:2]
    B, Lq, h, _ = q.shape
    return o.transpose(1, 2), lse.float().reshape(B, h, Lq)


def sdpa_cudnn_lse_reason(q) -> str | None:
    reason = _head_dim_reason("sdpa_cudnn", q)
    if reason:
        return reason
    op = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
    if op is None or "compute_log_sumexp" not in str(op.default._schema):
        return "this torch has no _scaled_dot_product_cudnn_attention with compute_log_sumexp"
    if not torch.backends.cudnn.is_available():
        return "cuDNN is not available to torch"
    return None
