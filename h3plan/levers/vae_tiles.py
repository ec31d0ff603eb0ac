"""VAE decode tile geometry. default: diffusers' released geometry (256 px, overlap 64; the released
frames are the blended-tile ones, so any other geometry changes the output). fp8_tiles: the TRT-LLM
seed's FP8 tiled decoder at 288x272 (overlap 32), lossy: the geometry, plus the ViT decoder blocks'
six linears as FP8 GEMMs (h3plan/install/vae/fp8.py; per-channel e4m3 weights, per-row e4m3 activations,
float16 out; an fp32 emulation, counted, where torch's FP8 GEMM cannot run). Only a budget recipe with
vae: fp8 on hardware with FP8 GEMMs gets it; a lossless recipe never does. custom: vae.custom_tile, lossy
for the same reason as any non-default geometry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from omegaconf import MISSING

from . import rules
from .base import Context, Option, Spec, Terms, hardware_verified, one_of, resolve, VERIFY_DECODE


@dataclass
class VaeFp8Point:
    """hardware.measured.vae_fp8, fp8_tiles' evidence: the FP8 VAE decode against diffusers eager at the same tiles
    (empty: never measured)."""

    latent: List[int] = MISSING
    speedup: float = MISSING
    """diffusers eager at the same tile geometry / the FP8 plan's decode."""
    psnr_db: float = MISSING
    """The plan's decoded frames against that eager decode."""
    peak_ratio: float = MISSING
    source: str = MISSING


SPEC = Spec(
    name="vae_tiles",
    settings={"default": True, "fp8_tiles": False, "custom": False},
    summary="VAE decode tile geometry (any geometry but diffusers' released one changes the frames)",
    model="vae",
    verify=VERIFY_DECODE,
    routes=("fp8_gemm", "fp8_rows"),  # fp8_tiles' decoder GEMMs and their activation rows (install/vae/fp8.py)
    options=(Option("vae", "tile",
                    lambda v: v is None or (isinstance(v, dict) and {"height", "width", "overlap"} <= set(v)),
                    "None (keep the model's tiling) or dict(height, width, overlap, frames)", None),
             Option("vae", "tile_dtype", *one_of("fp16", "fp8"), default="fp16")),
    column="vae_tiles",
    terms={"fp8_tiles": Terms(vae_tile="fp8_tile", vae_fp8_gemms=True), "custom": Terms(vae_tile="custom_tile")},
    hardware={"measured.vae_fp8": List[VaeFp8Point]},
)
TILE_OF = {"default": "default_tile", "fp8_tiles": "fp8_tile", "custom": "custom_tile"}


def blockers(ctx: Context, s: str) -> list[str]:
    out = []
    if s == "fp8_tiles" and not ctx.hardware["gemm"]["fp8"]:
        out.append(f"{ctx.hw} has no FP8 GEMMs for the FP8 decoder ({ctx.hardware['gemm']['source']})")
    if s == "fp8_tiles" and rules.vae_precision(ctx, "fp16") != "fp16":
        out.append(f"vae_precision is {rules.vae_precision(ctx)}: the FP8 decoder GEMMs take and give float16 "
                   "(vae_precision=fp16)")
    if s == "custom" and any(ctx.vae["custom_tile"][k] is None for k in ("height", "width", "overlap")):
        out.append("set vae.custom_tile.height, .width and .overlap (pixels, multiples of 16)")
    return out


