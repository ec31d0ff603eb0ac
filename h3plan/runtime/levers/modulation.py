"""modulation's runtime (its plan: levers/modulation.py): norm + AdaLN modulation in one kernel at the block forward's
bf16 producer `modulate` (runtime/block_sites.py), behind the kernel's check; a refused call, or one autograd needs,
runs the site it wraps (diffusers' expression) and counts a fallback. exact keeps eager's bf16 rounding points;
fp32 single-rounds (lossy). `norm_mode` tells the codes writers wrapped after it (fp8_act_quant, nvfp4_producer_quant)
the mode their fused producers run."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from h3plan.levers import counter
from h3plan.runtime.block_sites import NORM_REASON, BlockSites
from h3plan.runtime.guards import run_guarded

COUNTER = counter("modulation")


def wrap(sites: BlockSites, options: Mapping[str, Any], kernels: Mapping[str, Any]) -> BlockSites:
    """`sites.modulate` through the `modulation` kernel in the option's mode (exact or fp32)."""
    mode = options["modulation"]
    inner = sites.modulate

    def modulate(norm, x, scale, shift, index):
        fn, check = kernels["modulation"]
        eps, w = norm.eps, norm.weight

        def guard():
            if eps is None or w is None:
                return NORM_REASON
            return check(x, w, scale, shift, index, eps, mode=mode)

        return run_guarded(COUNTER, guard, lambda: fn(x, w, scale, shift, index, eps, mode=mode),
                           lambda: inner(norm, x, scale, shift, index), (x, w, scale, shift))

    return replace(sites, modulate=modulate, norm_mode=mode)
