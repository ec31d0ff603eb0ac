"""Lever registry: a plain dict filled by explicit imports, keyed by the config names, in install order.

Each module: `decide(ctx) -> Decision` (pure, no torch) and `install(builder, decision)` (records
options on the builder; see docs/architecture.md, "Lever install protocol").
"""

from . import (
    a2a_fp8_codes,
    attention,
    fa4_2cta,
    fa4_tile,
    fp8_scales,
    gated_residual,
    gemm_quant,
    modulation,
    nvfp4_out_quant,
    nvfp4_producer_quant,
    prefix_inplace,
    qk_norm_rope,
    swiglu,
    ulysses_overlap,
    ulysses_padding,
    vae_graphs,
    vae_ops,
    vae_tiles,
)
from .base import Context, LeverError

REGISTRY = {
    "gemm_quant": gemm_quant,
    "attention": attention,
    "fa4_2cta": fa4_2cta,
    "fa4_tile": fa4_tile,
    "fp8_scales": fp8_scales,
    "qk_norm_rope": qk_norm_rope,
    "modulation": modulation,
    "gated_residual": gated_residual,
    "swiglu": swiglu,
    "ulysses_padding": ulysses_padding,
    "ulysses_overlap": ulysses_overlap,
    "a2a_fp8_codes": a2a_fp8_codes,
    "prefix_inplace": prefix_inplace,
    "nvfp4_producer_quant": nvfp4_producer_quant,
    "nvfp4_out_quant": nvfp4_out_quant,
    "vae_tiles": vae_tiles,
    "vae_graphs": vae_graphs,
    "vae_ops": vae_ops,
}

__all__ = ["REGISTRY", "Context", "LeverError"]
