"""Actions behind `python -m h3plan action=...` other than plan: verify, bench, calibrate and tune.

Each action module has `run(cfg, plan) -> int` (the exit status). Imported lazily: the plan path stays
torch-free. A missing runtime package (torch, triton, diffusers) is the user's install, not a bug: it
becomes a UsageError naming the package and the install command.
"""

from __future__ import annotations

import importlib
import os
import sys

from h3plan.errors import UsageError

from . import gpu_only

ACTIONS = {"verify": "h3plan.actions.verify", "bench": "h3plan.actions.bench", "calibrate": "h3plan.actions.calibrate",
           "tune": "h3plan.actions.tune"}
RUNTIME_PACKAGES = ("torch", "triton", "diffusers", "numpy", "matplotlib", "tqdm")


def get_action(name: str):
    """The `run(cfg, plan) -> int` of an action."""
    if name not in ACTIONS:
        raise UsageError(f"unknown action {name!r}; known: plan, {', '.join(ACTIONS)}")
    return importlib.import_module(ACTIONS[name]).run


def interpret_triton() -> None:
    """On a machine with no GPU every Triton kernel an action runs goes through Triton's interpreter, which must be
    chosen before triton is first imported: triton.language's own jit helpers (tl.zeros, tl.sum, ...) are made when
    it loads, and a compiled helper called from an interpreted kernel fails. The action's imports (diffusers imports
    torch._dynamo, which imports triton) come after this."""
    if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"


def _missing_package(e: ModuleNotFoundError) -> str | None:
    top = (e.name or "").split(".")[0]
    return top if top in RUNTIME_PACKAGES else None


def run_action(cfg, plan) -> int:
    """Run `cfg.action` on `plan`; a missing runtime package raises UsageError with the install hint. On a machine
    with no GPU a run that needs one is refused from the config, before the action imports torch (gpu_only.py)."""
    action = cfg.action.name
    if action in ACTIONS and gpu_only.no_gpu_here():
        why = gpu_only.refusal(action, cfg, plan)
        if why is not None:
            raise UsageError(why)
        interpret_triton()
    try:
        return int(get_action(action)(cfg, plan) or 0)
    except ModuleNotFoundError as e:
        pkg = _missing_package(e)
        if pkg is None:
            raise
        raise UsageError(f"action={action} needs {pkg!r}, which is not installed: pip install -e '.[runtime]' "
                         "(CPU: add 'torch==2.13.0' to the same command)") from None


__all__ = ["ACTIONS", "get_action", "run_action"]
