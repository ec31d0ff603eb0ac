"""swiglu's runtime (its plan: levers/swiglu.py): the block's feed-forward becomes the plan's (runtime/block_sites.py:
ff.net.0's projection, then `activate`, then ff.net[1:]) with `x[..., :F] * silu(x[..., F:])` in one kernel behind its
check; a refused call, or one autograd needs, runs diffusers' SwiGLU expression and counts a fallback. Setting
`activate` also tells the codes writers wrapped after it that ff.net.0.proj and ff.net.2 are fed by the plan's
feed-forward (diffusers' FeedForward takes bf16 only)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from h3plan.levers import counter
from h3plan.runtime.block_sites import BlockSites
from h3plan.runtime.guards import run_guarded

COUNTER = counter("swiglu")


def wrap(sites: BlockSites, options: Mapping[str, Any], kernels: Mapping[str, Any]) -> BlockSites:
    """`sites.activate`: the SwiGLU of the projection through the `swiglu` kernel."""

    def activate(ff, proj):
        act = ff.net[0]

        def eager():
            a, g = proj.chunk(2, dim=-1)
            return a * act.activation(g)

        fn, check = kernels["swiglu"]
        return run_guarded(COUNTER, lambda: check(proj), lambda: fn(proj), eager, (proj,))

    return replace(sites, activate=activate)
