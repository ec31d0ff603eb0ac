"""Benchmark cases for benchmarks/fused_kernels.py: every module here exposes `CASES` (H3 shapes, for the GPU)
and may expose `SMOKE_CASES` (tiny shapes, for `--smoke` on the CPU interpreter). An entry is a `Case` or
a dict with the same keys; see `Case` for what each field means and benchmarks/fused_kernels.py for how they
are timed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Case:
    kernel: str
    """Name in the results table (e.g. "rmsnorm_modulate[exact]")."""
    shape: str
    """The shape that sets the work, as printed (e.g. "1x19000x5376")."""
    dtype: str
    """Storage dtype of the inputs ("bf16", "fp16", ...)."""
    make: Callable[[str], Any]
    """make(device) -> inputs, seeded; called once per case, the result passed to fused/eager."""
    fused: Callable[[Any], Any]
    """fused(inputs) -> output of the kernel under test."""
    eager: Callable[[Any], Any]
    """eager(inputs) -> output of the eager reference (what the model runs without the lever)."""
    bytes: int
    """Fewest bytes the fused kernel must move: each input read once, each output written once."""
    eager_bytes: int
    """Bytes the eager sequence moves, every intermediate written and read back included."""
    exact: Callable[[Any, Any], bool]
    """exact(out_fused, out_eager) -> True when the two agree bit for bit."""
    note: str = ""
    """One line for the table (e.g. "lossy by design")."""
    variants: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    """Alternative launches (label -> fn(inputs)), timed only with --sweep (tuning tables)."""


def as_case(c) -> Case:
    return c if isinstance(c, Case) else Case(**c)


def bits_equal(a, b) -> bool:
    """Same bits, NaNs included (tensors, or tuples/lists of tensors)."""
    import torch

    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(bits_equal(x, y) for x, y in zip(a, b))
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))
