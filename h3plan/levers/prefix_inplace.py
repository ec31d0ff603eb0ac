"""cuDNN on a padded sequence: allocate the padded output once, write the valid prefix through a
strided view (no pad + cat copies). Exact: same values, fewer copies.

auto: on with cuDNN attention and ulysses_padding=fixed_valid when there are padding rows; the seed
drops it when the length divides by the degree (nothing to write around).
Runtime: h3plan/runtime/levers/prefix_inplace.py (its option of the Ulysses exchange).
"""

from __future__ import annotations

from ..sources import cite
from . import rules
from .base import Context, default_install, is_bool, Option, resolve, Spec

SPEC = Spec(
    name="prefix_inplace",
    settings={"off": True, "on": True},
    summary="cuDNN on a padded sequence writes the valid prefix into a padded output allocated once (exact)",
    ulysses=True,
    backends={"on": ("cudnn_bf16", "cudnn_fp8")},
    options=(Option("attention", "prefix_inplace", is_bool, "bool", False,
                    describe=lambda v: "prefix_inplace" if v else None),),
    column="prefix",
)


def blockers(ctx: Context, s: str) -> list[str]:
    if s == "off":
        return []
    out = []
    if not ctx.shape["padding_rows"]:
        out.append(f"{ctx.seq_len:,} tokens divide by {ctx.degree}: no padded output")
    elif rules.ulysses_padding(ctx) != "fixed_valid":
        out.append(f"ulysses_padding is {rules.ulysses_padding(ctx)}: only fixed_valid keeps a padded output")
    ring = rules.ring_excluded(ctx, SPEC.name, s)
    return out + ([ring] if ring else [])


def auto(ctx: Context):
    if not rules.cudnn(ctx):
        return "off", [f"attention is {rules.attention(ctx)}, not cuDNN"], {}
    if not ctx.shape["padding_rows"]:
        return "off", [f"{ctx.seq_len:,} tokens divide by {ctx.degree}: nothing to pad ({cite('trtllm-seed')} writes "
                       "the prefix in place only when the length does not divide by the degree)"], {}
    if rules.ulysses_padding(ctx) != "fixed_valid":
        return "off", [f"ulysses_padding is {rules.ulysses_padding(ctx)}: no padded output"], {}
    ring = rules.ring_excluded(ctx, SPEC.name, "on")
    if ring:
        return "off", [ring], {}
    return "on", [f"{ctx.shape['padding_rows']} padding rows at degree {ctx.degree}: padded output allocated once, "
                  f"prefix written in place ({cite('trtllm-seed')}: it pays at Ulysses 4)"], {}


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto)


install = default_install(SPEC)
