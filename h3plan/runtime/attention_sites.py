"""The call sites of the plan's attention processor (install/processor.py `H3PlanAttnProcessor`), which calls them and
nothing else of a lever's: each is diffusers' op, or none, until a lever that changes it wraps it.

`AttentionSites()` is diffusers' `MiniMaxH3AttnProcessor` (diffusers 0.42.1) around the plan's backend: per-head
RMSNorm of q and k and partial rotate-half RoPE through the attention's own modules, no FP8 codes, FP8 scales taken
per call. At install, each attention lever whose options the plan changes wraps the sites it changes, in the order of
h3plan/levers/rules.py `ATTENTION_SITES` (its runtime module h3plan/runtime/levers/<lever>.py:
`wrap(sites, opts, kernels) -> sites`, handed the plan's attention options and the processors' kernel dict, which it
fills with the ops it runs; they are looked up per call, so a kernel patched in that dict is the one that runs).

Every site is a plain function shared by all processors (the attention module and tensors come as arguments, the
processor where a site reads its per-layer state), and every choice between sites is made here at install, not per
call. The Ulysses exchange's options are a site too: each lever that tunes the exchange adds its own
(`exchange_options`), and install builds the exchange with them; the projection exchange runs in the packed one's place
(`projection_exchange`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

Fn = Callable[..., Any]


def eager_norm_rope(attn, q, k, rotary_emb):
    """diffusers' norm_q / norm_k, then RoPE where a rotary embedding is passed."""
    q, k = attn.norm_q(q), attn.norm_k(k)
    if rotary_emb is not None:
        q, k = _apply_rotary_emb(q, *rotary_emb), _apply_rotary_emb(k, *rotary_emb)
    return q, k


def no_projection_kernel(*args) -> Optional[str]:
    return "no fused QK-norm + RoPE kernel installed: the projection exchange runs it per destination"


def nothing(*args) -> None:
    return None


def exchange_defaults(group) -> dict[str, Any]:
    """No options: the Ulysses exchange's own defaults."""
    return {}


def with_options(exchange_options: Fn, **options) -> Fn:
    """`exchange_options`, then these."""

    def wrapped(group) -> dict[str, Any]:
        return {**exchange_options(group), **options}

    return wrapped


@dataclass(frozen=True)
class AttentionSites:
    """The processor's sites (module docstring).

    norm_rope(attn, q, k, rotary_emb) -> (q, k): normed and roped, on this rank's whole heads.
    packed(attn, q, k, v, rotary_emb, U) -> (U, 3, B, S_loc, H/U, D) packed destination-major for the Ulysses
        all-to-all, or None where refused (counted; the caller runs `eager_norm_rope`); None: no packing kernel.
    codes(attn, q, k, v, rotary_emb, scales) -> (q8, k8, v8, descales): e4m3 codes of the normed and roped q/k/v
        for FP8 attention at degree 1 (`scales`: the layer's static host scales, or None); None: bf16 q/k/v.
    wire_codes(attn, q, k, v, rotary_emb, **kw) -> (packed, descales): the same, packed for the Ulysses all-to-all;
        None: bf16 on the wire.
    project_check(q, k, wq, wk, cos, sin, eps) -> reason or None, project(q, k, wq, wk, cos, sin, eps) -> (q, k),
        projected(): the projection exchange's per-destination norm + RoPE, its check and its count.
    sequence_amax: dynamic FP8 attention takes its amax per call (under Ulysses, over the whole sequence).
    layer_descales(fqns) -> {fqn: (3,) fp32 q/k/v descales}: static per-layer FP8 scales; None: none.
    exchange_options(group) -> {keyword: value}: what install passes to the Ulysses exchange over `group` at degree > 1
        (runtime/parallel/ulysses.py `UlyssesAttention`: padding, chunks, fp8_codes, prefix_inplace, split_output,
        post_group), each lever that tunes the exchange wrapping the site with its own; at degree 1 install notes
        options a lever added (nothing to tune).
    projection_exchange(proc, attn, hidden_states, rotary_emb) -> (q, k, v) seq-major, each (1, U*S_loc, H/U, D):
        this rank's heads over every row, projected per destination and exchanged while the next destination
        projects (`UlyssesAttention.exchange_projected`), or None where refused (counted: the packed exchange runs);
        None: the packed exchange only.
    world_exchange(opts, group, builder) -> (world degree, exchange): the exchange over the world's sequence shards
        (it replaces the Ulysses exchange); world_call(proc, attn, q, k, v, rotary_emb) -> (B, S_loc, H*D): the
        attention through it. None: no world exchange.
    """

    norm_rope: Fn = eager_norm_rope
    packed: Optional[Fn] = None
    codes: Optional[Fn] = None
    wire_codes: Optional[Fn] = None
    project_check: Fn = no_projection_kernel
    project: Optional[Fn] = None
    projected: Fn = nothing
    sequence_amax: bool = True
    layer_descales: Optional[Fn] = None
    exchange_options: Fn = exchange_defaults
    projection_exchange: Optional[Fn] = None
    world_exchange: Optional[Fn] = None
    world_call: Optional[Fn] = None


__all__ = ["AttentionSites", "eager_norm_rope", "exchange_defaults", "with_options"]
