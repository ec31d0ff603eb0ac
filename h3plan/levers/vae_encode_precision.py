"""The precision the video VAE *encode* runs in: `AutoencoderKLMiniMaxH3.encode` of fl2va's keyframes
(`MiniMaxH3KeyframeVaeEncoderStep`) and ref2va's image and video references (`MiniMaxH3Ref2VAReferenceEncoderStep`).

off: the request encodes nothing (t2va; or parallel.seq_len set with no request): no cost, and the plan's tables
leave its row out (no encode line in a t2va plan). fp32: diffusers' encode as loaded (`encoder` and `quant_conv` are
in `_keep_in_fp32_modules`: a `torch_dtype` load and vae_precision's cast leave them float32), bit for bit. fp16 /
bf16: `encoder` and `quant_conv` cast at install (h3plan/install/vae/install.py; the float32 originals on the host
for uninstall); `encode` casts its input to the encoder's dtype itself, so diffusers' steps run it unchanged. The
decoder and the decode levers are untouched.

Policy. auto keeps fp32 wherever the request encodes: a lossless recipe keeps the encode's bits; a recipe that allows
a lossy VAE (recipe.vae=fp16|bf16|fp8, or a lossy policy) has a budget measured on the decode's frames, and the encode
is upstream of the whole denoise (its latents condition every step), so that budget does not cover it, and no fp16
encode was ever compared through a whole pipe(...). Forcing it (levers.vae_encode_precision=fp16) works wherever the
recipe allows a lossy VAE, and the line says it is outside the measured budget; a lossless recipe with vae=fp32
refuses it in one line. The encode's tiles are vae_encode_tiles' (levers/vae_encode_tiles.py).
"""

from __future__ import annotations

from h3plan.facts.vae.encode import describe, encode_inputs, seconds
from h3plan.facts.workflows import DEFAULT_TASK

from .base import Context, Option, Spec, Terms, one_of, resolve, VERIFY_DECODE, StateKeys

DTYPES = ("fp32", "fp16", "bf16")
SPEC = Spec(
    name="vae_encode_precision",
    settings={"off": True, "fp32": True, "fp16": False, "bf16": False},
    summary="the precision the VAE encode of keyframes / references runs in (fp32: diffusers' default; off: t2va)",
    model="vae",
    verify=VERIFY_DECODE,
    options=(Option("vae", "encode_precision", *one_of(*DTYPES), default="fp32"),),
    terms={"fp16": Terms(vae_encode_cast="fp16"), "bf16": Terms(vae_encode_cast="bf16")},
    state={s: (StateKeys("replaces", ("encoder.*", "quant_conv.*")),) for s in ("fp16", "bf16")},  # cast
    table_skips_off=True,
)


def encodes_nothing(ctx: Context) -> str | None:
    """Why the request makes no encode (None: it makes at least one)."""
    if not ctx.request:
        return "no video request (parallel.seq_len set): no encode planned"
    if not encode_inputs(ctx.request):
        return f"{ctx.request.get('task', DEFAULT_TASK)} encodes nothing"
    return None


def lossy_vae(ctx: Context) -> bool:
    """The recipe allows a lossy VAE: its own vae key asks for one, or its policy is lossy."""
    return str(ctx.recipe["vae"]) != "fp32" or not ctx.lossless_only


def blockers(ctx: Context, s: str) -> list[str]:
    none = encodes_nothing(ctx)
    if none and s != "off":
        return [f"{none}: levers.{SPEC.name}=off (or auto)"]
    if not none and s == "off":
        return [f"{describe(encode_inputs(ctx.request))}: the encoder runs (fp32 keeps diffusers' encode)"]
    return []


def policy(ctx: Context, s: str) -> list[str]:
    """A lossy encode needs a recipe that allows a lossy VAE (recipe.vae=fp16|bf16|fp8 or a lossy policy)."""
    if SPEC.lossless(s) or lossy_vae(ctx):
        return []
    return [f"recipe {ctx.recipe['name']} has policy lossless and vae=fp32: an {s} encode changes the conditioning "
            f"latents, so the frames; set recipe.vae=fp16 with it to accept a lossy VAE"]


def _times(ctx: Context) -> dict[str, float]:
    ins = encode_inputs(ctx.request) if ctx.request else []
    out = {}
    for p in DTYPES:
        s, _ = seconds(ctx.hardware["measured"].get("encode") or (), ins, p, ctx.hw)
        if s is not None:
            out[p] = s
    return out


def explain(ctx: Context, s: str) -> list[str]:
    if s == "off":
        return []
    what = describe(encode_inputs(ctx.request))
    if s == "fp32":
        return [f"{what}: the encoder and quant_conv run float32 as diffusers loads them (_keep_in_fp32_modules), "
                "the model's tiling: bit for bit diffusers' encode"]
    t = _times(ctx)
    timed = (f"; encode {t['fp32']:.2f} s at fp32 -> {t[s]:.2f} s at {s} on {ctx.hw}"
             if "fp32" in t and s in t else "")
    return [f"{what}: encoder and quant_conv cast to {s} at install (float32 originals on the host until uninstall); "
            "encode() casts its input to the encoder's dtype" + timed,
            f"lossy, and outside the measured budget: the {s} encode changes the conditioning latents and so every "
            f"denoise step; recipe {ctx.recipe['name']}'s budget was measured on the decode's frames, and no {s} "
            f"encode was ever compared with the fp32 encode through a whole pipe(...) on {ctx.hw}"]


def auto(ctx: Context):
    none = encodes_nothing(ctx)
    if none:
        return "off", [none], {}
    if not lossy_vae(ctx):
        why = f"recipe {ctx.recipe['name']} is lossless with vae=fp32: the encode keeps its bits"
    else:
        t = _times(ctx)
        cut = (f" (fp16 would take the encode from {t['fp32']:.2f} s to {t['fp16']:.2f} s on {ctx.hw})"
               if "fp32" in t and "fp16" in t else "")
        why = (f"recipe {ctx.recipe['name']} allows a lossy VAE, but its budget covers the decode's frames, not the "
               "encode: the encode's latents condition every denoise step, and no fp16 encode was ever measured "
               f"against fp32 through a whole pipe(...); fp32 kept{cut}; levers.{SPEC.name}=fp16 forces it")
    return "fp32", [why, *explain(ctx, "fp32")], {}


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, explain=explain, policy=policy)


def install(builder, decision) -> None:
    if decision.setting in ("off", "fp32"):
        builder.skip(SPEC.name, decision.reasons[0])
    else:
        builder.set(SPEC.name, "encode_precision", decision.setting)
