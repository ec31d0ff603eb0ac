"""Attention backends behind one interface (see base.py): sdpa, fa4, cudnn_bf16, cudnn_fp8.

`get_backend(name, **options)` imports torch and the backend module (installing). What each backend
needs from the hardware is a fact of conf/hardware/*.yaml, read by the planner's levers and, per call,
by the backends themselves (h3plan.planning.hardware).
"""

from __future__ import annotations

import importlib

BACKENDS = {
    "sdpa": ("h3plan.attention.sdpa", "SDPABackend"),
    "fa4": ("h3plan.attention.fa4", "FA4Backend"),
    "cudnn_bf16": ("h3plan.attention.cudnn", "CudnnBF16Backend"),
    "cudnn_fp8": ("h3plan.attention.cudnn", "CudnnFP8Backend"),
}


def backend_class(name: str):
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; known: {sorted(BACKENDS)}")
    mod, cls = BACKENDS[name]
    return getattr(importlib.import_module(mod), cls)


def get_backend(name: str, **options):
    """An instance of the named backend; options: fa4 takes `two_cta` (bool | None)."""
    return backend_class(name)(**options)


__all__ = ["BACKENDS", "backend_class", "get_backend"]
