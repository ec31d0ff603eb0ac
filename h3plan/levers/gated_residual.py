"""Fused gated residual `h + gate[idx] * y` (exact: one BF16 rounding per eager op kept)."""

from __future__ import annotations

from ..sources import cite
from .base import Context, default_install, is_bool, Option, resolve, Spec

SPEC = Spec(
    name="gated_residual",
    settings={"off": True, "on": True},
    summary="h + gate[idx] * y fused (exact)",
    counter="gated_residual",
    options=(Option("block", "gated_residual", is_bool, "bool", False,
                    swap=lambda v: (" gated residual", "eager", "fused") if v else None),),
    kernels=("gated_residual",),
)


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=lambda c, s: [],
                   auto=lambda c: ("on", ["h + gate[idx] * y in one kernel, eager's rounding kept (exact; the pattern "
                                          f"of {cite('vllm-omni-vae-seed')})"], {}))


install = default_install(SPEC)
