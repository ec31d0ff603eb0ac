"""h3plan: declarative execution plans for MiniMax-H3 inference.

    from h3plan import resolve_config, plan_for, install, uninstall
    plan = resolve_config(hardware="sm90", recipe="bf16", parallel="u1")   # torch-free
    report = install(transformer, plan)                                   # swaps kernels in place
    plan = plan_for(pipe, recipe="fp8")      # widths from the components' configs, hardware from the device
    report = install(pipe, recipe="fp8")     # plan_for and install in one call
    report = install(pipe, plan, device="cuda")   # a pipeline loaded on the host (an 80 GB card): moved at install

Importing h3plan loads the lever registry (torch-free) but neither torch nor Hydra; the names below load on first
use. Every mistake a user can make raises an `H3PlanError` (one line, the same text the CLI prints).
"""

from h3plan.errors import (ConfigError, H3PlanError, InstallError, PlanFileError, PlanningError, UsageError,
                           runtime_missing)
from h3plan.facts.decision import Decision
from h3plan.levers import EXPORTS

__version__ = "0.2.0"

__all__ = ["Decision", "Plan", "resolve", "resolve_config", "plan_for", "install", "uninstall", "installed_plan",
           "prepare", "counters",
           "reset_counters", "fallback_reasons", "H3PlanError", "ConfigError", "PlanningError", "PlanFileError",
           "UsageError", "InstallError", "__version__"]

# name -> (module, attribute), loaded on first use; a lever's own function (`prepare`): its install module, by the
# lever's Spec `exports` (h3plan.levers.EXPORTS)
_LAZY = {
    "Plan": ("h3plan.planner", "Plan"),
    "resolve": ("h3plan.planner", "resolve"),
    "resolve_config": ("h3plan.planner", "resolve_config"),
    "plan_for": ("h3plan.from_model", "plan_for"),
    "install": ("h3plan.install", None),  # the package is callable: install(model, plan)
    "uninstall": ("h3plan.install", "uninstall"),
    "installed_plan": ("h3plan.install", "installed_plan"),
    "counters": ("h3plan.runtime.counters", "counters"),
    "reset_counters": ("h3plan.runtime.counters", "reset_counters"),
    "fallback_reasons": ("h3plan.runtime.counters", "fallback_reasons"),
}


def __getattr__(name):
    if name not in __all__:
        raise AttributeError(f"module 'h3plan' has no attribute {name!r}")
    import importlib

    if name in _LAZY:
        module, attr = _LAZY[name]
    else:
        module, attr = f"h3plan.install.{EXPORTS[name]}", name
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:  # installing needs torch and diffusers; planning does not
        refusal = runtime_missing(e, f"h3plan.{name}")
        if refusal is None:
            raise
        return _refuse(name, refusal)
    return mod if attr is None else getattr(mod, attr)


def _refuse(name: str, refusal: H3PlanError):
    """Without torch `h3plan.prepare` (say) is still a name; calling it raises the one-line refusal."""

    def refuse(*args, **kwargs):
        raise refusal

    refuse.__name__ = name
    return refuse
