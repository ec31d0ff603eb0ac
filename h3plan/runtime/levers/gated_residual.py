"""gated_residual's runtime (its plan: levers/gated_residual.py): `h + gate[index] * y` in one kernel at both gated
residuals of the block forward (runtime/block_sites.py `attn_residual`, `ff_residual`), eager's rounding kept, behind
the kernel's check; a refused call, or one autograd needs, runs the site it wraps and counts a fallback."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping

from h3plan.levers import counter
from h3plan.runtime.block_sites import BlockSites
from h3plan.runtime.guards import run_guarded

COUNTER = counter("gated_residual")


def _fused(inner: Callable, kernels: Mapping[str, Any]) -> Callable:
    def gate(h, g, index, y):
        fn, check = kernels["gated_residual"]
        return run_guarded(COUNTER, lambda: check(h, g, index, y), lambda: fn(h, g, index, y),
                           lambda: inner(h, g, index, y), (h, g, y))

    return gate


def wrap(sites: BlockSites, options: Mapping[str, Any], kernels: Mapping[str, Any]) -> BlockSites:
    """Both gated residuals through the `gated_residual` kernel."""
    return replace(sites, attn_residual=_fused(sites.attn_residual, kernels),
                   ff_residual=_fused(sites.ff_residual, kernels))
