"""The plan-driven forward of diffusers' MiniMaxH3VideoTransformerBlock (the VAE's ViT decoder blocks).

Mathematically diffusers' `MiniMaxH3VideoTransformerBlock.forward` with `MiniMaxH3VideoAttnProcessor`
inlined (diffusers 0.42.1), op for op, in the dtype the block's linears hold (float32 as released, or the
dtype vae_precision cast them to at install) and under whatever autocast the caller runs. What it routes:

- vae_tiles' FP8 decode (`tile_dtype` fp8, fp8.py; with or without vae_ops): where the decoder
  computes in float16 (float16 linears, or FP16 autocast) the six linears run as FP8 GEMMs (e4m3 rows x
  per-channel e4m3 weights, float16 out; lossy); any other call runs the linears as they are, exact,
  counted as a `vae_tiles.fp8_gemm` fallback.
- qk_norm_rope, swiglu, scaled_residual (vae_ops): h3plan.runtime.kernels (vae_qk_norm_rope, swiglu,
  scaled_residual) behind their `<op>_check`; a refused call runs diffusers' expression. The installer
  installs only the ops whose kernel takes the dtype the decode runs in (install.py), so a planned decode
  never falls back per call.

Counters, per block call: one `vae_ops.<op>.fused` or `.fallback` (with the reason) for qk_norm_rope and
swiglu, two for scaled_residual; a block call that runs FP8 GEMMs counts `vae_tiles.fp8_gemm` /
`vae_tiles.fp8_rows` per linear. Every fallback is diffusers' own code on the parameters as they are:
exact, and at diffusers' speed (nothing is read from host memory).
Module hooks on the bypassed submodules (attn, the linears, ff) do not fire on fused paths; the
installer refuses blocks that carry hooks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from h3plan.facts.blocks import VAE_BLOCK_LINEARS
from h3plan.runtime.kernels.table import kernel, ops as kernel_ops
from h3plan.runtime.guards import count_route, run_guarded
from h3plan.levers import SPECS, counter, owner
from h3plan.runtime.quant.fp8 import FP8Linear

from .fp8 import COUNTER as FP8_COUNTER, Fp8Gemms, fp8_linear
from .weights import FP16

OPS = SPECS[owner("ops")].routes  # the ops vae_ops may install, each counted on its own (vae_ops.<op>)
OP_COUNTERS = {op: counter("ops", op) for op in OPS}

LINEARS = VAE_BLOCK_LINEARS


def load_kernels(ops) -> dict[str, tuple[Callable, Callable]]:
    """op -> (fn, check) for the ops with a kernel (vae_ops' SPEC.kernels, keyed `vae_<op>`)."""
    return {op: kernel(f"vae_{op}") for op in ops if f"vae_{op}" in kernel_ops()}


def _am():
    import diffusers.models.autoencoders.autoencoder_kl_minimax_h3 as am

    return am


@dataclass
class VaeBlockState:
    ops: frozenset
    kernels: dict[str, Any]
    fp8: Fp8Gemms | None = None  # vae_tiles tile_dtype fp8: the block's linears as FP8 GEMMs


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


def _rope(x, cos, sin):
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    first, second = rot.chunk(2, dim=-1)
    return torch.cat([rot * cos + torch.cat([-second, first], dim=-1) * sin, rest], dim=-1)


def _qk(st, attn, q, k, rotary_emb):
    def eager():
        qn = attn.norm_q(q.float()).to(q.dtype)
        kn = attn.norm_k(k.float()).to(k.dtype)
        if rotary_emb is None:
            return qn, kn
        return _rope(qn, *rotary_emb), _rope(kn, *rotary_emb)

    if "qk_norm_rope" not in st.ops:
        return eager()
    fn, check = st.kernels["qk_norm_rope"]
    eps = attn.norm_q.eps

    def guard():
        if rotary_emb is None:
            return "no rotary embedding"
        if eps is None or attn.norm_k.eps != eps:
            return f"norm_q/norm_k eps {eps!r}/{attn.norm_k.eps!r}: the kernel takes one explicit eps"
        return check(q, k, rotary_emb[0], rotary_emb[1], eps)

    return run_guarded(OP_COUNTERS["qk_norm_rope"], guard, lambda: fn(q, k, rotary_emb[0], rotary_emb[1], eps), eager,
                       (q, k))


def _attention(st, attn, x, rotary_emb, w, reason):
    if reason is not None or ("qk_norm_rope" not in st.ops and w is None):
        if reason is not None and "qk_norm_rope" in st.ops:
            count_route(OP_COUNTERS["qk_norm_rope"], reason)
        if reason is not None and w is not None and isinstance(w.get(attn.to_q), FP8Linear):
            count_route(FP8_COUNTER, reason)  # the attention's four linears keep their module forwards
        return attn(x, rotary_emb)
    proc = attn.processor
    # (B, S, dim) -> (B, S, H, D) views of the projections, as the processor makes them
    q = _linear(attn.to_q, x, w).unflatten(2, (attn.heads, -1))
    k = _linear(attn.to_k, x, w).unflatten(2, (attn.heads, -1))
    v = _linear(attn.to_v, x, w).unflatten(2, (attn.heads, -1))
    q, k = _qk(st, attn, q, k, rotary_emb)
    out = _am().dispatch_attention_fn(q, k, v, attn_mask=None, backend=proc._attention_backend,
                                      parallel_config=proc._parallel_config)
    return _linear(attn.to_out[0], out.flatten(2, 3), w)


def _feed_forward(st, ff, x, w):
    if "swiglu" not in st.ops and w is None:
        return ff(x)
    act = ff.net[0]
    proj = _linear(act.proj, x, w)

    def eager():
        hidden, gate = proj.chunk(2, dim=-1)
        return hidden * act.activation(gate)

    if "swiglu" in st.ops:
        fn, check = st.kernels["swiglu"]
        h = run_guarded(OP_COUNTERS["swiglu"], lambda: check(proj), lambda: fn(proj), eager, (proj,))
    else:
        h = eager()
    for module in ff.net[1:]:
        h = _linear(module, h, w) if isinstance(module, torch.nn.Linear) else module(h)
    return h


def _residual(st, h, y, scale):
    def eager():
        return h + y * scale

    if "scaled_residual" not in st.ops:
        return eager()
    fn, check = st.kernels["scaled_residual"]
    return run_guarded(OP_COUNTERS["scaled_residual"], lambda: check(h, y, scale), lambda: fn(h, y, scale), eager,
                       (h, y, scale))


def plan_vae_block_forward(self, hidden_states: torch.Tensor, rotary_emb=None) -> torch.Tensor:
    """A decoder block's forward under its `h3plan.<lever>` hook (install.py); options in `self._h3plan_vae`."""
    st: VaeBlockState = self._h3plan_vae
    needs_proc = st.fp8 is not None or "qk_norm_rope" in st.ops
    reason = processor_reason(self.attn) if needs_proc else None
    w, compute_dtype = _weights(st, self, hidden_states)

    norm_hidden_states = self.norm1(hidden_states.float()).to(compute_dtype)
    y = _attention(st, self.attn, norm_hidden_states, rotary_emb, w, reason)
    hidden_states = _residual(st, hidden_states, y, self.scale1)
    norm_hidden_states = self.norm2(hidden_states.float()).to(compute_dtype)
    y = _feed_forward(st, self.ff, norm_hidden_states, w)
    return _residual(st, hidden_states, y, self.scale2)
