"""Actions behind `python -m h3plan action=...` other than plan: verify and bench.

Each action module has `run(cfg, plan) -> int` (the exit status). Imported lazily: the plan path stays
torch-free.
"""

from __future__ import annotations

import importlib

ACTIONS = {"verify": "h3plan.actions.verify", "bench": "h3plan.actions.bench"}


def get_action(name: str):
    """The `run(cfg, plan) -> int` of an action."""
    if name not in ACTIONS:
        raise ValueError(f"unknown action {name!r}; known: plan, {', '.join(ACTIONS)}")
    return importlib.import_module(ACTIONS[name]).run


__all__ = ["ACTIONS", "get_action"]
