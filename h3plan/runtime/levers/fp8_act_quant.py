"""fp8_act_quant's runtime (its plan: levers/fp8_act_quant.py, whose `Spec.input_step` calls `inputs` here to swap the
FP8 block linears for FP8RowLinear): with row, the kernels that produce the FP8 GEMM inputs write e4m3 with one scale
per row (runtime/kernels/fp8_producers.py) and hand the linears `RowCodes`: norm1 + AdaLN -> to_q/k/v (one set of
codes), norm2 + AdaLN -> ff.net.0.proj (both where the modulation is fused: its mode), SwiGLU -> ff.net.2 (where the
feed-forward is the plan's); to_out.0 casts the attention output per row itself. Each producer call is guarded under
this lever's counter; a refused one runs the bf16 producer (runtime/block_sites.py) instead and the linear casts that
output per row (quant/fp8_rowwise.quantize_activation_rows): the same codes, so a fallback changes no bits.

The swap: every FP8Linear among the six block linears (quantised by gemm_quant's install or loaded pre-quantised)
becomes an FP8RowLinear sharing its weight buffers (runtime/quant/fp8_rowwise.py): it takes a producer's `RowCodes` as
they are, and quantises a bf16 input one scale per row itself (cast_rows_fp8, or its reference), the same codes the
producer writes, so a producer that falls back changes no bits. With a static input table (gemm_quant's `input_scales:
static`) each linear keeps its calibrated scale, 448 / (amax * margin) in fp32 exactly as FP8Linear computes it, and the
producers write with it (their static mode): the same codes as tensor's static cast."""

from __future__ import annotations

import functools

from dataclasses import replace
from typing import Any, Callable, Mapping

import torch

from h3plan.levers import counter
from h3plan.runtime.block_sites import NORM_REASON, BlockSites, no_refusal
from h3plan.runtime.guards import run_guarded
from h3plan.runtime.kernels.fp8 import scale_from_amax
from h3plan.facts.blocks import BLOCK_LINEARS
from h3plan.runtime.quant.fp8 import FP8Linear
from h3plan.runtime.quant.fp8_rowwise import FP8RowLinear, RowCodes

COUNTER = counter("fp8_act_quant")
ROW = "row"  # the setting whose linears take per-row codes


def inputs(model, decision, site) -> dict[str, Any]:
    """The install's input step (Spec.input_step): with row, every FP8Linear block linear swapped for an FP8RowLinear
    (an effect hook on its parent; removing it restores the FP8Linear); where none exists to feed, the option set
    back to tensor and the reason in the report's skipped list; a note where a bf16 producer the codes writers extend
    is diffusers' op here."""
    if site.option() != ROW:
        return {}
    if not _row_linears(model, site):
        site.skip("row: the block linears are not FP8 (gemm_quant is not fp8 here): no FP8 GEMM input to write per row")
        return {site.spec.options[0].key: "tensor"}
    unfused = site.options("block").unfused_producers()
    if unfused is not None:
        site.note(f"{site.lever}=row with {unfused}: where no fused producer runs, the FP8 linear casts its bf16 input "
                  "per row itself (same codes, one more pass)")
    return {}


def _row_linears(model, site) -> int:
    """Swap every FP8Linear block linear for an FP8RowLinear; returns how many were swapped."""
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
            site.effect(parent, functools.partial(setattr, parent, name, old),
                        apply=functools.partial(setattr, parent, name, new), part=name)
            site.swap(f"transformer_blocks.{i}.{path}", "FP8Linear",
                      "FP8RowLinear (per-row input codes)" if act_scale is None
                      else f"FP8RowLinear (static scale {act_scale:g})")
            n += 1
    return n


def row_consumers_reason(linears) -> str | None:
    """None when every linear takes the same per-row codes (FP8RowLinear, one static scale or none)."""
    for lin in linears:
        if not isinstance(lin, FP8RowLinear):
            return f"the consumer is {type(lin).__name__}, not an FP8RowLinear"
    if len({lin.act_scale for lin in linears}) > 1:
        return "to_q/to_k/to_v have different static scales: each casts its own input"
    return None


def _rows(kernels, mode, bf16, norm, x, scale, shift, index, linears, refuse):
    """rmsnorm_modulate_fp8's per-row codes of norm(x) * (1 + scale[index]) + shift[index] for `linears` (their
    static scale if they have one); bf16(...) when refused (`refuse()`: a reason the caller found)."""
    fn, check = kernels["rmsnorm_modulate_fp8"]
    eps, w = norm.eps, norm.weight
    act_scale = getattr(linears[0], "act_scale", None)

    def guard():
        why = refuse() or row_consumers_reason(linears)
        if why is None and (eps is None or w is None):
            why = NORM_REASON
        return why or check(x, w, scale, shift, index, eps, mode=mode, act_scale=act_scale)

    return run_guarded(COUNTER, guard,
                       lambda: RowCodes(*fn(x, w, scale, shift, index, eps, mode=mode, act_scale=act_scale), x.dtype),
                       lambda: bf16(norm, x, scale, shift, index), (x, w, scale, shift))


def _swiglu_rows(kernels, activate: Callable) -> Callable:
    """swiglu_fp8's per-row codes straight into ff.net.2 (the dropouts around it must be inactive: they cannot take
    codes); refused: the bf16 SwiGLU, which ff.net.2 casts per row itself."""

    def ff_out(ff, proj):
        fn, check = kernels["swiglu_fp8"]
        out = ff.net[2]
        act_scale = getattr(out, "act_scale", None)
        dropouts = [m for i, m in enumerate(ff.net) if i not in (0, 2)]

        def guard():
            why = row_consumers_reason([out])
            if why is None and (len(ff.net) < 3 or not all(isinstance(m, torch.nn.Dropout) for m in dropouts)):
                why = "FeedForward layout is not [SwiGLU, Dropout, Linear(, Dropout)]"
            if why is None and any(m.training and m.p > 0 for m in dropouts):
                why = "dropout active (training mode)"
            return why or check(proj, act_scale=act_scale)

        h = run_guarded(COUNTER, guard, lambda: RowCodes(*fn(proj, act_scale=act_scale), proj.dtype),
                        lambda: activate(ff, proj), (proj,))
        for module in ff.net[1:]:  # a dropout around codes is inactive (the guard saw to it)
            if not (isinstance(h, RowCodes) and isinstance(module, torch.nn.Dropout)):
                h = module(h)
        return h

    return ff_out


def wrap(sites: BlockSites, options: Mapping[str, Any], kernels: Mapping[str, Any]) -> BlockSites:
    """row: the inputs of to_q/k/v and ff.net.0.proj from the fused modulation's FP8 producer (where it is fused), the
    input of ff.net.2 from SwiGLU's (where the feed-forward is the plan's)."""
    if options["fp8_act_quant"] != "row":
        return sites
    mode, bf16, activate = sites.norm_mode, sites.modulate, sites.activate
    qkv, ffn, ff_out = sites.qkv_input, sites.ffn_input, sites.ff_out
    if mode is not None:
        def qkv(norm, x, scale, shift, index, linears, refuse):
            return _rows(kernels, mode, bf16, norm, x, scale, shift, index, linears, refuse)

        if activate is not None:
            def ffn(norm, h, scale, shift, index, ff):
                return _rows(kernels, mode, bf16, norm, h, scale, shift, index, (ff.net[0].proj,), no_refusal)

    if activate is not None:
        ff_out = _swiglu_rows(kernels, activate)
    return replace(sites, qkv_input=qkv, ffn_input=ffn, ff_out=ff_out)
