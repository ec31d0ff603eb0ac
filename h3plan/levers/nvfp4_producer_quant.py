"""NVFP4 producer-side quantize fusion with the residual fold (Blackwell, recipe nvfp4; lossy).

auto: on with gemm_quant=nvfp4 when the rows per rank reach step_fusions_min_rows_per_rank (the
TRT-LLM seed (docs/sources.md#trtllm-seed) turns the step fusions off at U8 19k); off otherwise.
"""

from __future__ import annotations

from ..sources import cite
from .base import Context, Spec, resolve
from .qk_norm_rope import step_fusions_on

SPEC = Spec(
    name="nvfp4_producer_quant",
    settings={"off": True, "on": False},
    summary="NVFP4 quantize fused into the producer kernel with the residual fold (Blackwell; planned, no kernel yet)",
)


def nvfp4_blockers(ctx: Context, s: str) -> list[str]:
    if s == "on" and ctx.setting("gemm_quant") != "nvfp4":
        return [f"gemm_quant is {ctx.setting('gemm_quant')}: NVFP4 fusions need NVFP4 GEMMs (recipe nvfp4, SM100+)"]
    return []


def nvfp4_auto(ctx: Context, what: str):
    gq = ctx.setting("gemm_quant")
    if gq != "nvfp4":
        why = f" ({cite('trtllm-seed')} turns the NVFP4 fusions off with an FP8 checkpoint)" if gq == "fp8" else ""
        return "off", [f"gemm_quant is {gq}: no NVFP4 GEMMs{why}"], {}
    on, why = step_fusions_on(ctx)
    if not on:
        return "off", [f"step fusions off: {why}"], {}
    return "on", [f"{what}, as {cite('trtllm-seed')} runs every step fusion at Ulysses 1 and 4", why, ctx.budget_text()], {}


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=nvfp4_blockers,
                   auto=lambda c: nvfp4_auto(c, "NVFP4 quantize fused into the producer kernel, residual folded"),
                   params=lambda c, s: {"residual_fold": True} if s == "on" else {})


def install(builder, decision) -> None:
    """No h3plan kernel implements the NVFP4 producer-quantize fusion (the TRT-LLM seed (docs/sources.md#trtllm-seed)'s, Blackwell only): the
    decision stays in the plan and the install report says it was not applied."""
    reason = decision.reasons[0] if decision.setting == "off" else \
        "on in the plan, not installed: h3plan has no NVFP4 producer-quantize fusion kernel; the NVFP4 GEMMs quantize their own inputs"
    builder.skip(SPEC.name, reason)
