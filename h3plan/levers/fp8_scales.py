"""FP8 attention scales: dynamic per-tensor amax (padded rows excluded; MAX all-reduce over the
Ulysses group) or a static calibrated table with a margin. Part of cuDNN FP8 attention, so lossy.

auto follows recipe.fp8_scale_mode; in `auto` mode static only at Ulysses degree >= the hardware's
static_scales_min_degree and length >= static_scales_min_seq_len (the TRT-LLM seed (docs/sources.md#trtllm-seed)'s
U8-at-104k row) and only with a calibrated table (recipe.fp8_static_table); otherwise dynamic. Where cuDNN writes
FP8 output (SM90) the decision also records how scale_o is chosen.
"""

from __future__ import annotations

from h3plan.facts.attention.spec import BackendOption
from h3plan.facts.scale_table import ScaleTableError, load
from ..sources import cite
from .attention import fp8_output_dtype
from . import rules
from .base import Context, LeverError, Option, Spec, one_of, resolve, VERIFY_REFERENCE


SPEC = Spec(
    name="fp8_scales",
    settings={"off": True, "dynamic": False, "static": False},
    summary="FP8 attention scales: dynamic per-tensor amax or a static calibrated table (lossy)",
    verify=VERIFY_REFERENCE,
    backends={"dynamic": ("cudnn_fp8",), "static": ("cudnn_fp8",)},
    options=(Option("attention", "fp8_scales", *one_of("off", "dynamic", "static"), default="dynamic"),
             Option("attention", "scale_table", lambda v: v is None or isinstance(v, str), "path or None", None),
             Option("attention", "scale_margin",
                    lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, "float > 0", 1.0)),
    column="scales",
    backend_reads={"cudnn_fp8": BackendOption("fp8_scales", describe=lambda v: f"fp8_scales={v}")},
)


def blockers(ctx: Context, s: str) -> list[str]:
    att, r = rules.attention(ctx), ctx.recipe
    if s == "off":
        return ["cuDNN FP8 attention needs scales (dynamic or static)"] if att == "cudnn_fp8" else []
    out = []
    if r["fp8_scale_mode"] not in ("auto", s):
        out.append(f"recipe {r['name']} fixes recipe.fp8_scale_mode={r['fp8_scale_mode']}")
    if s == "static" and not r["fp8_static_table"]:
        out.append("static scales need a calibrated table: set recipe.fp8_static_table=PATH")
    return out


def auto(ctx: Context):
    r, t = ctx.recipe, ctx.tuning
    if rules.attention(ctx) != "cudnn_fp8":
        return "off", [f"attention is {rules.attention(ctx)}: no FP8 attention scales"], {}
    if r["fp8_scale_mode"] == "static":
        if not r["fp8_static_table"]:
            raise LeverError(SPEC.name, "auto", ["recipe.fp8_scale_mode=static needs recipe.fp8_static_table=PATH"])
        return "static", [f"recipe {r['name']} fixes static scales (recipe.fp8_scale_mode)"], params(ctx, "static")
    if r["fp8_scale_mode"] == "dynamic":
        return "dynamic", [f"recipe {r['name']} fixes dynamic scales (recipe.fp8_scale_mode; the static table "
                           "never)"], params(ctx, "dynamic")
    long_row = ctx.degree >= t["static_scales_min_degree"] and ctx.seq_len >= t["static_scales_min_seq_len"]
    rule = (f"Ulysses {ctx.degree} >= {t['static_scales_min_degree']} and {ctx.seq_len:,} >= "
            f"{t['static_scales_min_seq_len']:,} tokens (hardware.tuning.static_scales_min_*, interpolated between "
            f"measured rows): {cite('trtllm-seed')} at Ulysses 8 and 104k tokens")
    if long_row and r["fp8_static_table"]:
        return "static", [rule + f" uses static scales (held-out table, margin {r['fp8_static_margin']:g}) instead of "
                                 "dynamic"], params(ctx, "static")
    if long_row:
        return "dynamic", [rule + " uses static scales, but recipe.fp8_static_table is null: dynamic kept (calibrate a "
                                  "held-out table and set it)"], params(ctx, "dynamic")
    return "dynamic", [f"dynamic per-tensor amax scales, as {cite('trtllm-seed')} runs at Ulysses 1 and 4 and on short "
                       "Ulysses 8 clips"], params(ctx, "dynamic")


def params(ctx: Context, s: str) -> dict:
    if s == "off":
        return {}
    o = fp8_output_dtype(ctx)
    p = {"o_dtype": o, "scale_o": None if o != "fp8" else ("amax" if s == "dynamic" else "table")}
    if s == "dynamic":
        p.update(amax="per tensor over rows < valid length",
                 amax_allreduce="max over the Ulysses group" if ctx.degree > 1 else None)
    else:
        p.update(scale_table=ctx.recipe["fp8_static_table"], scale_margin=float(ctx.recipe["fp8_static_margin"]))
    return p


def _scale_o_reason(ctx: Context, s: str) -> list[str]:
    note = ctx.hardware["cudnn"]["fp8_output_note"]
    if s != "off" and fp8_output_dtype(ctx) == "fp8":
        return [f"{ctx.hw}: cuDNN FP8 attention writes FP8 output, scale_o from "
                f"{'amax' if s == 'dynamic' else 'the table'}" + (f" ({note})" if note else "")]
    return []


def _check_table(ctx: Context) -> None:
    """A configured table must load, whatever the setting: a malformed one is an error, never ignored."""
    path = ctx.recipe["fp8_static_table"]
    if path:
        try:
            load(path, model_config=ctx.model["diffusers_config"])  # a table of another model is refused
        except ScaleTableError as e:
            raise LeverError(SPEC.name, ctx.requested(SPEC.name), [f"recipe.fp8_static_table: {e}"]) from None


def decide(ctx: Context):
    _check_table(ctx)
    d = resolve(ctx, SPEC, blockers=blockers, auto=auto, params=params)
    extra = _scale_o_reason(ctx, d.setting)
    if extra:
        from dataclasses import replace

        d = replace(d, reasons=d.reasons[:1] + tuple(extra) + d.reasons[1:])
    return d


def install(builder, decision) -> None:
    if decision.setting == "off":
        builder.skip(SPEC.name, decision.reasons[0])
        return
    builder.set(SPEC.name, "fp8_scales", decision.setting)
    builder.set(SPEC.name, "scale_table", decision.param("scale_table"))
    builder.set(SPEC.name, "scale_margin", float(decision.param("scale_margin", 1.0)))
