"""The rules between levers: the one place a lever's `decide` reads what another lever decided.

Levers decide in registry order (h3plan/levers/__init__.py, NAMES), so a lever may ask only about levers before it;
each question here is a named function of the context, and no lever module reads another lever's decision by name.
A question about a lever that has not decided yet raises KeyError, as `Context.setting` does, unless it is given
`unset` (the answer while that lever is still undecided: a lever probed before it, `Spec.backends`' check).

Ring x Ulysses: parallel.ring > 1 rules some settings of earlier levers out (EXCLUDES); those levers yield to it
themselves (`ring_excluded`): auto picks what the ring takes, a forced setting is refused naming parallel.ring.
Pure: no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import Context

_RAISE: Any = object()


def _setting(ctx: Context, lever: str, unset: Any = _RAISE) -> Any:
    if unset is not _RAISE and lever not in ctx.decisions:
        return unset
    return ctx.setting(lever)


def attention(ctx: Context, unset: Any = _RAISE) -> str:
    """The attention backend the blocks run (levers.attention's setting)."""
    return _setting(ctx, "attention", unset)


def fa4(ctx: Context) -> bool:
    return attention(ctx) == "fa4"


def cudnn(ctx: Context) -> bool:
    """cuDNN's SDPA, BF16 or FP8 (the backends that keep a padded output)."""
    return attention(ctx).startswith("cudnn")


def fp8_attention(ctx: Context) -> bool:
    """cuDNN's FP8 attention (False while the attention is undecided)."""
    return attention(ctx, None) == "cudnn_fp8"


def fp8_scales(ctx: Context) -> str:
    """How the FP8 attention's q/k/v scales are taken (levers.fp8_scales: off, dynamic or static)."""
    return _setting(ctx, "fp8_scales")


def dynamic_fp8_attention(ctx: Context) -> bool:
    """FP8 attention whose amax is taken per call (over the packed q, k, v)."""
    return fp8_attention(ctx) and fp8_scales(ctx) == "dynamic"


def qk_norm_rope(ctx: Context) -> str:
    """The QK-norm + RoPE kernel's setting (eager, fused, fused_fp8)."""
    return _setting(ctx, "qk_norm_rope")


def fp8_qk_cast(ctx: Context) -> bool:
    """QK-norm + RoPE writes e4m3 codes (fused_fp8)."""
    return qk_norm_rope(ctx) == "fused_fp8"


def gemm(ctx: Context) -> str:
    """The block linears' GEMM format (levers.gemm_quant: bf16, fp8, nvfp4)."""
    return _setting(ctx, "gemm_quant")


def gemm_input_scales(ctx: Context) -> Any:
    """How the FP8 GEMMs scale their inputs (gemm_quant's `input_scales` parameter)."""
    return ctx.decision("gemm_quant").param("input_scales")


def modulation(ctx: Context) -> str:
    """The fused AdaLN modulation's setting (eager, exact, fp32)."""
    return _setting(ctx, "modulation")


def swiglu(ctx: Context) -> str:
    return _setting(ctx, "swiglu")


def producer_blockers(ctx: Context, writer: str) -> list[str]:
    """A lever whose codes come out of the fused producer kernels (fp8_act_quant=row, nvfp4_producer_quant) needs
    them planned: the fused modulation (to_q/k/v, ff.net.0.proj) and SwiGLU (ff.net.2). `writer`: who writes them."""
    out = []
    if modulation(ctx) == "eager":
        out.append(f"modulation is eager: {writer} writes the to_q/k/v and ff.net.0.proj codes from the fused "
                   "modulation kernel (levers.modulation=exact or fp32)")
    if swiglu(ctx) != "on":
        out.append(f"swiglu is off: {writer} writes the ff.net.2 codes from the fused SwiGLU kernel (levers.swiglu=on)")
    return out


# The transformer block forward's call sites (h3plan/runtime/block_sites.py: to_q/k/v's input, the attention's gated
# residual, ff.net.0.proj's input and the fold of the two, the feed-forward, its gated residual) are diffusers' ops
# until the levers that change them wrap them, at install, in this order, innermost first: each lever's runtime module
# (h3plan/runtime/levers/<lever>.py `wrap`) reads what the levers before it left. The bf16 producers come first
# (modulation: norm + AdaLN; gated_residual; swiglu: the plan's feed-forward), then the levers that write the
# consumers' inputs as codes from those producers (fp8_act_quant=row, nvfp4_producer_quant): a codes writer falls back
# to the bf16 producer, and where two were enabled at one consumer (a model with FP8 and NVFP4 linears) the later one
# writes there. The one place this order is written: install/block.py composes it, naming no lever.
BLOCK_SITES = ("modulation", "gated_residual", "swiglu", "fp8_act_quant", "nvfp4_producer_quant")
# The bf16 producers whose fused kernels those codes writers extend (producer_blockers, above, when planning): where
# one's block option is at its default (diffusers' op), the linear it feeds casts its own bf16 input (install's note).
PRODUCERS = ("modulation", "swiglu")
# The attention processor's call sites (h3plan/runtime/attention_sites.py: norm + RoPE on whole heads, packed for the
# Ulysses wire or per destination, the FP8 codes, the FP8 scales, the Ulysses exchange's options, the projection
# exchange, the world exchange) are diffusers' ops around the plan's backend until the levers that change them wrap
# them, at install, in this order (each lever's runtime module h3plan/runtime/levers/<lever>.py `wrap`; its
# `option_problems`, where it has one, checks the options in this order too). The scales and the norm + RoPE write
# disjoint sites; the Ulysses levers each add their own options of the exchange, and the projection exchange and ring
# read what qk_norm_rope left (the per-destination norm + RoPE, the packing). The one place this order is written:
# install/attention.py composes it, naming no lever.
ATTENTION_SITES = ("fp8_scales", "qk_norm_rope", "ulysses_padding", "ulysses_overlap", "a2a_fp8_codes",
                   "prefix_inplace", "ulysses_exchange", "ring")
# The VAE decoder block forward's call sites (h3plan/runtime/vae_sites.py: the attention's norm + RoPE, the SwiGLU of
# the feed-forward's projection, the scaled residuals) are diffusers' ops until the levers that change them wrap them,
# at install, in this order (each lever's runtime module h3plan/runtime/levers/<lever>.py: `settle` its options for
# the dtype the decode runs in, `wrap` the sites, the `swaps` it logs per block); the first one's hook carries the
# forward. The one place this order is written: install/vae/block.py composes it, naming no lever.
VAE_BLOCK_SITES = ("vae_ops",)


def ulysses_padding(ctx: Context) -> str:
    return _setting(ctx, "ulysses_padding")


def ring(ctx: Context) -> bool:
    """Ring attention runs (parallel.ring > 1)."""
    return _setting(ctx, "ring") == "on"


def a2a_fp8_codes(ctx: Context) -> bool:
    """q/k/v cross the Ulysses all-to-all as e4m3 codes."""
    return _setting(ctx, "a2a_fp8_codes") == "on"


def ulysses_overlap(ctx: Context) -> bool:
    """Head chunks overlap the all-to-all with attention."""
    return _setting(ctx, "ulysses_overlap") == "on"


def prefix_inplace(ctx: Context) -> bool:
    return _setting(ctx, "prefix_inplace") == "on"


def sparse_attention(ctx: Context) -> bool:
    """Block-sparse attention runs on some forwards (False while it is undecided)."""
    return _setting(ctx, "sparse_attention", "off") != "off"


def vae_precision(ctx: Context, unset: Any = _RAISE) -> str:
    """The dtype the VAE decodes in (levers.vae_precision: fp32, fp16, bf16)."""
    return _setting(ctx, "vae_precision", unset)


def vae_tiles(ctx: Context) -> str:
    """The VAE decode's tile geometry (levers.vae_tiles: default, fp8_tiles, custom)."""
    return _setting(ctx, "vae_tiles")


def vae_graphs(ctx: Context) -> bool:
    """The VAE decoder replays a CUDA graph."""
    return _setting(ctx, "vae_graphs") == "on"


# What the ring's block call cannot take, by earlier lever: lever -> (setting, why).
EXCLUDES = {
    "fa4_2cta": ("on", "the ring's FA4 block call (h3plan/runtime/parallel/lse.py) takes no 2-CTA switch"),
    "fa4_tile": ("tuned", "the ring's FA4 block call (h3plan/runtime/parallel/lse.py) takes no tile"),
    "a2a_fp8_codes": ("on", "e4m3 codes on the wire feed FP8 attention; the ring takes bf16 q/k/v"),
    "prefix_inplace": ("on", "RingUlysses' Ulysses exchange writes no padded prefix in place"),
}


def ring_excluded(ctx: Context, lever: str, setting: str) -> str | None:
    """Why parallel.ring > 1 rules out `lever=setting` (a reason naming parallel.ring), or None."""
    x = EXCLUDES.get(lever)
    if ctx.ring > 1 and x is not None and x[0] == setting:
        return f"parallel.ring={ctx.ring}: {x[1]}"
    return None
