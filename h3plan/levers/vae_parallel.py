"""One video decode spread over the plan's Ulysses ranks: each rank decodes its share of the (temporal chunk,
spatial tile) decoder calls, the decoded tiles are gathered, and every rank stitches them with diffusers' own
code, so the frames are bitwise the one-GPU decode (h3plan/install/vae/parallel.py).

auto: tiles at Ulysses degree > 1 when the request's latent decodes in several calls and the estimate
(h3plan/facts/vae/parallel_plan.py: the one-GPU decode divided over the ranks, plus the gather at the measured
all-to-all rate) promises >= 1.05x; off otherwise, with the numbers.
"""

from __future__ import annotations

from h3plan.facts.vae import parallel_plan as vpp
from h3plan.facts.vae.tiling import Geometry
from .base import Context, Option, Spec, is_bool, resolve
from .vae_tiles import TILE_OF

SPEC = Spec(
    name="vae_parallel",
    settings={"off": True, "tiles": True},  # the same decoder calls on the same inputs, stitched by diffusers' code
    summary="one video decode spread over the Ulysses ranks, tiles gathered, stitched by diffusers (bitwise)",
    model="vae",
    ulysses=True,
    counter="vae_parallel",
    options=(Option("vae", "parallel", is_bool, "bool", False),),
)


def _latent(ctx: Context) -> tuple[int, int, int] | None:
    r = ctx.request
    if not r or "latent_frames" not in r:
        return None
    return int(r["latent_frames"]), int(r["latent_height"]), int(r["latent_width"])


def _geometry(ctx: Context) -> Geometry:
    tile = ctx.vae[TILE_OF[ctx.setting("vae_tiles")]]
    return Geometry.from_config(ctx.vae["diffusers_config"], tile if tile.get("height") else None)


def _gather_gbps(ctx: Context) -> float:
    pts = [p for p in ctx.hardware["measured"]["ulysses"]["a2a"] if p["degree"] == ctx.degree]
    return min(p["gbps_leaving_rank"] for p in pts) if pts else vpp.H200_GATHER_GBPS


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
    return vpp.auto(latent, ctx.degree, _geometry(ctx), gather_gbps=_gather_gbps(ctx))


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto)


def install(builder, decision) -> None:
    if decision.setting == "tiles":
        builder.set(SPEC.name, "parallel", True)
    else:
        builder.skip(SPEC.name, decision.reasons[0])
