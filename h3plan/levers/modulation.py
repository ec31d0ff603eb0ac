"""norm1/norm2 RMSNorm + indexed AdaLN scale/shift in one kernel.

exact keeps eager's BF16 rounding points (telefuser seed (docs/sources.md#telefuser-seed): bit-exact); fp32
single-rounds (vllm-omni seed: PSNR 39.55 dB, SSIM 0.975) and is only used when forced under a budget policy.
"""

from __future__ import annotations

from ..sources import cite
from .base import Context, default_install, one_of, Option, resolve, Spec

SPEC = Spec(
    name="modulation",
    settings={"eager": True, "exact": True, "fp32": False},
    summary="RMSNorm + indexed AdaLN modulation in one kernel (exact keeps eager's rounding; fp32 lossy)",
    counter="modulation",
    options=(Option("block", "modulation", *one_of("eager", "exact", "fp32"), default="eager",
                    swap=lambda v: (".norm1/norm2+modulate", "eager", v) if v != "eager" else None),),
    kernels=("modulation",),
)


def blockers(ctx: Context, s: str) -> list[str]:
    return []


def auto(ctx: Context):
    return "exact", ["RMSNorm + indexed modulation in one kernel with eager's BF16 rounding points "
                     f"({cite('telefuser-seed')}: bit-identical videos)",
                     f"fp32 rounds once (PSNR 39.55 dB in {cite('vllm-omni-modulation-seed')}) and was never measured "
                     "faster than exact: not picked"], {}


def explain(ctx: Context, s: str) -> list[str]:
    return {"fp32": [f"one rounding in fp32 ({cite('vllm-omni-modulation-seed')}: PSNR 39.55 dB, SSIM 0.975)",
                     ctx.budget_text()]}.get(s, [])


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, explain=explain)


install = default_install(SPEC)
