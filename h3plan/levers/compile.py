"""diffusers' regional compile (`compile_repeated_blocks(fullgraph=True)`) over the installed plan.

The installed blocks survive torch.compile: the kernels and attention backends are opaque custom ops, the
counters go through `h3plan::count`, nothing recompiles call after call. Inductor then fuses what lies around
h3plan's kernels (AdaLN projections, GEMM epilogues) and rounds it its own way: not eager's bits, so `regional`
is lossy.

Not at Ulysses degree > 1: dynamo cannot trace the exchange's asynchronous all-to-all wait, so a compiled Ulysses
plan is refused, and auto stays off there. Both as measured on H200s: docs/measurements.md.

auto: regional only where the hardware measured the compiled plan of this recipe against the plain plan
(`hardware.measured.compile`, the nearest length within a factor of 2) and every run timed it faster; off otherwise,
with the runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import functools
import math

from omegaconf import MISSING

from .base import Context, default_install, faster_in_every_run, one_of, Option, resolve, Spec, speedup_runs


@dataclass
class CompilePoint:
    """hardware.measured.compile, this lever's evidence (empty: never measured, auto keeps it off): diffusers'
    regional compile over the installed plan against the same plan uncompiled (plain time / compiled time), one
    entry per interleaved run."""

    recipe: str = MISSING
    seq_len: int = MISSING
    speedups: List[float] = MISSING
    source: str = MISSING


SPEC = Spec(
    name="compile",
    settings={"off": True, "regional": False},
    summary="diffusers' regional torch.compile over the installed blocks (not eager's bits: lossy)",
    options=(Option("block", "compile", *one_of("off", "regional"), default="off",
                    swap=lambda v: ((".forward", "eager", "torch.compile (regional, fullgraph)")
                                    if v != "off" else None)),),
    hardware={"measured.compile": List[CompilePoint]},
    model_step=lambda model, decision, site: _model_step(model, decision, site),  # below
)


def _model_step(model, decision, site) -> None:
    """regional: diffusers' compile_repeated_blocks(fullgraph=True) over the installed blocks (their plan forwards,
    installed before the levers' own steps); uninstall drops each block's compiled callable (`h3plan.compile.compiled`:
    the blocks run uncompiled again)."""
    model.compile_repeated_blocks(fullgraph=True)
    blocks = [m for m in model.modules() if type(m).__name__ in (model._repeated_blocks or ())]
    for b in blocks:
        site.effect(b, functools.partial(setattr, b, "_compiled_call_impl", None), part="compiled")
    site.swap("transformer_blocks", "eager forward", f"torch.compile regional, fullgraph ({len(blocks)} blocks)")


NEAR = 2.0  # a measured length stands for lengths within this factor of it; further away compile is unmeasured


def _measured(ctx: Context):
    pts = [p for p in ctx.hardware["measured"].get("compile") or [] if p["recipe"] == ctx.recipe["name"]
           and abs(math.log(p["seq_len"] / ctx.seq_len)) <= math.log(NEAR)]
    return min(pts, key=lambda p: abs(math.log(p["seq_len"] / ctx.seq_len))) if pts else None


ULYSSES_WHY = ("dynamo cannot trace the Ulysses exchange's asynchronous all-to-all wait: a compiled Ulysses plan "
               "failed on two H200s (benchmarks/results/logs/vae2-h200x2.log)")


RING_WHY = "the ring's P2P rotation is not traceable (h3plan/runtime/parallel/ring.py: not under torch.compile)"


def blockers(ctx: Context, s: str) -> list[str]:
    out = []
    if s == "regional" and ctx.degree > 1:
        out.append(f"Ulysses degree {ctx.degree}: {ULYSSES_WHY}")
    if s == "regional" and ctx.ring > 1:
        out.append(f"parallel.ring={ctx.ring}: {RING_WHY}")
    return out


def auto(ctx: Context):
    if ctx.ring > 1:
        return "off", [f"parallel.ring={ctx.ring}: {RING_WHY}"], {}
    if ctx.degree > 1:
        return "off", [f"Ulysses degree {ctx.degree}: {ULYSSES_WHY}; the compiled plan was measured at degree 1 "
                       "only"], {}
    if ctx.lossless_only:
        return "off", [f"recipe {ctx.recipe['name']} is lossless and a compiled block rounds its own way (not eager's "
                       "bits)"], {}
    m = _measured(ctx)
    if m is None:
        return "off", [f"never measured on {ctx.hw} for recipe {ctx.recipe['name']} within {NEAR:g}x of "
                       f"{ctx.seq_len:,} tokens: the plan's own kernels run uncompiled"], {}
    runs = f"{speedup_runs(m['speedups'])} at {m['seq_len']:,} tokens (nearest measured length; {m['source']})"
    if faster_in_every_run(m["speedups"]):
        return "regional", [f"compiled plan faster in every run: {runs}", ctx.budget_text()], {}
    return "off", [f"compiled plan not faster in every run: {runs}"], {}


def decide(ctx: Context):
    return resolve(ctx, SPEC, auto=auto, blockers=blockers)


install = default_install(SPEC)
