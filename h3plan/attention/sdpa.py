"""torch SDPA, called exactly as diffusers' `native` backend calls it (so the bits match).

diffusers 0.42.1 `_native_attention` permutes (B, S, H, D) -> (B, H, S, D), calls
`F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
enable_gqa=False)` and permutes back; this backend does the same, so a plan with `attention=sdpa`
is bitwise equal to diffusers' default processor. Runs on any device torch supports.
"""

from __future__ import annotations

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

