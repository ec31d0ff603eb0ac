"""Per-call routing shared by the patched block forward and the attention processor.

`run_guarded(lever, check, fused, eager, grad_tensors)` calls `check()` (the kernel's `<op>_check`)
unless autograd needs the op (the kernels have no backward: reason "grad enabled"); None -> the fused
function runs and `<lever>.fused` counts; a reason -> diffusers' eager function runs and
`<lever>.fallback` counts with that reason. A check that raises counts as a fallback with the error.
"""

from __future__ import annotations

from typing import Callable

import torch

from . import count_op  # noqa: F401 (registers h3plan::count before any compiled call site runs)
from .counters import fallback as count_fallback, fused as count_fused

GRAD_REASON = "grad enabled"


def needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def signature(*ts) -> tuple:
    """(shape, stride, dtype, device) of each tensor: the key a verdict computed once at trace time is cached by."""
    return tuple((tuple(int(x) for x in t.shape), tuple(int(x) for x in t.stride()), t.dtype, t.device) for t in ts)


def count_route(lever: str, reason: str | None) -> bool:
    """Counts one call's route, the one way every per-call fallback is counted: `<lever>.fused` where `reason` is
    None (returns True), else `<lever>.fallback` with the reason (returns False). run_guarded counts through it; a
    call site whose routing is not one check -> fused | eager (a replay, a cache hit, a decode spread) calls it."""
    if reason is None:
        count_fused(lever)
        return True
    count_fallback(lever, reason)
    return False


def run_guarded(lever: str, check: Callable[[], str | None], fused: Callable, eager: Callable, grad_tensors=()):
    if needs_grad(*grad_tensors):
        reason = GRAD_REASON
    else:
        try:
            reason = check()
        except Exception as exc:  # a guard must never take the forward down
            reason = f"{type(exc).__name__} in check: {exc}"
    return fused() if count_route(lever, reason) else eager()
