"""resolve(config) -> Plan: validate the composed config, derive the shape numbers, let every lever
decide in registry order (each sees the decisions before it), then add the estimates.

Deterministic and pure (no torch, no clock, no environment). A forced lever that cannot apply, or an
`auto` with no allowed setting, raises PlanningError (one line, every reason of the failing lever).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from . import derive, schema
from .errors import PlanningError
from .levers import REGISTRY, Context, LeverError
from .plan import Plan, make_plan

__all__ = ["PlanningError", "resolve", "context"]


def context(sections: Mapping[str, Any], decisions: Mapping[str, Any] | None = None) -> Context:
    shp = derive.shape(sections)
    return Context(
        hardware=sections["hardware"], recipe=sections["recipe"], parallel=sections["parallel"],
        model=sections["model"], vae=sections["vae"], levers=MappingProxyType(dict(sections["levers"])),
        shape=MappingProxyType(shp), decisions=MappingProxyType(dict(decisions or {})),
    )


def _notes(sections: Mapping[str, Any], decisions) -> list[str]:
    hw, r = sections["hardware"], sections["recipe"]
    lossy = [d.lever for d in decisions if not d.lossless]
    notes = []
    if lossy:
        notes.append(f"lossy levers: {', '.join(lossy)}; budget PSNR >= {r['budget']['psnr_db_min']} dB, SSIM >= {r['budget']['ssim_min']} "
                     "(action=verify reports the measured error against diffusers' eager forward)")
    else:
        notes.append("lossless plan: every lever keeps eager's bits given the attention backend")
    unverified = [d.lever for d in decisions if not d.hardware_verified]
    if unverified:
        notes.append(f"* never run on {hw['name']} hardware by h3plan: {', '.join(unverified)}")
    return notes


def resolve(cfg) -> Plan:
    """cfg: the composed Hydra config (DictConfig) or a plain dict with the same sections."""
    sections = schema.validate(cfg)  # ConfigError (an H3PlanError) on values the schema rules out
    ctx = context(sections)
    decisions: dict[str, Any] = {}
    for lever, module in REGISTRY.items():
        try:
            decisions[lever] = module.decide(ctx)
        except LeverError as e:
            raise PlanningError(str(e), e.reasons) from None
        ctx = context(sections, decisions)
        if sections["recipe"]["policy"] == "lossless" and not decisions[lever].lossless:
            raise AssertionError(f"internal: lossy {lever}={decisions[lever].setting} under a lossless policy")
    derived = derive.merge(ctx.shape, derive.estimates(sections, ctx.shape, decisions))
    return make_plan(sections, derived, decisions.values(), notes=_notes(sections, decisions.values()))
