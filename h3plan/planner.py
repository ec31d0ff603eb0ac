"""resolve(config) -> Plan: validate the composed config, derive the shape numbers, let every lever
decide in registry order (each sees the decisions before it), then add the estimates.

Deterministic and pure (no torch, no clock, no environment; `model.path` names the one file input: the
checkpoint's config.json files, read for its widths). A forced lever that cannot apply, or an
`auto` with no allowed setting, raises PlanningError (one line, every reason of the failing lever).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from . import checkpoint, derive, schema
from .errors import PlanningError
from .levers import REGISTRY, Context, LeverError
from .plan import Plan, make_plan

__all__ = ["PlanningError", "resolve", "context"]


def context(sections: Mapping[str, Any], decisions: Mapping[str, Any] | None = None,
            request: Mapping[str, Any] | None = None) -> Context:
    shp = derive.shape(sections)
    req = dict(request or {})
    return Context(
        hardware=sections["hardware"], recipe=sections["recipe"], parallel=sections["parallel"],
        model=sections["model"], vae=sections["vae"], levers=MappingProxyType(dict(sections["levers"])),
        shape=MappingProxyType(shp), decisions=MappingProxyType(dict(decisions or {})),
        request=MappingProxyType(req if req.get("source", "").startswith("video") else {}),
        pipeline=MappingProxyType(dict(sections.get("pipeline") or {})),
    )


def _notes(sections: Mapping[str, Any], decisions) -> list[str]:
    hw, r = sections["hardware"], sections["recipe"]
    lossy = [d.lever for d in decisions if not d.lossless]
    notes = []
    if lossy and r["policy"] == "lossless":
        notes.append(f"lossy by the recipe's own choice: {', '.join(lossy)} (each line gives its measured error); every "
                     "other lever keeps eager's bits given the attention backend")
    elif lossy:
        notes.append(f"lossy levers: {', '.join(lossy)}; budget PSNR >= {r['budget']['psnr_db_min']} dB, SSIM >= {r['budget']['ssim_min']} "
                     "(action=verify reports the measured error against diffusers' eager forward)")
    else:
        notes.append("lossless plan: every lever keeps eager's bits given the attention backend")
    unverified = [d.lever for d in decisions if not d.hardware_verified]
    if unverified:
        notes.append(f"* never run on {hw['name']} hardware by h3plan: {', '.join(unverified)}")
    return notes


def _memory(sections, shape, decisions) -> tuple[dict[str, Any], dict[str, str]]:
    """The peak-memory estimate per GPU (h3plan/memory.py) against the hardware's memory; a plan that cannot
    fit raises PlanningError with the numbers and the nearest option that fits."""
    from . import memory

    est = memory.estimate(sections, shape, decisions)
    hw, m = sections["hardware"], sections["memory"]
    gb = hw["device"]["memory_gb"]
    values = {"memory_peak_gib_per_gpu": est["peak_gib"], "memory_peak_phase": est["peak_phase"],
              "memory_breakdown_gib": {k: round(v, 2) for k, v in est["breakdown"].items()}}
    basis = {"memory_peak_gib_per_gpu": est["summary"] + f"; against {gb} GB ({hw['name']} hardware.device.memory_gb) less "
                                        f"memory.reserve_fraction {m['reserve_fraction']:g}",
             "memory_breakdown_gib": "; ".join(f"{k}: {v}" for k, v in est["basis"].items())}
    if getattr(decisions.get("adaln_table"), "setting", None) == "on":  # where the freed memory goes
        off = memory.estimate(sections, shape, {**decisions, "adaln_table": "off"})
        values["memory_peak_gib_tables_off"] = off["peak_gib"]
        basis["memory_peak_gib_tables_off"] = (
            f"the same plan with levers.adaln_table=off ({off['peak_phase']}): the tables free "
            f"{off['peak_gib'] - est['peak_gib']:.1f} GiB of this GPU's peak")
    if gb and m["check"]:
        why = memory.fit(est, gb, m["reserve_fraction"])
        if why:
            raise PlanningError(f"the plan does not fit one {hw['name']} GPU: {why}")
    return values, basis


def _recipe_choice(module, ctx: Context, d) -> bool:
    """A lossy setting a lossless recipe asks for itself (a lever's own `policy`, e.g. recipe.vae=fp16)."""
    policy = getattr(module, "policy", None)
    return policy is not None and not policy(ctx, d.setting)


def resolve(cfg) -> Plan:
    """cfg: the composed Hydra config (DictConfig) or a plain dict with the same sections."""
    # model.path: the checkpoint's config.json files, the one input read from outside the config (torch-free);
    # ConfigError (an H3PlanError) on values the schema rules out
    sections = schema.validate(checkpoint.with_model_path(cfg))
    sequence, sequence_basis = sections.pop("sequence"), sections.pop("sequence_basis")
    ctx = context(sections, request=sequence)
    decisions: dict[str, Any] = {}
    for lever, module in REGISTRY.items():
        try:
            decisions[lever] = module.decide(ctx)
        except LeverError as e:
            raise PlanningError(str(e), e.reasons) from None
        ctx = context(sections, decisions, sequence)
        if sections["recipe"]["policy"] == "lossless" and not decisions[lever].lossless and not _recipe_choice(module, ctx, decisions[lever]):
            raise AssertionError(f"internal: lossy {lever}={decisions[lever].setting} under a lossless policy")
    derived = derive.merge(ctx.shape, derive.estimates(sections, ctx.shape, decisions))
    mem, mem_basis = _memory(sections, ctx.shape, decisions)
    derived.update(mem, sequence=sequence)
    derived["basis"] = {**derived["basis"], **mem_basis, "sequence": "; ".join(f"{k}: {v}" for k, v in sequence_basis.items())}
    return make_plan(sections, derived, decisions.values(), notes=_notes(sections, decisions.values()))
