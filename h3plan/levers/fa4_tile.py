"""FA4's forward tile for the transformer blocks; only with attention=fa4.

`default` leaves the tile to FA4's own heuristic. `tuned` passes a tile measured on this hardware
(`hardware.fa4.tuned_tiles`, by head dim) to FA4's forward. auto: tuned where the hardware lists a tile
for the model's head dim and, at the nearest measured sequence length, every run timed it faster than
FA4's default: attention alone (`speedups`) and the whole block (`block_speedups`, where measured);
else default (the reason names the runs). A tile whose output is not bit-identical to FA4's default is
lossy for this project's promise (a lossless plan matches diffusers' eager block given the *same*
backend), so under a lossless recipe only a `bitwise_vs_default` tile may be chosen.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from h3plan.facts.attention.spec import BackendOption

from . import rules
from .base import Context, Option, Spec, faster_in_every_run, resolve, speedup_runs

def is_tile(v: Any) -> bool:
    """An FA4 forward tile as the installer takes it: {tile_m, tile_n: int > 0; mma_pv_is_rs, intra_wg_overlap:
    bool}."""
    return (isinstance(v, dict) and set(v) == {"tile_m", "tile_n", "mma_pv_is_rs", "intra_wg_overlap"}
            and all(isinstance(v[k], int) and not isinstance(v[k], bool) and v[k] > 0 for k in ("tile_m", "tile_n"))
            and all(isinstance(v[k], bool) for k in ("mma_pv_is_rs", "intra_wg_overlap")))


SPEC = Spec(
    name="fa4_tile",
    settings={"default": True, "tuned": True},  # a tile that changes the bits is blocked below instead
    summary="FA4's forward tile: FA4's own heuristic or a tile measured on this hardware",
    counter="fa4_tile",
    backends={"tuned": ("fa4",)},
    options=(Option("attention", "fa4_tile", lambda v: v is None or is_tile(v),
                    "None or dict(tile_m, tile_n: int; mma_pv_is_rs, intra_wg_overlap: bool)", None,
                    swap=lambda t: (("", "fa4 default tile",
                                     f"tile {t['tile_m']}x{t['tile_n']} (mma_pv_is_rs={t['mma_pv_is_rs']})")
                                    if t else None)),),
    backend_reads={"fa4": BackendOption("fa4_tile", kwarg="tile", reason="tile_reason",
                                        describe=lambda t: f"tile={t['tile_m']}x{t['tile_n']}" if t else None)},
)


def tile_for(ctx: Context) -> Mapping[str, Any] | None:
    d = ctx.model["diffusers_config"]["attention_head_dim"]
    return next((t for t in ctx.hardware["fa4"].get("tuned_tiles") or [] if t["head_dim"] == d), None)


def nearest_speed(ctx: Context, t: Mapping[str, Any]) -> Mapping[str, Any]:
    """The measured point nearest the plan's sequence length (log scale), then nearest in heads."""
    heads = ctx.shape["heads_per_rank"]
    return min(t["measured"], key=lambda m: (abs(math.log(m["seq_len"] / ctx.seq_len)),
                                             abs(math.log(m["heads"] / heads))))


def _describe(t: Mapping[str, Any]) -> str:
    pv = "P in registers" if t["mma_pv_is_rs"] else "P through shared memory"
    return f"({t['tile_m']}, {t['tile_n']}), {pv}"


def blockers(ctx: Context, s: str) -> list[str]:
    if s == "default":
        return []
    out = []
    t = tile_for(ctx)
    if t is None:
        d = ctx.model["diffusers_config"]["attention_head_dim"]
        out.append(f"{ctx.hw} lists no measured FA4 tile for head_dim {d} (hardware.fa4.tuned_tiles)")
    elif ctx.lossless_only and not t["bitwise_vs_default"]:
        out.append(f"recipe {ctx.recipe['name']} has policy lossless and the {ctx.hw} tile {_describe(t)} changes "
                   "FA4's bits")
    ring = rules.ring_excluded(ctx, SPEC.name, s)
    return out + ([ring] if ring else [])


def auto(ctx: Context):
    if not rules.fa4(ctx):
        return "default", [f"attention is {rules.attention(ctx)}, not fa4"], params(ctx, "default")
    ring = rules.ring_excluded(ctx, SPEC.name, "tuned")
    if ring:
        return "default", [ring + "; FA4's own heuristic picks"], params(ctx, "default")
    t = tile_for(ctx)
    if t is None:
        return "default", [f"{ctx.hw}: no measured FA4 tile for this head dim; FA4's own heuristic "
                           "picks"], params(ctx, "default")
    if ctx.lossless_only and not t["bitwise_vs_default"]:
        return "default", [f"{ctx.hw}: the measured tile {_describe(t)} changes FA4's bits and the recipe is "
                           "lossless"], params(ctx, "default")
    m = nearest_speed(ctx, t)
    block = list(m.get("block_speedups") or [])
    runs = speedup_runs(m["speedups"]) + (f" attention alone; {speedup_runs(block)} whole block" if block else "")
    where = f"{m['seq_len']:,} x {m['heads']}"
    same = ("bit-identical to FA4's default tile" if t["bitwise_vs_default"]
            else "not bit-identical to FA4's default tile")
    if not faster_in_every_run(m["speedups"] + block):
        return "default", [f"{ctx.hw}: tile {_describe(t)} against FA4's default at {where} (nearest measured shape): "
                           f"{runs} over the runs, not faster in every run; FA4's default kept "
                           f"({t['source']})"], params(ctx, "default")
    return "tuned", [f"{ctx.hw}: tile {_describe(t)} is {same} and faster in every run at {where} (nearest measured "
                     f"shape): {runs} ({t['source']})"], params(ctx, "tuned")


def params(ctx: Context, s: str) -> dict:
    p: dict[str, Any] = {"attention": rules.attention(ctx)}
    t = tile_for(ctx) if s == "tuned" else None
    if t is not None:
        p["tile"] = {k: t[k] for k in ("tile_m", "tile_n", "mma_pv_is_rs", "intra_wg_overlap")}
    return p


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, params=params)


def install(builder, decision) -> None:
    if decision.param("attention") != "fa4":
        builder.skip(SPEC.name, decision.reasons[0])
        return
    tile = decision.param("tile") if decision.setting == "tuned" else None
    builder.set(SPEC.name, "fa4_tile", dict(tile) if tile else None)
