"""The precision the VAE decode runs in: fp32 (diffusers' default: the released checkpoint is float32 and
diffusers' decode step runs the VAE in its own dtype, with no autocast), fp16 or bf16 (lossy against fp32).

fp16 / bf16 install the cast `from_pretrained(torch_dtype=...)` makes: every floating parameter and buffer
whose name has no `_keep_in_fp32_modules` component (encoder, quant_conv, norm1, norm2, norm_out, scale1,
scale2 stay float32) becomes the dtype; the float32 originals wait in pinned host memory for uninstall only
(h3plan/install/vae/weights.py). diffusers' own decode step, `pipe.blocks` sub-blocks and a direct `vae.decode(z)`
then run the planned precision with no autocast on the user's side.

auto follows the recipe's `vae` key: fp32 for a lossless recipe (lossless against diffusers' default),
fp16 where the recipe asks for fp16 or for FP8 VAE tiles (their GEMMs take and give float16). A lossy
precision under a lossless recipe is the recipe's own choice (`recipe.vae=fp16`): the transformer's levers
stay lossless, the plan says the decode is lossy and prints the error measured against the fp32 decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from omegaconf import MISSING

from h3plan.facts.provenance import Provenance

from .base import Context, Option, Spec, Terms, one_of, policy_blockers, resolve, VERIFY_DECODE, StateKeys

DTYPES = ("fp32", "fp16", "bf16")


@dataclass
class VaePrecisionPoint:
    """hardware.measured.vae_precision, this lever's evidence: the fp16 / bf16 decodes against the fp32 decode
    (empty: never measured; the plan says so)."""

    precision: str = MISSING
    """fp16 | bf16: the decode precision (this lever's setting) measured against the fp32 decode."""
    latent: List[int] = MISSING
    psnr_db: float = MISSING
    """Its decoded frames against the fp32 decode's (peak 2: the VAE's normalized range)."""
    ssim: float = MISSING
    speedup: float = MISSING
    """The fp32 eager decode's time / this precision's eager decode time, in the same run."""
    source: str = MISSING
    provenance: List[Provenance] = field(default_factory=list)


SPEC = Spec(
    name="vae_precision",
    settings={"fp32": True, "fp16": False, "bf16": False},
    summary="the precision the VAE decode runs in (fp32: diffusers' default; fp16/bf16: lossy, measured against fp32)",
    model="vae",
    verify=VERIFY_DECODE,
    options=(Option("vae", "precision", *one_of(*DTYPES), default="fp32"),),
    terms={"fp16": Terms(vae_cast="fp16"), "bf16": Terms(vae_cast="bf16")},
    state={s: (StateKeys("replaces", ("post_quant_conv.*", "decoder.*")),) for s in ("fp16", "bf16")},  # cast
    hardware={"measured.vae_precision": List[VaePrecisionPoint]},
)
FROM_RECIPE = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "fp8": "fp16"}  # recipe.vae -> decode precision


def _wanted(ctx: Context) -> str:
    return FROM_RECIPE[str(ctx.recipe["vae"])]


def policy(ctx: Context, s: str) -> list[str]:
    """A lossless recipe refuses a lossy precision unless the recipe's own `vae` key asks for it."""
    if s == _wanted(ctx):
        return []
    out = policy_blockers(ctx, SPEC, s)
    return [o + f" (the decode precision is the recipe's choice: recipe.vae={s})" for o in out]


def _measured(ctx: Context, s: str) -> list[str]:
    pts = [p for p in ctx.hardware["measured"].get("vae_precision") or [] if p["precision"] == s]
    if not pts:
        return [f"the {s} decode's error against the fp32 decode was never measured on {ctx.hw}"]
    return [f"measured on {ctx.hw}: {s} decode against the fp32 decode at latent {'x'.join(map(str, p['latent']))}: "
            f"PSNR {p['psnr_db']:.1f} dB, SSIM {p['ssim']}, {p['speedup']:.2f}x the fp32 decode's speed ({p['source']})"
            for p in pts]


def explain(ctx: Context, s: str) -> list[str]:
    if s == "fp32":
        return ["the VAE decodes in float32 as diffusers builds and runs it: bit for bit diffusers' default decode"]
    dt = {"fp16": "float16", "bf16": "bfloat16"}[s]
    return ([f"the VAE is cast to {dt} at install as from_pretrained(torch_dtype=torch.{dt}) casts it (the "
             "_keep_in_fp32_modules stay float32; the float32 originals wait in pinned host memory until uninstall, "
             "never read by a call): diffusers' own decode step then runs it with no autocast",
             "lossy against the fp32 decode" + ("" if ctx.lossless_only else f"; {ctx.budget_text()}")]
            + _measured(ctx, s))


def auto(ctx: Context):
    s, name, v = _wanted(ctx), ctx.recipe["name"], ctx.recipe["vae"]
    why = (f"recipe {name} asks for vae={v}" + ("" if v == s else ": its FP8 VAE GEMMs take and give float16, so the "
                                                 "decode runs in fp16"))
    if s != "fp32" and ctx.lossless_only:
        why += "; the transformer stays lossless under policy lossless, the decode is the recipe's lossy choice"
    return s, [why, *explain(ctx, s)], {}


def decide(ctx: Context):
    return resolve(ctx, SPEC, auto=auto, explain=explain, policy=policy)


def install(builder, decision) -> None:
    builder.set(SPEC.name, "precision", decision.setting)
