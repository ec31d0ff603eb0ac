"""Install a resolved Plan into diffusers' MiniMaxH3Transformer3DModel or AutoencoderKLMiniMaxH3 (see installer.py).

Public: install(model, plan or plan-file path, device=None) -> InstallReport (install(model, recipe=...):
h3plan.plan_for the model first; device="cuda": a model loaded on the host moved there at install), uninstall(model),
counters(), reset_counters(), fallback_reasons(), Builder. The heavy modules (diffusers, kernels) load on the first
install.
This package is itself callable, `h3plan.install(model, plan)`, so the name works whether `h3plan.install`
resolves to this subpackage (as Python's import system makes it once imported) or to the function.
"""

from __future__ import annotations

import sys
import types

from h3plan.errors import InstallError, UsageError, runtime_missing
from h3plan.from_model import plan_for
from h3plan.levers import install_module
from h3plan.planner import Plan

from .builder import Builder
from .components import STATE, is_pipeline
from h3plan.runtime.counters import counters, fallback_reasons, format_counters, reset_counters


def install(model, plan=None, *, recipe=None, parallel=None, video=None, hardware=None, overrides=None, device=None,
            **kwargs):
    """install(model, plan): `plan` is a Plan or the path of a plan file (Plan.load reads it); or
    install(model, recipe="bf16", ...) to plan for the model first: h3plan.plan_for(model, recipe, parallel, video,
    hardware=hardware, **(overrides or {})) reads its widths from its config and the hardware from its device
    (`device`'s, when given).

    device: where the model runs, for a model (or pipeline) loaded on the host, as an 80 GB card needs it:
    install(pipe, plan, device="cuda") moves every component the plan runs on the GPU there at install, a tensor
    at a time, and never moves what the plan parks or replaces (the AdaLN linears under adaln_table, the bf16
    block linears that gemm_quant quantises at install, the VAE's float32 tensors that vae_precision casts):
    those are streamed to the device one at a time and stay on the host (placement.py). The device peak is
    the installed footprint plus one staged tensor. uninstall moves everything back to the host, bit for bit.
    None (default): install where the model is, moving nothing (a model on the GPU stays there; one on the
    host stays there, and the report says how to move it).
    kwargs: the installer's (registry=, group=, num_inference_steps=, stand_in=)."""
    import os

    _install = _installer("h3plan.install").install
    from .placement import target

    planning = {"recipe": recipe, "parallel": parallel, "video": video, "hardware": hardware, "overrides": overrides}
    dev = target(device)
    if plan is None:
        read = str(dev) if dev is not None and dev.type == "cuda" else None
        plan = plan_for(model, recipe, parallel, video, hardware=hardware, device=read, **(overrides or {}))
    elif any(v is not None for v in planning.values()):
        given = ", ".join(f"{k}=" for k, v in planning.items() if v is not None)
        raise InstallError(f"install got a plan and {given}: pass the plan, or {given} for h3plan.plan_for to plan "
                           "from the model, not both")
    unknown = sorted(set(kwargs) - set(INSTALL_KWARGS))
    if unknown:
        raise UsageError(f"install got an unexpected keyword {unknown[0]}=; it takes plan, recipe=, parallel=, video=, "
                         f"hardware=, overrides=, device=, {', '.join(k + '=' for k in INSTALL_KWARGS)}")
    if isinstance(plan, (str, os.PathLike)):
        plan = Plan.load(plan)
    if is_pipeline(model):
        from .pipeline import install_pipeline

        return install_pipeline(model, plan, device=dev, **kwargs)
    return _install(model, plan, device=dev, **kwargs)


def of_lever(lever: str) -> types.ModuleType:
    """The module of a registered lever's own install, imported (h3plan.levers.install_module): its runtime module
    (h3plan/runtime/levers/<lever>.py, the step cache's), else an install module of its name (install/<lever>.py: the
    tables, the ring, sparse attention). How an action reaches what such an install holds (its state, its calls) by
    the lever's registry name. KeyError for a lever without one."""
    return install_module(lever)


# the installer's own keywords (installer.install)
INSTALL_KWARGS = ("registry", "group", "num_inference_steps", "stand_in")


def model_argument(obj, who: str) -> None:
    """`who`(None), or `who` of a class or of anything with no attributes to hold a plan: one InstallError line."""
    if obj is None or not hasattr(obj, "__dict__") or isinstance(obj, type):
        _not_a_model(obj, who)


def _not_a_model(obj, who: str):
    got = obj.__name__ if isinstance(obj, type) else type(obj).__name__
    raise InstallError(f"{who} expects a diffusers MiniMaxH3Transformer3DModel, AutoencoderKLMiniMaxH3 or "
                       f"MiniMaxH3ModularPipeline, got {got}")


def _model(obj, who: str):
    """h3plan.install.installer for `who` of a model h3plan installs into (or one that holds a plan); anything else,
    None or an nn.Linear alike, is one InstallError line."""
    model_argument(obj, who)
    installer = _installer(f"h3plan.{who}")
    if STATE not in obj.__dict__ and not is_pipeline(obj) and not installer.installable(obj):
        _not_a_model(obj, who)
    return installer


def uninstall(model) -> bool:
    """Restore `model` (a transformer, a VAE or a pipeline) as it was before install; False when no plan was installed.
    Anything else is an InstallError, as None is. h3plan.counters() keep counting across uninstall and install (every
    call in the process): h3plan.reset_counters() zeroes them."""
    model_argument(model, "uninstall")
    if is_pipeline(model):
        from .pipeline import uninstall_pipeline

        return uninstall_pipeline(model)
    return _model(model, "uninstall").uninstall(model)


def installed_plan(model):
    """The plan installed in `model` (None: none); anything that is not a model h3plan installs into is an
    InstallError, as for uninstall."""
    return _model(model, "installed_plan").installed_plan(model)


def _installer(who: str):
    """h3plan.install.installer, which imports torch and diffusers: without them, one UsageError line naming `who`."""
    try:
        from . import installer
    except ModuleNotFoundError as e:
        refusal = runtime_missing(e, who)
        if refusal is None:
            raise
        raise refusal from None
    return installer


class _CallablePackage(types.ModuleType):
    def __call__(self, model, plan=None, **kwargs):  # install(model, plan, device=..., ...)
        return install(model, plan, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

__all__ = ["Builder", "install", "uninstall", "installed_plan", "counters", "reset_counters",
           "fallback_reasons", "format_counters", "of_lever"]
