"""Attention-output quantize to NVFP4 for to_out.0 (recipe nvfp4; lossy).

on: to_out.0's NVFP4Linear casts the attention output with the one-pass Triton kernel (runtime/kernels/nvfp4.py
`cast_nvfp4`: packed codes + swizzled block scales, one pass with a static input scale, amax + cast without) instead of
the torch reference chain; the same codes (runtime/levers/nvfp4_out_quant.py). Same rule as nvfp4_producer_quant: on
with NVFP4 GEMMs unless the step fusions are off (U8 19k)."""

from __future__ import annotations

from .base import Context, default_install, is_bool, Option, resolve, Spec
from .nvfp4_producer_quant import nvfp4_auto, nvfp4_blockers, nvfp4_evidence

SPEC = Spec(
    name="nvfp4_out_quant",
    settings={"off": True, "on": False},
    summary="attention output quantized to NVFP4 for to_out.0 by one Triton cast",
    counter="nvfp4_out_quant",
    options=(Option("linears", "nvfp4_out_quant", is_bool, "bool", False),),
    kernels=("cast_nvfp4",),
    input_step=lambda model, decision, site: site.runtime().inputs(model, decision, site),
)


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=nvfp4_blockers,
                   auto=lambda c: nvfp4_auto(c, SPEC.name, "attention output quantized to NVFP4 for to_out.0"),
                   explain=lambda c, s: nvfp4_evidence(c, SPEC.name, s) if s == "on" else [])


install = default_install(SPEC)
