"""Attention backends behind one interface (see base.py): sdpa, fa4, cudnn_bf16, cudnn_fp8.

`requirements(name, facts)` is torch-free (planning); `get_backend(name, **options)` imports torch
and the backend module (installing).
"""

from __future__ import annotations

import importlib

from .facts import requirements

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


__all__ = ["BACKENDS", "backend_class", "get_backend", "requirements"]
