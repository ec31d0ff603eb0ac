"""Overlap the Ulysses all-to-all with attention: local heads in `attention_chunks` chunks, attention
on chunk i while chunk i+1 is exchanged (exact: the same per-head math).

auto: off with a dynamic-scale FP8 cast (an async arm with the FP8 cast uses static scales). Where the
hardware has measured the installed plan with overlap on against off at this Ulysses degree
(`measured.ulysses.overlap`, nearest length), on only if every run there timed it faster. Otherwise on
with >= 2 chunks once the length reaches the hardware's overlap_min_seq_len (TRT-LLM seed (docs/sources.md#trtllm-seed):
async Ulysses loses at 19k, gains a little at 104k; telefuser: a gain on H100).
Runtime: h3plan/runtime/levers/ulysses_overlap.py (the head chunks it passes to the Ulysses exchange).
"""

from __future__ import annotations

from ..sources import cite
from . import rules
from .base import Context, Option, Spec, faster_in_every_run, nearest_ulysses_point, resolve, speedup_runs


SPEC = Spec(
    name="ulysses_overlap",
    settings={"off": True, "on": True},
    summary="overlap the Ulysses all-to-all with attention over head chunks (exact)",
    ulysses=True,
    options=(Option("attention", "ulysses_chunks", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                    "int >= 1", 1, describe=lambda v: f"chunks={v}"),),
    column="overlap",
)


def chunk_heads(heads: int, chunks: int) -> list[int]:
    """Even split, larger chunks first: 7 heads in 2 chunks -> [4, 3]."""
    q, r = divmod(heads, chunks)
    return [q + 1] * r + [q] * (chunks - r)


def blockers(ctx: Context, s: str) -> list[str]:
    if s == "off":
        return []
    out = []
    if ctx.degree == 1:
        out.append("Ulysses degree 1: there is no all-to-all to overlap")
    c, hl = ctx.parallel["attention_chunks"], ctx.shape["heads_per_rank"]
    if c < 2:
        out.append(f"parallel.attention_chunks={c}: overlap needs 2 or more chunks")
    if c > hl:
        out.append(f"parallel.attention_chunks={c} exceeds the {hl} heads per rank")
    return out


def auto(ctx: Context):
    if ctx.degree == 1:
        return "off", ["Ulysses degree 1: no all-to-all"], {}
    c, hl = ctx.parallel["attention_chunks"], ctx.shape["heads_per_rank"]
    if c < 2 or c > hl:
        return "off", [f"parallel.attention_chunks={c} with {hl} heads per rank: no head chunks to overlap"], {}
    if rules.fp8_qk_cast(ctx) and rules.fp8_scales(ctx) == "dynamic":
        return "off", ["an async Ulysses arm with the FP8 cast uses static scales and these are dynamic "
                       f"({cite('trtllm-seed')}: with dynamic scales it was slower at 19k tokens, about 150 small "
                       "all-reduces per step)"], {}
    m = nearest_ulysses_point(ctx.hardware, "overlap", ctx.degree, ctx.seq_len)
    if m is not None:
        runs = speedup_runs(m["speedups"])
        where = (f"{ctx.hw} at degree {ctx.degree}, {m['seq_len']:,} tokens (nearest measured length): overlap on vs "
                 f"off {runs} ({ctx.hardware['measured']['ulysses']['source']})")
        if not faster_in_every_run(m["speedups"]):
            return "off", [f"measured {where}: not faster in every run"], {}
        return "on", [f"measured {where}: faster in every run"], params(ctx, "on")
    thr = ctx.tuning["overlap_min_seq_len"]
    rule = (f"hardware.tuning.overlap_min_seq_len = {thr:,} ({ctx.hardware['tuning']['source']}); "
            f"never measured at degree {ctx.degree} on {ctx.hw}")
    if ctx.seq_len < thr:
        return "off", [f"{ctx.seq_len:,} tokens < {thr:,}: the overlap loses at short lengths; {rule}"], {}
    return "on", [f"{ctx.seq_len:,} tokens >= {thr:,}: attention on one head chunk overlaps the next chunk's "
                  f"all-to-all; {rule}"], params(ctx, "on")


def params(ctx: Context, s: str) -> dict:
    if s == "off":
        return {}
    c = ctx.parallel["attention_chunks"]
    return {"chunks": c, "chunk_heads": chunk_heads(ctx.shape["heads_per_rank"], c)}


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, params=params)


def install(builder, decision) -> None:
    if decision.setting == "on":
        builder.set(SPEC.name, "ulysses_chunks", int(decision.param("chunks")))
    else:
        builder.skip(SPEC.name, decision.reasons[0])
