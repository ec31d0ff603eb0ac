"""fp8_scales' runtime (its plan: levers/fp8_scales.py): how cuDNN's FP8 attention scales q, k and v, as sites of the
attention processor (runtime/attention_sites.py). dynamic (the default sites): the amax of each tensor per call, over
the whole sequence under Ulysses with bf16 on the wire. static: per-layer descales from the plan's table
(h3plan/facts/scale_table.py), descale = amax * margin / 448, the inverse of the kernel's scale; the processor holds
its layer's. off: no FP8 attention, no scales."""

from __future__ import annotations

from dataclasses import replace

import torch

from h3plan.facts.attention import backend_spec
from h3plan.facts.scale_table import load, row_for
from h3plan.runtime.attention.fp8 import scale_from_amax
from h3plan.runtime.attention_sites import AttentionSites


def option_problems(opts) -> list[str]:
    if opts.fp8_scales == "static" and backend_spec(opts.backend).fp8_inputs and not opts.scale_table:
        return ["fp8_scales=static needs a scale_table"]
    return []


def wrap(sites: AttentionSites, opts, kernels: dict) -> AttentionSites:
    """static: `layer_descales` from the table; static or off: no per-call amax."""
    if opts.fp8_scales == "dynamic":
        return sites
    if opts.fp8_scales != "static":
        return replace(sites, sequence_amax=False)
    path, margin = opts.scale_table, opts.scale_margin

    def layer_descales(fqns: list[str]) -> dict[str, torch.Tensor]:
        table = load(path)
        return {fqn: 1.0 / scale_from_amax(torch.tensor(row_for(table, fqn, path), dtype=torch.float32), margin)
                for fqn in fqns}

    return replace(sites, sequence_amax=False, layer_descales=layer_descales)
