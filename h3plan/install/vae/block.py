"""The plan-driven forward of diffusers' MiniMaxH3VideoTransformerBlock (the VAE's ViT decoder blocks).

Mathematically diffusers' `MiniMaxH3VideoTransformerBlock.forward` with `MiniMaxH3VideoAttnProcessor`
inlined (diffusers 0.42.1), op for op, in the dtype the block's linears hold (float32 as released, or the
dtype vae_precision cast them to at install) and under whatever autocast the caller runs. `plan_vae_block_forward`
calls the block's sites (runtime/vae_sites.py: the attention's norm + RoPE, the SwiGLU, the scaled residuals) and names
no lever: at install, `vae_block_sites` composes them from diffusers' ops and the runtime module of each VAE block lever
whose options the plan sets (h3plan/runtime/levers/<lever>.py: `settle`, `wrap`, `swaps`), in the one order
levers/rules.py `VAE_BLOCK_SITES` declares. Each lever's op runs its kernel behind the kernel's check and counts under
its own counter; a refused call runs diffusers' expression, exact, at diffusers' speed (nothing is read from host
memory).

vae_tiles' FP8 decode (`tile_dtype` fp8, fp8.py; with or without a site lever) stays here, per block: where the decoder
computes in float16 (float16 linears, or FP16 autocast) the six linears run as FP8 GEMMs (e4m3 rows x per-channel e4m3
weights, float16 out; lossy), counted `vae_tiles.fp8_gemm` / `vae_tiles.fp8_rows` per linear; any other call runs the
linears as they are, exact, counted as one `vae_tiles.fp8_gemm` fallback per block call.

The attention runs inline (its linears and the sites) where a site lever set the norm + RoPE or the linears are FP8,
and only under diffusers' own processor; under another the block runs its attention module and counts why
(`sites.refused`, the FP8 counter). Module hooks on the bypassed submodules (attn, the linears, ff) do not fire on
inline paths; the installer refuses blocks that carry hooks.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import torch

from h3plan.facts.blocks import VAE_BLOCK_LINEARS
from h3plan.runtime.guards import count_route
from h3plan.levers import SPECS, rules
from h3plan.runtime.quant.fp8 import FP8Linear
from h3plan.runtime.vae_sites import VaeBlockSites, eager_activate, eager_norm_rope

from .fp8 import COUNTER as FP8_COUNTER, Fp8Gemms, fp8_linear
from .weights import FP16

LINEARS = VAE_BLOCK_LINEARS


def _am():
    import diffusers.models.autoencoders.autoencoder_kl_minimax_h3 as am

    return am


@dataclass
class VaeBlockState:
    sites: VaeBlockSites = field(default_factory=VaeBlockSites)  # shared by every block (vae_block_sites)
    fp8: Fp8Gemms | None = None  # vae_tiles tile_dtype fp8: the block's linears as FP8 GEMMs


def vae_block_sites(opts, dtype, skipped: list) -> tuple[list[str], VaeBlockSites, list[tuple[str, str, str, str]]]:
    """The decoder block forward's sites for the plan's VAE options `opts` (install/options.py's view): diffusers' ops,
    wrapped by the runtime module of each lever of levers/rules.py `VAE_BLOCK_SITES` (in that order) whose VAE options
    the plan sets, each handed its own options as it settles them for `dtype`, the dtype the decode runs in (what it
    leaves to diffusers goes to `skipped` as (`<lever>.<part>`, why)), and the blocks' kernel dict. Returns (the levers
    composed, the sites, the swaps each logs per block: (lever, where after the block's fqn, old, new))."""
    sites = VaeBlockSites()
    kernels: dict[str, Any] = {}
    levers: list[str] = []
    swaps: list[tuple[str, str, str, str]] = []
    for lever in rules.VAE_BLOCK_SITES:
        declared = [o for o in SPECS[lever].options if o.scope == "vae"]
        own = {o.key: getattr(opts, o.key) for o in declared}
        if all(own[o.key] == o.default for o in declared):
            continue
        module = importlib.import_module(f"h3plan.runtime.levers.{lever}")
        own, left = module.settle(own, dtype)
        skipped.extend((f"{lever}.{part}", why) for part, why in left)
        sites = module.wrap(sites, own, kernels)
        levers.append(lever)
        swaps.extend((lever, *swap) for swap in module.swaps(own))
    return levers, sites, swaps


def processor_reason(attn) -> str | None:
    proc = attn.processor
    if type(proc) is not _am().MiniMaxH3VideoAttnProcessor:
        return f"attention processor is {type(proc).__name__}, not diffusers' MiniMaxH3VideoAttnProcessor"
    if getattr(proc, "_parallel_config", None) is not None:
        return "context-parallel attention (processor._parallel_config) keeps diffusers' processor"
    return None


def _weights(st: VaeBlockState, block, x):
    """(per linear an FP8Linear, or None for the modules' own parameters; the normed inputs' dtype)."""
    if st.fp8 is not None and (gemms := st.fp8.route(x)) is not None:
        return gemms, FP16
    from diffusers.models.modeling_utils import get_parameter_dtype

    return None, get_parameter_dtype(block.attn.to_q)


def _linear(module, x, w):
    if w is not None and module in w:
        return fp8_linear(x, w[module])
    return module(x)


def _attention(sites: VaeBlockSites, attn, x, rotary_emb, w, reason):
    if reason is not None or (sites.norm_rope is None and w is None):
        if reason is not None:
            sites.refused(reason)  # a site lever's norm + RoPE does not run: it counts why
        if reason is not None and w is not None and isinstance(w.get(attn.to_q), FP8Linear):
            count_route(FP8_COUNTER, reason)  # the attention's four linears keep their module forwards
        return attn(x, rotary_emb)
    proc = attn.processor
    # (B, S, dim) -> (B, S, H, D) views of the projections, as the processor makes them
    q = _linear(attn.to_q, x, w).unflatten(2, (attn.heads, -1))
    k = _linear(attn.to_k, x, w).unflatten(2, (attn.heads, -1))
    v = _linear(attn.to_v, x, w).unflatten(2, (attn.heads, -1))
    q, k = (sites.norm_rope or eager_norm_rope)(attn, q, k, rotary_emb)
    out = _am().dispatch_attention_fn(q, k, v, attn_mask=None, backend=proc._attention_backend,
                                      parallel_config=proc._parallel_config)
    return _linear(attn.to_out[0], out.flatten(2, 3), w)


def _feed_forward(sites: VaeBlockSites, ff, x, w):
    if sites.activate is None and w is None:
        return ff(x)
    proj = _linear(ff.net[0].proj, x, w)
    h = (sites.activate or eager_activate)(ff, proj)
    for module in ff.net[1:]:
        h = _linear(module, h, w) if isinstance(module, torch.nn.Linear) else module(h)
    return h


def plan_vae_block_forward(self, hidden_states: torch.Tensor, rotary_emb=None) -> torch.Tensor:
    """A decoder block's forward under its `h3plan.<lever>` hook (install.py); its sites and FP8 GEMMs in
    `self._h3plan_vae`."""
    st: VaeBlockState = self._h3plan_vae
    sites = st.sites
    needs_proc = st.fp8 is not None or sites.norm_rope is not None
    reason = processor_reason(self.attn) if needs_proc else None
    w, compute_dtype = _weights(st, self, hidden_states)

    norm_hidden_states = self.norm1(hidden_states.float()).to(compute_dtype)
    y = _attention(sites, self.attn, norm_hidden_states, rotary_emb, w, reason)
    hidden_states = sites.residual(hidden_states, y, self.scale1)
    norm_hidden_states = self.norm2(hidden_states.float()).to(compute_dtype)
    y = _feed_forward(sites, self.ff, norm_hidden_states, w)
    return sites.residual(hidden_states, y, self.scale2)
