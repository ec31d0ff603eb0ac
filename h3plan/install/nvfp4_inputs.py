"""The NVFP4 linears' inputs at install (nvfp4_out_quant, nvfp4_producer_quant).

nvfp4_out_quant=on: every NVFP4Linear to_out.0 casts the attention output with the one-pass Triton kernel
(runtime/kernels/nvfp4.py `cast_nvfp4`, counted `nvfp4_out_quant`) instead of the torch reference chain; the same codes.
nvfp4_producer_quant=on: the block forward's sites take the NVFP4 GEMM inputs from the kernels that produce them
(runtime/levers/nvfp4_producer_quant.py); here, only whether NVFP4 block linears exist to feed (else the block forward
runs without them, and the report says why).
"""

from __future__ import annotations

import functools

from h3plan.levers import owner
from h3plan.runtime.quant import BLOCK_LINEARS
from h3plan.runtime.quant.nvfp4 import NVFP4Linear

from .hooks import effect

PRODUCER = owner("nvfp4_producer_quant")
OUT = owner("nvfp4_out_quant")


def _nvfp4_linears(model):
    return [(i, path, block.get_submodule(path)) for i, block in enumerate(model.transformer_blocks)
            for path in BLOCK_LINEARS if isinstance(block.get_submodule(path), NVFP4Linear)]


def install_nvfp4(model, builder, state, swap) -> dict[str, bool]:
    """Apply nvfp4_out_quant to the to_out.0 linears; return the block options to set back (the block forward's
    install: `{nvfp4_producer_quant: False}` where the plan records it and no NVFP4 block linears exist to feed, with
    the reason in the report's skipped list), else none."""
    blk = builder.view("block")
    out, prod = builder.view("linears").nvfp4_out_quant, blk.nvfp4_producer_quant
    if not (out or prod):
        return {}
    lins = _nvfp4_linears(model)
    why = "the block linears are not NVFP4 (gemm_quant is not nvfp4 here): no NVFP4 GEMM input to write"
    if out:
        outs = [(i, p, m) for i, p, m in lins if p == "attn.to_out.0"]
        if not outs:
            state.report.skipped.append((OUT, why))
        for i, p, m in outs:
            prev = m.input_kernel
            effect(m, OUT, state, functools.partial(setattr, m, "input_kernel", prev),
                   apply=functools.partial(setattr, m, "input_kernel", True), fqn=f"transformer_blocks.{i}.{p}")
            swap(OUT, f"transformer_blocks.{i}.{p}", "NVFP4Linear (torch input cast)",
                 "NVFP4Linear (Triton input cast)")
    if prod and not lins:
        state.report.skipped.append((PRODUCER, why))
        return {"nvfp4_producer_quant": False}
    if prod:
        unfused = blk.unfused_producers()
        if unfused is not None:
            state.report.notes.append(f"{PRODUCER} with {unfused}: where no fused producer runs, the NVFP4 linear "
                                      "quantizes its bf16 input itself (same codes, more passes)")
    return {}
