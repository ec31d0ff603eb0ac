"""Checkpoint quantization: the block linears (to_q/k/v, to_out.0, ff) as BF16, FP8 or NVFP4 GEMMs.

fp8 runs an FP8 checkpoint, or BF16 weights quantized once at install; nvfp4 needs the NVFP4
checkpoint and SM100+; dequant_bf16 runs a quantized checkpoint's weights dequantised to BF16
GEMMs (the only way to run an NVFP4 checkpoint on SM90, and only when asked for explicitly).
AdaLN projections, norms and output heads keep diffusers' dtypes. fp8/nvfp4 are lossy.
"""

from __future__ import annotations

from h3plan.facts.blocks import BLOCK_LINEARS
from h3plan.facts.scale_table import has_linears
from .base import Context, LeverError, Option, Spec, StateKeys, Terms, resolve
from .nvfp4_producer_quant import nvfp4_evidence

WEIGHTS = tuple(f"transformer_blocks.*.{fqn}.weight" for fqn in BLOCK_LINEARS)


def _quantised(*scales: str) -> tuple[StateKeys, ...]:
    """The block linears' weights replaced by their codes, each with its scales (`<weight>_scale`...) beside it."""
    return StateKeys("replaces", WEIGHTS), StateKeys("owns", tuple(w + s for w in WEIGHTS for s in scales))


SPEC = Spec(
    name="gemm_quant",
    settings={"bf16": True, "fp8": False, "nvfp4": False, "dequant_bf16": True},
    summary="the block linears as BF16, FP8 or NVFP4 GEMMs (fp8/nvfp4 lossy)",
    counter="gemm_quant",
    options=(Option("linears", "quant",
                    lambda v: v is None or (isinstance(v, dict) and v.get("format") in ("fp8", "nvfp4")),
                    "None or dict(format: 'fp8' | 'nvfp4', params: dict)", None),),
    column="gemm",
    terms={"fp8": Terms(gemm_dtype="fp8"), "nvfp4": Terms(gemm_dtype="nvfp4")},
    # e4m3 codes with a per-channel scale; packed e2m1 codes with block scales and a global one
    state={"fp8": _quantised("_scale"), "nvfp4": _quantised("_scale", "_scale_2")},
)
# NVFP4 rounding (docs/numerics.md): why the block scales clamp as torchao does and not as TRT-LLM's kernel
QUANTIZER = ("torchao nvfp4_quantize, bit for bit: codes by reciprocal multiply x * ((1 / g) / s), -0 kept, block "
             "scales clamped to [2^-6, 448]; TRT-LLM's cvt_warp_fp16_to_fp4 keeps subnormal scales and approximate "
             "reciprocals, torchao's exact chain is the reference the kernels are tested against")


def blockers(ctx: Context, s: str) -> list[str]:
    ck, gemm = ctx.recipe["checkpoint"], ctx.hardware["gemm"]
    out = []
    if s == "bf16" and ck != "bf16":
        out.append(f"the checkpoint is {ck}: its block linears are not BF16 (dequant_bf16 runs them dequantised)")
    if s == "dequant_bf16" and ck == "bf16":
        out.append("the checkpoint is bf16: there is nothing to dequantise")
    if s == "fp8":
        if ck == "nvfp4":
            out.append("an NVFP4 checkpoint is not re-quantised to FP8 (choose nvfp4 or dequant_bf16)")
        if not gemm["fp8"]:
            out.append(f"{ctx.hw} has no FP8 GEMMs ({gemm['source']})")
    if s == "nvfp4":
        if ck != "nvfp4":
            out.append(f"the checkpoint is {ck}: NVFP4 GEMMs need the calibrated NVFP4 checkpoint")
        if not gemm["nvfp4"]:
            out.append(f"{ctx.hw} has no NVFP4 GEMMs: they need SM100+ ({gemm['source']})")
    return out


def auto(ctx: Context):
    ck, name = ctx.recipe["checkpoint"], ctx.recipe["name"]
    if ck == "bf16":
        return "bf16", [f"recipe {name}: BF16 checkpoint, the block linears keep diffusers' BF16 GEMMs"], {}
    if ctx.lossless_only:
        return "dequant_bf16", [f"recipe {name} has policy lossless: {ck} GEMMs are lossy, the {ck} weights run "
                                "dequantised to BF16"], {}
    problems = blockers(ctx, ck)
    if problems:
        raise LeverError(SPEC.name, "auto", [f"recipe {name} needs {ck} GEMMs"] + problems
                         + [f"to run this checkpoint dequantised to BF16 set levers.{SPEC.name}=dequant_bf16"])
    return ck, [f"recipe {name}: the block linears run as {ck} GEMMs ({ctx.hardware['gemm']['source']})",
                *explain(ctx, ck), ctx.budget_text()], params(ctx, ck)


def _static_inputs(ctx: Context) -> bool:
    """FP8 linears take static input scales only when the recipe fixes static scales and the table has linear
    rows (a version-1 table does not); a bad table is fp8_scales' error to report."""
    return ctx.recipe["fp8_scale_mode"] == "static" and has_linears(ctx.recipe["fp8_static_table"])


def params(ctx: Context, s: str) -> dict:
    if s in ("fp8", "nvfp4"):
        weights = ("checkpoint" if ctx.recipe["checkpoint"] == s else
                   "quantized once at install; the bf16 originals wait in pinned host memory until uninstall")
        p = {"linears": list(BLOCK_LINEARS), "weights": weights, "activations": "per tensor"}
        if s == "nvfp4":
            p["quantizer"] = QUANTIZER
        if s == "fp8" and _static_inputs(ctx):
            p.update(activations="per tensor, static amax from recipe.fp8_static_table (one pass)",
                     input_scales="static", scale_table=ctx.recipe["fp8_static_table"],
                     scale_margin=float(ctx.recipe["fp8_static_margin"]))
        return p
    return {}


def explain(ctx: Context, s: str) -> list[str]:
    if s == "nvfp4":
        return nvfp4_evidence(ctx, SPEC.name, s)
    if s == "dequant_bf16":
        return [f"the {ctx.recipe['checkpoint']} checkpoint's weights are dequantised to BF16; the GEMMs add no loss "
                "beyond the checkpoint's own"]
    return []


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, params=params, explain=explain)


def install(builder, decision) -> None:
    if decision.setting in ("fp8", "nvfp4"):
        builder.set(SPEC.name, "quant", {"format": decision.setting, "params": decision.to_dict()["params"]})
    else:
        builder.skip(SPEC.name, decision.reasons[0])
