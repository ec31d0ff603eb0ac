"""One video decode spread over the plan's Ulysses ranks: each rank decodes its share of the (temporal chunk,
spatial tile) decoder calls, the decoded tiles are gathered, and every rank stitches them with diffusers' own
code, so the frames are bitwise the one-GPU decode (h3plan/install/vae/parallel.py).

auto: tiles at Ulysses degree > 1 when the request's latent decodes in several calls and the estimate
(h3plan/facts/vae/parallel_plan.py: the one-GPU decode divided over the ranks, plus the gather at the measured
all-to-all rate) promises >= 1.05x; off otherwise, with the numbers. The one-GPU decode is the plan's own: the decode
measured on this hardware at the plan's vae_precision and vae_tiles (h3plan/facts/vae/decode.py, the figure the
speed line takes at degree 1), else the H200's fp16 decode of the released latent; the decision's `decode_s` is the
degree's figure, which the speed line takes in its place (one decode time per plan).
"""

from __future__ import annotations

from h3plan.facts.vae import decode as vae_decode, parallel_plan as vpp
from h3plan.facts.vae.tiling import Geometry
from . import rules
from .base import Context, Option, Spec, Terms, is_bool, resolve, VERIFY_DECODE
from .vae_tiles import TILE_OF

ELEM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}  # the decoded tiles' dtype at each vae_precision (what the ranks gather)

SPEC = Spec(
    name="vae_parallel",
    settings={"off": True, "tiles": True},  # the same decoder calls on the same inputs, stitched by diffusers' code
    summary="one video decode spread over the Ulysses ranks, tiles gathered, stitched by diffusers (bitwise)",
    model="vae",
    verify=VERIFY_DECODE,
    ulysses=True,
    counter="vae_parallel",
    routes=("replay",),  # the decoder calls replayed on the ranks (install/vae/parallel.py)
    options=(Option("vae", "parallel", is_bool, "bool", False),),
    terms={"tiles": Terms(vae_spread=True)},
)


def _latent(ctx: Context) -> tuple[int, int, int] | None:
    r = ctx.request
    if not r or "latent_frames" not in r:
        return None
    return int(r["latent_frames"]), int(r["latent_height"]), int(r["latent_width"])


def _geometry(ctx: Context) -> Geometry:
    tile = ctx.vae[TILE_OF[rules.vae_tiles(ctx)]]
    return Geometry.from_config(ctx.vae["diffusers_config"], tile if tile.get("height") else None)


def _gather_gbps(ctx: Context) -> float:
    pts = [p for p in ctx.hardware["measured"]["ulysses"]["a2a"] if p["degree"] == ctx.degree]
    return min(p["gbps_leaving_rank"] for p in pts) if pts else vpp.H200_GATHER_GBPS


def _anchor(ctx: Context, latent: tuple[int, int, int], g: Geometry) -> vpp.Anchor:
    """The one-GPU decode the estimate divides: the plan's decode measured on this hardware (its precision and tiles),
    else the H200's fp16 decode of the released latent."""
    prec, tiles = rules.vae_precision(ctx), rules.vae_tiles(ctx)
    p = vae_decode.nearest(ctx.hardware["measured"].get("decode"), prec, tiles, latent)
    if p is None:
        return vpp.H200_PLAN
    s = vae_decode.seconds(p, latent)
    return vpp.Anchor(latent, (s, s), g, f"the plan's decode on one GPU: {p['seconds']:g} s measured on {ctx.hw} at "
                                         f"latent {p['latent']} (vae_precision={prec}, vae_tiles={tiles}), scaled by "
                                         f"latent volume ({p['source']}); the audio decode and the postprocess in it "
                                         "are spread too, so the estimate is optimistic by their share")


def _estimate(ctx: Context, latent: tuple[int, int, int]) -> dict:
    """vpp.auto's keywords for this plan: its one-GPU anchor, the gather rate, the decoded tiles' bytes."""
    g = _geometry(ctx)
    return {"anchor": _anchor(ctx, latent, g), "gather_gbps": _gather_gbps(ctx),
            "elem_bytes": ELEM_BYTES.get(rules.vae_precision(ctx), 2)}


def blockers(ctx: Context, s: str) -> list[str]:
    latent = _latent(ctx)
    if s == "tiles" and latent is None:
        return ["parallel.seq_len is set explicitly: no video request gives the latent to decode"]
    return vpp.blockers(s, latent or (1, 1, 1), ctx.degree, _geometry(ctx))


def auto(ctx: Context):
    latent = _latent(ctx)
    if ctx.degree == 1:
        return "off", ["Ulysses degree 1: one rank decodes"], {}
    if latent is None:
        return "off", ["parallel.seq_len is set explicitly: no video request gives the latent to decode"], {}
    return vpp.auto(latent, ctx.degree, _geometry(ctx), **_estimate(ctx, latent))


def forced(ctx: Context, s: str) -> tuple[list[str], dict]:
    """A forced tiles: the same estimate and figures as auto's (blockers have ruled out what cannot apply)."""
    latent = _latent(ctx)
    if s != "tiles" or latent is None:
        return [], {}
    _, reasons, params = vpp.auto(latent, ctx.degree, _geometry(ctx), min_speedup=0.0, **_estimate(ctx, latent))
    return reasons, params


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, explain=lambda c, s: forced(c, s)[0],
                   params=lambda c, s: forced(c, s)[1])


def install(builder, decision) -> None:
    if decision.setting == "tiles":
        builder.set(SPEC.name, "parallel", True)
    else:
        builder.skip(SPEC.name, decision.reasons[0])
