"""Fused gated residual `h + gate[idx] * y` (exact: one BF16 rounding per eager op kept)."""

from __future__ import annotations

from .base import Context, resolve

LEVER = "gated_residual"
LOSSLESS = {"off": True, "on": True}


def decide(ctx: Context):
    return resolve(ctx, LEVER, lossless=LOSSLESS, blockers=lambda c, s: [],
                   auto=lambda c: ("on", ["h + gate[idx] * y fused, eager's rounding kept (exact; vllm-omni VAE seed pattern)"], {}))


def install(builder, decision) -> None:
    if decision.setting == "on":
        builder.set_block_option(LEVER, "gated_residual", True)
    else:
        builder.skip(LEVER, decision.reasons[0])
