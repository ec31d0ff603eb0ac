"""NVFP4 producer-side quantize fusion with the residual fold (recipe nvfp4; lossy).

on: the kernels that produce the NVFP4 GEMM inputs write e2m1 codes + swizzled e4m3 block scales themselves
(h3plan/runtime/kernels/nvfp4_producers.py): norm1 + AdaLN -> to_q/k/v, the residual fold (the attention's gated
residual + norm2 + AdaLN in one kernel) -> ff.net.0.proj, SwiGLU -> ff.net.2 (its call sites:
runtime/levers/nvfp4_producer_quant.py). Same quantizer as the NVFP4 linears' own input cast (torchao's,
runtime/kernels/nvfp4.py), so a refused call changes no bits.
auto: on with gemm_quant=nvfp4 when the rows per rank reach step_fusions_min_rows_per_rank (the TRT-LLM seed
(docs/sources.md#trtllm-seed) turns the step fusions off at U8 19k); off otherwise.
"""

from __future__ import annotations

from ..sources import cite
from . import rules
from .base import Context, default_install, is_bool, Option, resolve, Spec
from .qk_norm_rope import step_fusions_on

SPEC = Spec(
    name="nvfp4_producer_quant",
    settings={"off": True, "on": False},
    summary="NVFP4 quantize fused into the producer kernels (norm + AdaLN, SwiGLU) with the residual fold",
    counter="nvfp4_producer_quant",
    options=(Option("block", "nvfp4_producer_quant", is_bool, "bool", False,
                    swap=lambda v: (".norm1/norm2+modulate (residual folded), ff swiglu",
                                    "bf16 + NVFP4 cast in the linear",
                                    "NVFP4 codes from the producer") if v else None),),
    kernels=("rmsnorm_modulate_nvfp4", "gated_residual_modulate_nvfp4", "swiglu_nvfp4"),
    column="nvfp4_fuse",
    input_step=lambda model, decision, site: site.runtime().inputs(model, decision, site),
)


def nvfp4_evidence(ctx: Context, lever: str, setting: str) -> list[str]:
    """What of an NVFP4 setting has run where, from hardware.verified: nothing to say when the setting itself
    ran on this hardware; else where its kernels were checked against their reference (verified.kernels_checked
    and kernels_checked_on) and whether an FP4 GEMM ever ran here (verified.settings.gemm_quant)."""
    v = ctx.hardware["verified"]
    if setting in v["settings"].get(lever, []):
        return []
    gemm = "" if "nvfp4" in v["settings"].get("gemm_quant", []) else "; FP4 GEMM never ran"
    where = v.get("kernels_checked_on")
    if where and setting in (v.get("kernels_checked") or {}).get(lever, []):
        return [f"kernel checked on {where} against the reference{gemm}"]
    return [f"kernel checked against the reference in the CPU interpreter only, never on a GPU{gemm}"]


def nvfp4_blockers(ctx: Context, s: str) -> list[str]:
    if s == "on" and rules.gemm(ctx) != "nvfp4":
        return [f"gemm_quant is {rules.gemm(ctx)}: NVFP4 fusions need NVFP4 GEMMs (recipe nvfp4, SM100+)"]
    return []


def blockers(ctx: Context, s: str) -> list[str]:
    out = nvfp4_blockers(ctx, s)
    if s == "on":
        out += rules.producer_blockers(ctx, "the producer")
    return out


def nvfp4_auto(ctx: Context, lever: str, what: str, blocked=nvfp4_blockers):
    gq = rules.gemm(ctx)
    if gq != "nvfp4":
        why = f" ({cite('trtllm-seed')} turns the NVFP4 fusions off with an FP8 checkpoint)" if gq == "fp8" else ""
        return "off", [f"gemm_quant is {gq}: no NVFP4 GEMMs{why}"], {}
    on, why = step_fusions_on(ctx)
    if not on:
        return "off", [f"step fusions off: {why}"], {}
    problems = blocked(ctx, "on")
    if problems:
        return "off", [f"{what} would be on (step fusions on) but cannot apply: " + "; ".join(problems)], {}
    return "on", [f"{what}, as {cite('trtllm-seed')} runs every step fusion at Ulysses 1 and 4", why,
                  *nvfp4_evidence(ctx, lever, "on"), ctx.budget_text()], {}


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers,
                   auto=lambda c: nvfp4_auto(c, SPEC.name,
                                             "NVFP4 quantize fused into the producer kernels, residual folded",
                                             blockers),
                   params=lambda c, s: {"residual_fold": True} if s == "on" else {},
                   explain=lambda c, s: nvfp4_evidence(c, SPEC.name, s) if s == "on" else [])


install = default_install(SPEC)
