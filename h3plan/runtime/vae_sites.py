"""The call sites of the plan's VAE decoder block forward (install/vae/block.py `plan_vae_block_forward`), which calls
them and nothing else of a lever's: each is diffusers' op, or none, until a lever that changes it wraps it.

`VaeBlockSites()` is diffusers' `MiniMaxH3VideoTransformerBlock.forward` with `MiniMaxH3VideoAttnProcessor` inlined
(diffusers 0.42.1): norm_q / norm_k in float32, then partial rotate-half RoPE (`eager_norm_rope`), the SwiGLU of
ff.net.0's projection (`eager_activate`), `h + y * scale` (`scaled_residual`). At install, each VAE block lever whose
options the plan sets wraps the sites it changes, in the order of h3plan/levers/rules.py `VAE_BLOCK_SITES` (its runtime
module h3plan/runtime/levers/<lever>.py: `wrap(sites, options, kernels) -> sites`, handed its own VAE options and the
blocks' kernel dict, which it fills with the ops it runs; they are looked up per call, so a kernel patched in that
dict is the one that runs).

`norm_rope` and `activate` are None until a lever sets them: the block then runs diffusers' attention module and
FeedForward whole (unless the FP8 linears need them inline, install/vae/fp8.py), and a set `norm_rope` runs the
attention inline, which only diffusers' own processor allows; where the block finds another, `refused(reason)` counts
what the lever's site skipped. Every site is a plain function shared by all blocks (the modules come as arguments).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

Fn = Callable[..., Any]


def rope(x, cos, sin):
    """diffusers' VAE RoPE, rotate-half on the first cos.shape[-1] channels of x's last dim, the rest passed through."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    first, second = rot.chunk(2, dim=-1)
    return torch.cat([rot * cos + torch.cat([-second, first], dim=-1) * sin, rest], dim=-1)


def eager_norm_rope(attn, q, k, rotary_emb):
    """norm_q / norm_k in float32, cast back, then RoPE where a rotary embedding is passed; q, k: (B, S, H, D)."""
    qn = attn.norm_q(q.float()).to(q.dtype)
    kn = attn.norm_k(k.float()).to(k.dtype)
    if rotary_emb is None:
        return qn, kn
    return rope(qn, *rotary_emb), rope(kn, *rotary_emb)


def eager_activate(ff, proj):
    """diffusers' SwiGLU of ff.net.0's projection: hidden * activation(gate)."""
    hidden, gate = proj.chunk(2, dim=-1)
    return hidden * ff.net[0].activation(gate)


def scaled_residual(h, y, scale):
    """h + y * scale (the block's scale1 / scale2)."""
    return h + y * scale


def nothing(*args) -> None:
    return None


@dataclass(frozen=True)
class VaeBlockSites:
    """The VAE decoder block forward's sites (module docstring).

    norm_rope(attn, q, k, rotary_emb) -> (q, k): the attention's norm + RoPE; None: diffusers' attention module runs.
    refused(reason): where a set `norm_rope` cannot run because the attention's processor is not diffusers'.
    activate(ff, proj): the SwiGLU of ff.net.0's projection; None: diffusers' FeedForward runs.
    residual(h, y, scale): the scaled residuals after the attention and the feed-forward.
    """

    norm_rope: Optional[Fn] = None
    refused: Fn = nothing
    activate: Optional[Fn] = None
    residual: Fn = scaled_residual


__all__ = ["VaeBlockSites", "eager_activate", "eager_norm_rope", "nothing", "rope", "scaled_residual"]
