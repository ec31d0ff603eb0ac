"""Fused SwiGLU activation after the FeedForward projection (exact)."""

from __future__ import annotations

from ..sources import cite
from .base import Context, default_install, is_bool, Option, resolve, Spec, Terms

SPEC = Spec(
    name="swiglu",
    settings={"off": True, "on": True},
    summary="x[..., :F] * silu(x[..., F:]) in one kernel (exact)",
    counter="swiglu",
    options=(Option("block", "swiglu", is_bool, "bool", False,
                    swap=lambda v: (".ff.net.0 swiglu", "eager", "fused") if v else None),),
    kernels=("swiglu",),
    terms={"on": Terms(swiglu_fused=True)},
)


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=lambda c, s: [],
                   auto=lambda c: ("on", ["x[..., :F] * silu(x[..., F:]) in one kernel, exact "
                                          f"({cite('vllm-omni-vae-seed')}: torch.equal)"], {}))


install = default_install(SPEC)
