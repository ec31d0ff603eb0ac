"""h3plan: declarative execution plans for MiniMax-H3 inference.

    from h3plan import resolve_config, install, uninstall
    plan = resolve_config(hardware="sm90", recipe="bf16", parallel="u1")   # torch-free
    report = install(transformer, plan)                                   # swaps kernels in place

Importing h3plan loads neither torch nor Hydra; the names below load on first use.
"""

from h3plan.plan import Decision, Plan

__all__ = ["Decision", "Plan", "resolve", "resolve_config", "PlanningError", "install", "uninstall", "counters",
           "reset_counters"]

_LAZY = {
    "resolve": ("h3plan.planner", "resolve"),
    "PlanningError": ("h3plan.levers.base", "PlanningError"),
    "install": ("h3plan.install", None),  # the package is callable: install(model, plan)
    "uninstall": ("h3plan.install", "uninstall"),
    "counters": ("h3plan.install", "counters"),
    "reset_counters": ("h3plan.install", "reset_counters"),
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'h3plan' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    mod = importlib.import_module(module)
    return mod if attr is None else getattr(mod, attr)


def resolve_config(**groups):
    """Compose the packaged config with group choices and overrides, then resolve it.

    resolve_config(hardware="sm107", recipe="nvfp4", parallel="u8", **{"parallel.seq_len": 104076})
    """
    from h3plan.cli import compose_config
    from h3plan.planner import resolve

    overrides = [f"{k}={v}" for k, v in groups.items()]
    return resolve(compose_config(overrides))
