"""The tile geometry the video VAE *encode* runs at (fl2va keyframes, ref2va image / video references).

diffusers' AutoencoderKLMiniMaxH3 keeps one set of tile attributes (`tile_sample_min_*`) for `_encode_clip` and
`_decode_clip`, so a decode geometry set through `enable_tiling` (vae_tiles=fp8_tiles or custom) also re-tiles the
encode, and changes its latents: the conditioning of every denoise step.

off: the request encodes nothing (t2va): no row in the plan's tables. default: the encode tiles at the geometry the VAE
had before install (diffusers' released 256 px / overlap 64 as loaded), whatever vae_tiles gives the decode: bit for
bit diffusers' encode (install wraps `_encode` to lay those tiles while it runs, only where vae_tiles changed them;
elsewhere it installs nothing).
decode: the encode shares vae_tiles' geometry (diffusers' behaviour after enable_tiling): lossy where that geometry
is not the released one, so only where vae_tiles changes it and the recipe allows a lossy VAE; forced only (a decode
budget does not cover the encode: vae_encode_precision says why).
"""

from __future__ import annotations

from . import rules
from .base import Context, Option, Spec, Terms, one_of, resolve, VERIFY_DECODE
from .vae_encode_precision import encodes_nothing, lossy_vae

SPEC = Spec(
    name="vae_encode_tiles",
    settings={"off": True, "default": True, "decode": False},
    summary="the encode's tile geometry (default: the VAE's own as loaded, bit for bit; decode: vae_tiles' geometry)",
    model="vae",
    verify=VERIFY_DECODE,
    options=(Option("vae", "encode_tiling", *one_of("shared", "own"), default="shared"),),
    terms={"decode": Terms(vae_encode_shares_tile=True)},
    table_skips_off=True,
)


def blockers(ctx: Context, s: str) -> list[str]:
    none = encodes_nothing(ctx)
    if none and s != "off":
        return [f"{none}: levers.{SPEC.name}=off (or auto)"]
    if not none and s == "off":
        return ["the request encodes: its tiles are default or decode"]
    if s == "decode" and rules.vae_tiles(ctx) == "default":
        return ["vae_tiles is default: the decode's geometry is the model's own (levers.vae_encode_tiles=default)"]
    return []


def policy(ctx: Context, s: str) -> list[str]:
    return [] if SPEC.lossless(s) or lossy_vae(ctx) else [
        f"recipe {ctx.recipe['name']} has policy lossless and vae=fp32: an encode at vae_tiles' geometry changes the "
        "conditioning latents; set recipe.vae=fp16 with it to accept a lossy VAE"]


def auto(ctx: Context):
    none = encodes_nothing(ctx)
    if none:
        return "off", [none], {}
    tiles = rules.vae_tiles(ctx)
    if tiles == "default":
        return "default", ["the encode tiles at the VAE's own geometry (vae_tiles is default: the decode's too): bit "
                           "for bit diffusers' encode"], {}
    return "default", [f"vae_tiles={tiles} re-tiles the decode; the encode keeps the VAE's own geometry (diffusers "
                       "shares one set of tile attributes: install lays the encode's own while it runs), bit for bit: "
                       f"a decode budget does not cover the conditioning latents (levers.{SPEC.name}=decode forces the "
                       "shared geometry)"], {}


def explain(ctx: Context, s: str) -> list[str]:
    if s != "decode":
        return []
    return [f"the encode tiles at vae_tiles={rules.vae_tiles(ctx)}'s geometry (enable_tiling's shared attributes): "
            "lossy, outside the measured budget: it changes the conditioning latents and so every denoise step"]


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, explain=explain, policy=policy)


def install(builder, decision) -> None:
    if decision.setting == "default":
        builder.set(SPEC.name, "encode_tiling", "own")
    else:
        builder.skip(SPEC.name, decision.reasons[0])
