"""Fused SwiGLU activation after the FeedForward projection (exact)."""

from __future__ import annotations

from .base import Context, resolve

LEVER = "swiglu"
LOSSLESS = {"off": True, "on": True}


def decide(ctx: Context):
    return resolve(ctx, LEVER, lossless=LOSSLESS, blockers=lambda c, s: [],
                   auto=lambda c: ("on", ["x[..., :F] * silu(x[..., F:]) in one kernel, exact (vllm-omni VAE seed: torch.equal)"], {}))


def install(builder, decision) -> None:
    if decision.setting == "on":
        builder.set_block_option(LEVER, "swiglu", True)
    else:
        builder.skip(LEVER, decision.reasons[0])
