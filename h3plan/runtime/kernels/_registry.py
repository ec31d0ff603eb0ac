"""Registration of h3plan kernels as torch custom ops, so torch.compile and FX tracing see one opaque op.

    @custom_op("gated_residual", fake=lambda h, gate, index, y: torch.empty_like(h))
    def _gated_residual_op(h: Tensor, gate: Tensor, index: Tensor, y: Tensor) -> Tensor: ...

registers `torch.ops.h3plan.gated_residual` (schema inferred from the annotations) with its fake
(meta) implementation, and returns the op object (callable like the function). The op body runs
eagerly; under tracing only the fake runs, so the fake must give the output's shape, dtype and
device without touching data.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

NAMESPACE = "h3plan"


def custom_op(name: str, fake: Callable, mutates_args: Sequence[str] = ()):
    """Decorator: define `h3plan::<name>` from the decorated function and register `fake` for it."""

    def wrap(fn):
        op = torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=tuple(mutates_args))(fn)
        op.register_fake(fake)
        return op

    return wrap