def auto(ctx: Context):
    name = ctx.recipe["name"]
    keep = "diffusers' released tile geometry (256 px, overlap 64): any other geometry changes the blended frames"
    if ctx.recipe["vae"] == "fp8":
        if ctx.lossless_only:
            return "default", [f"recipe {name} asks for FP8 VAE tiles but its policy is lossless",
                               keep], params(ctx, "default")
        if not ctx.hardware["gemm"]["fp8"]:
            return "default", [f"recipe {name} asks for FP8 VAE tiles but {ctx.hw} has no FP8 GEMMs",
                               keep], params(ctx, "default")
        if rules.vae_precision(ctx) != "fp16":
            return "default", [f"recipe {name} asks for FP8 VAE tiles but vae_precision is {rules.vae_precision(ctx)} "
                               "(the FP8 decoder GEMMs need fp16)", keep], params(ctx, "default")
        t = ctx.vae["fp8_tile"]
        times = measured_decodes(ctx)
        if (times.get("default") is not None and times.get("fp8_tiles") is not None
                and times["default"] < times["fp8_tiles"]):
            return "default", [f"recipe {name} asks for FP8 VAE tiles, but the default tiles decode faster on "
                               f"{ctx.hw}: default {times['default']:.2f} s, fp8_tiles {times['fp8_tiles']:.2f} s "
                               "(hardware.measured.decode)",
                               keep], params(ctx, "default")
        timed = (f"; measured decode on {ctx.hw}: "
                 + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(times.items(), key=lambda kv: kv[1]))
                 if len(times) > 1 else "")
        return "fp8_tiles", [f"recipe {name}: FP8 tiled VAE decoder {t['height']}x{t['width']}, overlap {t['overlap']} "
                             f"({t['source']})"
                             + timed, *explain(ctx, "fp8_tiles")], params(ctx, "fp8_tiles")
    return "default", [keep], params(ctx, "default")


def measured_decodes(ctx: Context) -> dict[str, float]:
    """Tile setting -> measured decode seconds at the plan's decode precision (hardware.measured.decode), at the
    measured latent nearest the plan's (the times compare only at one latent)."""
    prec = rules.vae_precision(ctx)
    pts = [p for p in ctx.hardware["measured"].get("decode") or () if p["precision"] == prec and p["tiles"] in TILE_OF]
    if not pts:
        return {}
    latent = min((p["latent"] for p in pts), key=lambda lt: abs(lt[2] - ctx.request.get("latent_frames", lt[2])))
    return {p["tiles"]: p["seconds"] for p in pts if p["latent"] == latent}


def explain(ctx: Context, s: str) -> list[str]:
    if s != "fp8_tiles":
        return []
    ran = hardware_verified(ctx, SPEC, s)[0]
    return (["FP8 decode: the ViT decoder blocks' six linears run as FP8 GEMMs where the decoder computes in float16 "
             "(e4m3 weights with one scale per output channel, quantised once at install; e4m3 activations with one "
             "scale per row; torch._scaled_mm to float16 on SM89+): lossy, e4m3 keeps 3 mantissa bits (relative "
             "rounding error <= 2^-4 per operand); " + ctx.budget_text()
             + "; benchmarks/vae.py measures the frames' PSNR against eager"
             + ("" if ran else f"; the FP8 VAE GEMMs never ran on {ctx.hw} hardware (no measurement recorded)")]
            + _measured(ctx))


def _measured(ctx: Context) -> list[str]:
    return [f"measured on {ctx.hw}: latent {'x'.join(map(str, m['latent']))}, {m['speedup']:.2f}x diffusers eager at "
            f"the same tiles, PSNR {m['psnr_db']:.1f} dB, peak {m['peak_ratio']:.2f}x eager's ({m['source']})"
            for m in ctx.hardware["measured"].get("vae_fp8") or []]


def params(ctx: Context, s: str) -> dict:
    t = ctx.vae[TILE_OF[s]]
    p = {"tile": {k: t[k] for k in ("height", "width", "frames", "overlap")}}
    if s == "fp8_tiles":
        p["dtype"] = "fp8"
    return p


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, params=params, explain=explain)


def install(builder, decision) -> None:
    if decision.setting == "default":
        builder.skip(SPEC.name, decision.reasons[-1])
    else:
        builder.set(SPEC.name, "tile", dict(decision.param("tile")))
        if decision.param("dtype") == "fp8":
            builder.set(SPEC.name, "tile_dtype", "fp8")
