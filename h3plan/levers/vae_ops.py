"""VAE decoder ops: fused QK-norm + RoPE, SwiGLU, scaled residual in the dtype the decode runs in (vae_precision),
exact (vllm-omni VAE seed (docs/sources.md#vllm-omni-vae-seed)). Only where the hardware's op set is registered; an
unregistered architecture is reported in the plan as eager, never silently skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from omegaconf import MISSING

from . import rules
from .base import Context, Option, Spec, Terms, resolve, VERIFY_DECODE

# what `fused` may install (the installer keeps the ops whose kernel takes the decode's dtype)
OPS = ("qk_norm_rope", "swiglu", "scaled_residual")


@dataclass
class VaeOpsFacts:
    """hardware.vae_ops, a capability section: whether the exact VAE decoder ops are registered here, and the
    decode speedups measured with them."""

    registered: bool = MISSING
    source: str = MISSING
    h3plan_speedup: Optional[List[float]] = None
    """[min, max] end-to-end decode speedup of h3plan's fused path over diffusers eager on this GPU; null: never
    measured."""
    h3plan_source: Optional[str] = None
    graphs_speedup: Optional[List[float]] = None
    """[min, max] decode speedup over diffusers eager with vae_graphs=on and diffusers' ops; null: never measured."""
    graphs_fused_speedup: Optional[List[float]] = None
    """[min, max] decode speedup over diffusers eager with vae_graphs=on and the fused ops; null: never measured."""
    graphs_source: Optional[str] = None


SPEC = Spec(
    name="vae_ops",
    settings={"eager": True, "fused": True},
    summary="VAE decoder ops: fused QK-norm + RoPE, SwiGLU, scaled residual (exact)",
    model="vae",
    verify=VERIFY_DECODE,
    counter="vae_ops",
    routes=OPS,  # vae_ops.<op>: each fused op of the decoder block counts on its own
    options=(Option("vae", "ops", lambda v: isinstance(v, tuple) and set(v) <= set(OPS),
                    "tuple of " + ", ".join(OPS), ()),),
    kernels=("vae_qk_norm_rope", "vae_swiglu", "vae_scaled_residual"),
    column="vae_ops",
    terms={"fused": Terms(vae_fused=True)},
    hardware={"vae_ops": VaeOpsFacts},
)


def blockers(ctx: Context, s: str) -> list[str]:
    v = ctx.hardware["vae_ops"]
    if s == "fused" and not v["registered"]:
        return [f"{ctx.hw} (compute capability {ctx.hardware['compute_capability']}) has no registered VAE decoder op "
                f"set ({v['source']})"]
    return []


def auto(ctx: Context):
    v, cc = ctx.hardware["vae_ops"], ctx.hardware["compute_capability"]
    if not v["registered"]:
        return "eager", [f"compute capability {cc} has no registered VAE decoder op set: the decoder keeps diffusers' "
                         f"ops (reported, not silently skipped; {v['source']})"], {}
    if rules.vae_graphs(ctx):
        fs, gs, src = v.get("graphs_fused_speedup"), v.get("graphs_speedup"), v.get("graphs_source")
        if fs and gs:
            if min(fs) >= 1.0 and min(fs) >= min(gs):
                return "fused", [f"compute capability {cc} has a registered exact VAE decoder op set ({v['source']}); "
                                 f"with vae_graphs=on the fused decode measured {fs[0]:.2f}-{fs[1]:.2f}x of diffusers "
                                 f"eager, diffusers' ops under graphs {gs[0]:.2f}-{gs[1]:.2f}x ({src})"], {"ops": OPS}
            return "eager", [f"with vae_graphs=on the fused decode measured {fs[0]:.2f}-{fs[1]:.2f}x of diffusers "
                             f"eager and diffusers' ops under graphs {gs[0]:.2f}-{gs[1]:.2f}x ({src}): auto keeps "
                             "diffusers' ops; levers.vae_ops=fused forces the fused ones (bitwise equal)"], {}
    sp = v.get("h3plan_speedup")
    if sp and min(sp) >= 1.0:
        return "fused", [f"compute capability {cc} has a registered exact VAE decoder op set ({v['source']}); h3plan's "
                         f"fused decode measured {sp[0]:.2f}-{sp[1]:.2f}x ({v['h3plan_source']})"], {"ops": OPS}
    why = (f"measured {sp[0]:.2f}-{sp[1]:.2f}x of diffusers eager end to end ({v['h3plan_source']})" if sp else
           "never measured on this GPU, and measured slower than diffusers eager on the H200 "
           "(benchmarks/results/vae-h200.md)")
    return "eager", [f"compute capability {cc} has a registered exact VAE decoder op set ({v['source']}), but h3plan's "
                     f"fused decode was {why}: auto keeps diffusers' ops; levers.vae_ops=fused forces it (bitwise "
                     "equal)"], {}


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, params=lambda c, s: {"ops": OPS} if s == "fused" else {})


def install(builder, decision) -> None:
    if decision.setting == "fused":
        builder.set(SPEC.name, "ops", tuple(decision.param("ops") or OPS))
    else:
        builder.skip(SPEC.name, decision.reasons[0])
