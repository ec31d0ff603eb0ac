"""FA4's 2-CTA kernel for the transformer blocks (not the token refiner); only with attention=fa4.

auto: on where the hardware has it and it does not regress long sequences (SM103, SM107); off on
SM100 (exists, regresses long sequences) and SM90 (1-CTA only). Exact given the backend.
"""

from __future__ import annotations

from h3plan.facts.attention.spec import BackendOption, Untested

from . import rules
from .base import Context, Option, Spec, resolve, VERIFY_REFERENCE

SPEC = Spec(
    name="fa4_2cta",
    settings={"off": True, "on": True},
    summary="FA4's 2-CTA kernel for the transformer blocks (Blackwell; exact given the backend)",
    verify=VERIFY_REFERENCE,
    counter="fa4_2cta",
    backends={"on": ("fa4",)},
    options=(Option("attention", "fa4_2cta", lambda v: v is None or isinstance(v, bool), "bool or None", None,
                    swap=lambda v: ("", "fa4 default CTA mode", "2-CTA allowed per call") if v else None),),
    column="fa4_2cta",
    backend_reads={"fa4": BackendOption(
        "fa4_2cta", kwarg="two_cta", reason="two_cta_reason", describe=lambda v: None if v is None else f"2cta={v}",
        untested=Untested("the per-call 2-CTA switch (hardware.fa4.two_cta)", lambda f: bool(f["fa4"]["two_cta"]),
                          "fa4_2cta", "on", option="fa4_2cta"))},
)


def blockers(ctx: Context, s: str) -> list[str]:
    if s == "off":
        return []
    out = []
    if not ctx.hardware["fa4"]["two_cta"]:
        out.append(f"{ctx.hw} has no FA4 2-CTA kernel ({ctx.hardware['fa4']['source']})")
    ring = rules.ring_excluded(ctx, SPEC.name, s)
    return out + ([ring] if ring else [])


def auto(ctx: Context):
    fa4 = ctx.hardware["fa4"]
    if not rules.fa4(ctx):
        return "off", [f"attention is {rules.attention(ctx)}, not fa4"], params(ctx, "off")
    if not fa4["two_cta"]:
        return "off", [f"{ctx.hw}: FA4 runs 1-CTA only ({fa4['source']})"], params(ctx, "off")
    if fa4["two_cta_regresses_long"]:
        return "off", [f"{ctx.hw}: FA4 2-CTA exists but regresses long sequences ({fa4['source']})"], params(ctx, "off")
    ring = rules.ring_excluded(ctx, SPEC.name, "on")
    if ring:
        return "off", [ring + f"; FA4 runs its default CTA mode (2-CTA would be the faster on {ctx.hw} without the "
                              "ring)"], params(ctx, "off")
    return "on", [f"{ctx.hw}: FA4 2-CTA is the faster BF16 attention at H3 clip lengths ({fa4['source']})",
                  "set per call around the transformer blocks (FA4 reads FA_DISABLE_2CTA once at import); an explicit "
                  "FA_DISABLE_2CTA wins"], params(ctx, "on")


def params(ctx: Context, s: str) -> dict:
    p = {"attention": rules.attention(ctx)}
    if s == "on":
        p["scope"] = "transformer_blocks"
    return p


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, params=params)


def install(builder, decision) -> None:
    if decision.param("attention") == "fa4":
        builder.set(SPEC.name, "fa4_2cta", decision.setting == "on")
    else:
        builder.skip(SPEC.name, decision.reasons[0])
