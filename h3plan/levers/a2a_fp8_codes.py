"""Send the fused cast's e4m3 codes through the Ulysses all-to-all instead of BF16 (Q, K, V: 37.5%
fewer bytes with the BF16 output exchange); bit-identical given FP8 attention (receiver-exact scales).

auto: on with qk_norm_rope=fused_fp8 at degree > 1 when the scales are static (no amax all-reduce)
or the length reaches fp8_codes_dynamic_min_seq_len; off otherwise (TRT-LLM seed (docs/sources.md#trtllm-seed): the
dynamic pairing loses at 19k and pays at 104k).
Runtime: h3plan/runtime/levers/a2a_fp8_codes.py (the Ulysses exchange takes the codes).
"""

from __future__ import annotations

from ..sources import cite
from . import rules
from .base import Context, default_install, is_bool, Option, resolve, Spec, Terms

TRT = cite("trtllm-seed")

SPEC = Spec(
    name="a2a_fp8_codes",
    settings={"off": True, "on": True},
    summary="send e4m3 codes through the Ulysses all-to-all (37.5% fewer bytes; exact given FP8 attention)",
    ulysses=True,
    backends={"on": ("cudnn_fp8",)},
    options=(Option("attention", "a2a_fp8_codes", is_bool, "bool", False,
                    describe=lambda v: "fp8_codes" if v else None),),
    column="a2a_fp8",
    terms={"on": Terms(a2a_fp8=True)},
)


def blockers(ctx: Context, s: str) -> list[str]:
    if s == "off":
        return []
    out = []
    if ctx.degree == 1:
        out.append("Ulysses degree 1: there is no all-to-all")
    if not rules.fp8_qk_cast(ctx):
        out.append(f"qk_norm_rope is {rules.qk_norm_rope(ctx)}: the codes come from the fused FP8 cast (fused_fp8)")
    ring = rules.ring_excluded(ctx, SPEC.name, s)
    return out + ([ring] if ring else [])


def auto(ctx: Context):
    if ctx.degree == 1:
        return "off", ["Ulysses degree 1: no all-to-all"], {}
    if not rules.fp8_qk_cast(ctx):
        return "off", [f"qk_norm_rope is {rules.qk_norm_rope(ctx)}: no e4m3 codes before the all-to-all"], {}
    ring = rules.ring_excluded(ctx, SPEC.name, "on")
    if ring:
        return "off", [ring], {}
    save = f"e4m3 codes cut the all-to-all bytes by 37.5%, bit-identical with receiver-exact scales ({TRT})"
    if rules.fp8_scales(ctx) == "static":
        return "on", [f"static scales need no amax all-reduce: {save}"], {}
    thr = ctx.tuning["fp8_codes_dynamic_min_seq_len"]
    rule = "hardware.tuning.fp8_codes_dynamic_min_seq_len, interpolated between 19k and 104k"
    if ctx.seq_len >= thr:
        return "on", [f"dynamic scales at {ctx.seq_len:,} >= {thr:,} tokens ({rule}): the pairing pays at 104k; "
                      f"{save}"], {}
    return "off", [f"dynamic scales at {ctx.seq_len:,} < {thr:,} tokens ({rule}): sending FP8 codes with dynamic "
                   f"scales was slower at 19k tokens, about 150 small all-reduces per step ({TRT})"], {}


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto)


install = default_install(SPEC)
