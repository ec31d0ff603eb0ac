"""fp8_act_quant=row at install: the FP8 block linears take per-row e4m3 inputs.

Every FP8Linear among the six block linears (quantised by gemm_quant's install or loaded pre-quantised)
becomes an FP8RowLinear sharing its weight buffers (h3plan/runtime/quant/fp8_rowwise.py): it takes a producer's
`RowCodes` as they are, and quantises a bf16 input one scale per row itself (cast_rows_fp8, or its reference),
the same codes the producer writes, so a producer that falls back changes no bits. With a static input
table (gemm_quant's `input_scales: static`) each linear keeps its calibrated scale, 448 / (amax * margin) in
fp32 exactly as FP8Linear computes it, and the producers write with it (their static mode): the same codes
as tensor's static cast. The block forward's sites (runtime/levers/fp8_act_quant.py) then call the producers.
"""

from __future__ import annotations

import functools

from h3plan.levers import owner
from h3plan.runtime.kernels.fp8 import scale_from_amax
from h3plan.runtime.quant import BLOCK_LINEARS
from h3plan.runtime.quant.fp8 import FP8Linear
from h3plan.runtime.quant.fp8_rowwise import FP8RowLinear

from .hooks import effect

LEVER = owner("fp8_act_quant")


def row_linears(model, state, swap) -> int:
    """Swap every FP8Linear block linear for an FP8RowLinear (a hook on its parent; removing it restores the
    FP8Linear); returns how many were swapped.
    `swap(lever, fqn, old, new)` logs one swap."""
    n = 0
    for i, block in enumerate(model.transformer_blocks):
        for path in BLOCK_LINEARS:
            parent_path, _, name = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            old = getattr(parent, name)
            if type(old) is not FP8Linear:
                continue
            static = old.input_amax
            act_scale = None if static is None else float(scale_from_amax(static.detach().cpu()))
            new = FP8RowLinear.from_fp8(old, act_scale)
            new.input_amax = static
            effect(parent, LEVER, state, functools.partial(setattr, parent, name, old),
                   apply=functools.partial(setattr, parent, name, new), part=name)
            swap(LEVER, f"transformer_blocks.{i}.{path}", "FP8Linear",
                 "FP8RowLinear (per-row input codes)" if act_scale is None
                 else f"FP8RowLinear (static scale {act_scale:g})")
            n += 1
    return n


def install_rows(model, builder, state, swap) -> dict[str, str]:
    """Swap the FP8 block linears where the plan records fp8_act_quant=row; returns the block options to set back (the
    block forward's install: `{fp8_act_quant: "tensor"}` where no FP8 block linears exist to feed, with the reason in
    the report's skipped list), else none."""
    blk = builder.view("block")
    if blk.fp8_act_quant != "row":
        return {}
    if not row_linears(model, state, swap):
        state.report.skipped.append((LEVER, "row: the block linears are not FP8 (gemm_quant is not fp8 here): "
                                            "no FP8 GEMM input to write per row"))
        return {"fp8_act_quant": "tensor"}
    unfused = blk.unfused_producers()
    if unfused is not None:
        state.report.notes.append(f"{LEVER}=row with {unfused}: where no fused producer runs, the FP8 linear casts "
                                  "its bf16 input per row itself (same codes, one more pass)")
    return {}
