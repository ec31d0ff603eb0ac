"""How the FP8 block linears' inputs become e4m3: per tensor or per row, written by their producers.

tensor: FP8Linear quantises its bf16 input itself, one dynamic scale for the whole tensor (an amax pass and
  a cast pass per input; under Ulysses a MAX all-reduce of the amax per input), or the static table's scale.
row: the kernels that produce the inputs write e4m3 with one scale per row (h3plan/runtime/kernels/fp8_producers.py):
  norm1/norm2 + AdaLN -> to_q/k/v and ff.net.0.proj (rmsnorm_modulate_fp8), SwiGLU -> ff.net.2
  (swiglu_fp8), the attention output -> to_out.0 (cast_rows_fp8); rowwise-scaled FP8 GEMMs consume the codes
  (h3plan/runtime/quant/fp8_rowwise.py). A row's scale depends on that row alone: the codes are the same at every
  Ulysses degree with no all-reduce. With a static linear-input table (gemm_quant param input_scales=static)
  the producers write with the table's scale instead (their static mode): the same codes as tensor's static
  cast, bit for bit, without the cast pass.
Both are FP8 (lossy); off: no FP8 GEMMs.

auto: row only where the hardware measured the installed FP8 block with row against tensor
(`hardware.measured.fp8_act_quant`) and row was faster at every measured length; tensor otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from omegaconf import MISSING

from . import rules
from .base import Context, Option, Spec, faster_in_every_run, one_of, resolve, speedup_runs


@dataclass
class ActQuantPoint:
    """The installed FP8 block with fp8_act_quant=row against tensor (tensor time / row time), one entry per
    interleaved A/B run."""

    seq_len: int = MISSING
    speedups: List[float] = MISSING


@dataclass
class ActQuantMeasured:
    """hardware.measured.fp8_act_quant, this lever's evidence: row vs tensor on the whole FP8 block (empty: never
    measured, auto keeps tensor)."""

    block: List[ActQuantPoint] = field(default_factory=list)
    source: str = ""


SPEC = Spec(
    name="fp8_act_quant",
    settings={"off": True, "tensor": False, "row": False},
    summary="FP8 linear inputs: per-tensor scales (tensor) or per-row e4m3 written by the producer kernels (row)",
    counter="fp8_act_quant",
    options=(Option("block", "fp8_act_quant", *one_of("tensor", "row"), default="tensor",
                    swap=lambda v: (".norm1/norm2+modulate, ff swiglu, to_out.0 input", "bf16 + per-tensor FP8 cast",
                                    "e4m3 per-row codes from the producer") if v == "row" else None),),
    kernels=("rmsnorm_modulate_fp8", "swiglu_fp8", "cast_rows_fp8"),
    hardware={"measured.fp8_act_quant": ActQuantMeasured},
    input_step=lambda model, decision, site: site.runtime().inputs(model, decision, site),
)

ULYSSES_NOTE = ("per-row scales: a row's scale depends on that row alone, so the codes are the same at every Ulysses "
                "degree with no amax all-reduce")


def _static(ctx: Context) -> bool:
    return rules.gemm_input_scales(ctx) == "static"


def blockers(ctx: Context, s: str) -> list[str]:
    gq = rules.gemm(ctx)
    if s == "off":
        return ["gemm_quant is fp8: its linears quantise their inputs (tensor or row)"] if gq == "fp8" else []
    if gq != "fp8":
        return [f"gemm_quant is {gq}: {s} scales quantise the inputs of FP8 GEMMs (gemm_quant=fp8 only)"]
    out = []
    if s == "row":
        out += rules.producer_blockers(ctx, "row")
    return out


def _measured(ctx: Context):
    m = ctx.hardware["measured"].get("fp8_act_quant") or {}
    return list(m.get("block") or []), m.get("source", "")


NOISE = 1.01  # interleaved block timings on the H200 at its power cap move about 1% round to round


def auto(ctx: Context):
    gq = rules.gemm(ctx)
    if gq != "fp8":
        return "off", [f"gemm_quant is {gq}: no FP8 GEMM inputs to quantise"], {}
    points, source = _measured(ctx)
    if not points:
        return "tensor", [f"row never ran on {ctx.hw}: no measured block A/B of row vs tensor "
                          "(hardware.measured.fp8_act_quant); today's per-tensor scales kept",
                          ctx.budget_text()], params(ctx, "tensor")
    runs = "; ".join(f"{speedup_runs(p['speedups'])} at {p['seq_len']:,} tokens" for p in points)
    faster = all(faster_in_every_run(p["speedups"]) for p in points)
    if not faster:
        return "tensor", ["row (per-row codes from the producers) not faster than tensor at every measured length: "
                          f"{runs} ({source})", ctx.budget_text()], params(ctx, "tensor")
    problems = blockers(ctx, "row")
    if problems:
        return ("tensor", [f"row measured faster ({runs}) but cannot apply: " + "; ".join(problems)],
                params(ctx, "tensor"))
    close = min(min(p["speedups"]) for p in points) < NOISE
    margin = [f"the smallest margin is under {NOISE - 1:.0%}, within run-to-run noise: the speed is a tie at best, and "
              "the per-row codes' property below is what row adds"] if close else []
    return "row", [f"row (per-row codes from the producers) faster than tensor at every measured length: {runs} "
                   f"({source})",
                   *margin, *explain(ctx, "row"), ctx.budget_text()], params(ctx, "row")


def explain(ctx: Context, s: str) -> list[str]:
    if s == "row":
        if _static(ctx):
            return ["static linear-input table: the producers write e4m3 with the table's scales (the same codes as "
                    "tensor's static cast, without its pass)"]
        why = [ULYSSES_NOTE]
        if ctx.degree > 1:
            why[0] += f" (saves tensor's 4 amax all-reduces per block at Ulysses degree {ctx.degree})"
        return why
    return []


def params(ctx: Context, s: str) -> dict:
    if s == "off":
        return {}
    static = _static(ctx)
    if s == "tensor":
        return {"scales": ("static, from recipe.fp8_static_table" if static
                           else "per tensor, dynamic (amax + cast passes)")}
    return {"scales": "static, from recipe.fp8_static_table" if static else "per row, dynamic",
            "producers": {"attn.to_q/k/v": "rmsnorm_modulate_fp8", "ff.net.0.proj": "rmsnorm_modulate_fp8",
                          "ff.net.2": "swiglu_fp8", "attn.to_out.0": "cast_rows_fp8"}}


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, params=params, explain=explain)


def install(builder, decision) -> None:
    if decision.setting == "row":
        builder.set(SPEC.name, "fp8_act_quant", "row")
    elif decision.setting == "tensor":
        builder.skip(SPEC.name, "tensor: the FP8 linears quantise their own inputs (gemm_quant's install)")
    else:
        builder.skip(SPEC.name, decision.reasons[0])
