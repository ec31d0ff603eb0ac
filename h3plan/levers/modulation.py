"""norm1/norm2 RMSNorm + indexed AdaLN scale/shift in one kernel.

exact keeps eager's BF16 rounding points (telefuser seed: bit-exact); fp32 single-rounds (vllm-omni
seed: PSNR 39.55 dB, SSIM 0.975) and is only used when forced under a budget policy.
"""

from __future__ import annotations

from .base import Context, resolve

LEVER = "modulation"
LOSSLESS = {"eager": True, "exact": True, "fp32": False}


def blockers(ctx: Context, s: str) -> list[str]:
    return []


def auto(ctx: Context):
    return "exact", ["RMSNorm + indexed modulation fused with eager's BF16 rounding points (telefuser seed: bit-exact MP4)",
                     "fp32 single-rounds (PSNR 39.55 dB in the vllm-omni seed) with no measured speed advantage over exact: not picked"], {}


def explain(ctx: Context, s: str) -> list[str]:
    return {"fp32": ["single rounding in fp32 (vllm-omni seed: PSNR 39.55 dB, SSIM 0.975)", ctx.budget_text()]}.get(s, [])


def decide(ctx: Context):
    return resolve(ctx, LEVER, lossless=LOSSLESS, blockers=blockers, auto=auto, explain=explain)


def install(builder, decision) -> None:
    if decision.setting == "eager":
        builder.skip(LEVER, decision.reasons[0])
    else:
        builder.set_block_option(LEVER, "modulation", decision.setting)
