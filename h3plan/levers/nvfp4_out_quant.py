"""Attention-output quantize to NVFP4 for to_out.0 (Blackwell, recipe nvfp4; lossy). Same rule as
nvfp4_producer_quant: on with NVFP4 GEMMs unless the step fusions are off (U8 19k)."""

from __future__ import annotations

from .base import Context, Spec, resolve
from .nvfp4_producer_quant import nvfp4_auto, nvfp4_blockers

SPEC = Spec(
    name="nvfp4_out_quant",
    settings={"off": True, "on": False},
    summary="attention output quantized to NVFP4 for to_out.0 (Blackwell; planned, no kernel yet)",
)


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=nvfp4_blockers,
                   auto=lambda c: nvfp4_auto(c, "attention output quantized to NVFP4 for to_out.0"))


def install(builder, decision) -> None:
    """No h3plan kernel implements the NVFP4 attention-output quantize (the TRT-LLM seed (docs/sources.md#trtllm-seed)'s, Blackwell only): the
    decision stays in the plan and the install report says it was not applied."""
    reason = decision.reasons[0] if decision.setting == "off" else \
        "on in the plan, not installed: h3plan has no NVFP4 attention-output quantize kernel; the NVFP4 GEMMs quantize their own inputs"
    builder.skip(SPEC.name, reason)
