"""How a sequence that does not divide by the Ulysses degree is padded (all modes exact).

none: nothing to pad (degree 1, or the length divides). fixed_valid: attention on the valid prefix,
padded output kept (cuDNN's key-padding path, TRT-LLM seed (docs/sources.md#trtllm-seed)). valid_only: the tail is never
restored and the merge writes a zero tail (telefuser seed (docs/sources.md#telefuser-seed)). padded: attention over the
padded rows with masked keys (more work; only when asked for). parallel.padding fixes the mode for auto.
At parallel.ring > 1 only none: the ring skips padded keys through its per-block valid counts and Ulysses
inside a ring block sees full blocks (h3plan/runtime/parallel/ring.py).
Runtime: h3plan/runtime/levers/ulysses_padding.py (the mode it passes to the Ulysses exchange).
"""

from __future__ import annotations

from ..sources import cite
from . import rules
from .base import Context, Option, Spec, Terms, one_of, resolve


SPEC = Spec(
    name="ulysses_padding",
    settings={"none": True, "padded": True, "fixed_valid": True, "valid_only": True},
    summary="how a sequence that does not divide by the Ulysses degree is padded (all modes exact)",
    ulysses=True,
    options=(Option("attention", "ulysses_degree", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                    "int >= 1", 1, describe=str),
             Option("attention", "ulysses_padding", *one_of("none", "padded", "fixed_valid", "valid_only"),
                    default="none", describe=str)),
    terms={"padded": Terms(attention_padded=True)},
)


def blockers(ctx: Context, s: str) -> list[str]:
    pad, fixed = ctx.shape["padding_rows"], ctx.parallel["padding"]
    ring = ctx.ring
    if ring > 1:
        return [] if s == "none" else [RING_WHY.format(ring=ring)]
    out = []
    if ctx.degree == 1 and s != "none":
        out.append("Ulysses degree 1: the sequence is not split, there is nothing to pad")
    if ctx.degree > 1 and s == "none" and pad:
        out.append(f"{ctx.seq_len:,} tokens do not divide by {ctx.degree}: {pad} padding rows need a mode")
    if ctx.degree > 1 and fixed != "auto" and s != fixed and not (s == "none" and not pad):
        out.append(f"parallel.padding={fixed} fixes the mode")
    return out


RING_WHY = ("parallel.ring={ring}: the ring skips padding keys by its per-block valid counts and Ulysses inside a "
            "ring block sees full blocks, so no Ulysses padding mode applies")


def auto(ctx: Context):
    pad, u = ctx.shape["padding_rows"], ctx.degree
    if ctx.ring > 1:
        why = RING_WHY.format(ring=ctx.ring)
        if ctx.parallel["padding"] not in ("auto", "none"):
            why += f" (parallel.padding={ctx.parallel['padding']} does not apply)"
        return "none", [why], params(ctx, "none")
    if u == 1:
        return "none", ["Ulysses degree 1: no sequence split"], params(ctx, "none")
    if not pad:
        return "none", [f"{ctx.seq_len:,} tokens divide by {u}: no padding rows"], params(ctx, "none")
    head = f"{ctx.seq_len:,} tokens pad to {ctx.shape['padded_len']:,} ({pad} rows) at degree {u}"
    if ctx.parallel["padding"] != "auto":
        return (ctx.parallel["padding"], [head, f"parallel.padding={ctx.parallel['padding']}"],
                params(ctx, ctx.parallel["padding"]))
    if rules.cudnn(ctx):
        return "fixed_valid", [head, "cuDNN runs on the valid prefix and writes a padded output (the key-padding path "
                                     f"of {cite('trtllm-seed')})"], params(ctx, "fixed_valid")
    return "valid_only", [head, "attention on the valid prefix, tail never restored, zero tail in the fused merge "
                                f"({cite('telefuser-seed')})"], params(ctx, "valid_only")


def params(ctx: Context, s: str) -> dict:
    return {"degree": ctx.degree, "valid_len": ctx.seq_len, "padded_len": ctx.shape["padded_len"],
            "padding_rows": ctx.shape["padding_rows"]}


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, params=params)


def install(builder, decision) -> None:
    if decision.param("degree", 1) == 1:
        builder.skip(SPEC.name, decision.reasons[0])
        return
    builder.set(SPEC.name, "ulysses_degree", int(decision.param("degree")))
    builder.set(SPEC.name, "ulysses_padding", decision.setting)
