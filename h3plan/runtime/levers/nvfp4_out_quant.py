"""nvfp4_out_quant's runtime (its plan: levers/nvfp4_out_quant.py, whose `Spec.input_step` calls `inputs` here): every
NVFP4Linear to_out.0 casts the attention output with the one-pass Triton kernel (runtime/kernels/nvfp4.py
`cast_nvfp4`, counted under this lever's counter in runtime/quant/nvfp4.py) instead of the torch reference chain; the
same codes."""

from __future__ import annotations

import functools
from typing import Any

from h3plan.runtime.quant.nvfp4 import NOT_NVFP4, block_nvfp4_linears


def inputs(model, decision, site) -> dict[str, Any]:
    """The install's input step (Spec.input_step): each to_out.0 NVFP4Linear's `input_kernel` on while installed (an
    effect hook `h3plan.<lever>`), one swap line each; where the block linears are not NVFP4, the reason in the
    report's skipped list. Sets no block option back."""
    if not site.option():
        return {}
    outs = [(i, p, m) for i, p, m in block_nvfp4_linears(model) if p == "attn.to_out.0"]
    if not outs:
        site.skip(NOT_NVFP4)
    for i, p, m in outs:
        fqn = f"transformer_blocks.{i}.{p}"
        site.effect(m, functools.partial(setattr, m, "input_kernel", m.input_kernel),
                    apply=functools.partial(setattr, m, "input_kernel", True), fqn=fqn)
        site.swap(fqn, "NVFP4Linear (torch input cast)", "NVFP4Linear (Triton input cast)")
    return {}
