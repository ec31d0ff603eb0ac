"""nvfp4_producer_quant's runtime (its plan: levers/nvfp4_producer_quant.py, whose `Spec.input_step` calls `inputs`
here: NVFP4 block linears must exist to feed): the kernels that produce the NVFP4 GEMM inputs
(runtime/kernels/nvfp4_producers.py) hand the NVFP4Linear consumers `NVFP4Codes`: norm1 + AdaLN -> to_q/k/v (one set of
codes), the residual fold (the attention's gated residual, norm2 + AdaLN) -> ff.net.0.proj and the next residual, SwiGLU
-> ff.net.2. Each call is guarded under this lever's counter; a refused one runs the bf16 producer
(runtime/block_sites.py; the fold: the gated residual, then norm2's producer alone) and the NVFP4Linear quantizes that
output itself with the same quantizer: a fallback changes no bits. The producers use the consumers' static input_scale
(a ModelOpt checkpoint's) when they share one, else the dynamic scale (amax / 2688 of the tensor)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping

import torch

from h3plan.levers import counter
from h3plan.runtime.block_sites import NORM_REASON, BlockSites, no_refusal
from h3plan.runtime.guards import run_guarded
from h3plan.runtime.quant.nvfp4 import NOT_NVFP4, NVFP4Codes, NVFP4Linear, block_nvfp4_linears

COUNTER = counter("nvfp4_producer_quant")


def inputs(model, decision, site) -> dict[str, Any]:
    """The install's input step (Spec.input_step): where the plan records the option on and no NVFP4 block linears
    exist to feed, the option set back (the block forward then runs without the producers) and the reason in the
    report's skipped list; a note where a bf16 producer the codes writers extend is diffusers' op here."""
    if not site.option():
        return {}
    if not block_nvfp4_linears(model):
        site.skip(NOT_NVFP4)
        return {site.spec.options[0].key: False}
    unfused = site.options("block").unfused_producers()
    if unfused is not None:
        site.note(f"{site.lever} with {unfused}: where no fused producer runs, the NVFP4 linear quantizes its bf16 "
                  "input itself (same codes, more passes)")
    return {}


def consumers_scale(linears) -> tuple[str | None, torch.Tensor | None]:
    """(reason the linears cannot share one set of producer codes, or None; their shared static input scale)."""
    for lin in linears:
        if not isinstance(lin, NVFP4Linear):
            return f"the consumer is {type(lin).__name__}, not an NVFP4Linear", None
    values = [lin.input_scale_value for lin in linears]  # Python floats: no host read in the forward
    if any(v is None for v in values):
        return ((None, None) if all(v is None for v in values)
                else ("some consumers have a static input_scale, some not", None))
    if len(set(values)) > 1:
        return "to_q/to_k/to_v have different static input scales: each quantizes its own input", None
    return None, linears[0].input_scale.float().reshape(1)


def _codes(out, dtype):
    return NVFP4Codes(*out, dtype)


def _modulated(kernels, mode, bf16, norm, x, scale, shift, index, linears, refuse):
    """NVFP4Codes of norm(x) * (1 + scale[index]) + shift[index] for `linears`; bf16(...) when refused (`refuse()`: a
    reason the caller found)."""
    fn, check = kernels["rmsnorm_modulate_nvfp4"]
    eps, w = norm.eps, norm.weight
    why, g = consumers_scale(linears)
    g = None if g is None else g.to(x.device)

    def guard():
        reason = refuse() or why
        if reason is None and (eps is None or w is None):
            reason = NORM_REASON
        return reason or check(x, w, scale, shift, index, eps, mode=mode, global_scale=g)

    return run_guarded(COUNTER, guard,
                       lambda: _codes(fn(x, w, scale, shift, index, eps, mode=mode, global_scale=g), x.dtype),
                       lambda: bf16(norm, x, scale, shift, index), (x, w, scale, shift))


def _fold(kernels, mode, unfused: Callable) -> Callable:
    """The residual fold: (h + gate[index] * y, NVFP4Codes of norm2 + AdaLN of it for ff.net.0.proj); unfused(...) ->
    the same pair from the gated residual and `_modulated` when refused."""

    def fold(norm, h, gate, index, y, scale, shift, ff):
        fn, check = kernels["gated_residual_modulate_nvfp4"]
        eps, w = norm.eps, norm.weight
        why, g = consumers_scale((ff.net[0].proj,))
        g = None if g is None else g.to(h.device)

        def guard():
            reason = why or (None if torch.is_tensor(y) else f"the attention output is {type(y).__name__}")
            if reason is None and (eps is None or w is None):
                reason = NORM_REASON
            return reason or check(h, gate, y, w, scale, shift, index, eps, mode=mode, global_scale=g)

        def fused():
            h2, *codes = fn(h, gate, y, w, scale, shift, index, eps, mode=mode, global_scale=g)
            return h2, _codes(codes, h.dtype)

        return run_guarded(COUNTER, guard, fused, lambda: unfused(norm, h, gate, index, y, scale, shift, ff),
                           (h, gate, y, w, scale, shift))

    return fold


def _swiglu_codes(kernels, activate: Callable) -> Callable:
    """NVFP4Codes of SwiGLU(proj) straight into ff.net.2 (the dropouts around it must be inactive); refused: the
    bf16 SwiGLU, which ff.net.2 quantizes itself."""

    def ff_out(ff, proj):
        fn, check = kernels["swiglu_nvfp4"]
        out = ff.net[2]
        why, g = consumers_scale([out])
        g = None if g is None else g.to(proj.device)
        dropouts = [m for i, m in enumerate(ff.net) if i not in (0, 2)]

        def guard():
            reason = why
            if reason is None and (len(ff.net) < 3 or not all(isinstance(m, torch.nn.Dropout) for m in dropouts)):
                reason = "FeedForward layout is not [SwiGLU, Dropout, Linear(, Dropout)]"
            if reason is None and any(m.training and m.p > 0 for m in dropouts):
                reason = "dropout active (training mode)"
            return reason or check(proj, global_scale=g)

        h = run_guarded(COUNTER, guard, lambda: _codes(fn(proj, global_scale=g), proj.dtype),
                        lambda: activate(ff, proj), (proj,))
        for module in ff.net[1:]:  # a dropout around codes is inactive (the guard saw to it)
            if not (isinstance(h, NVFP4Codes) and isinstance(module, torch.nn.Dropout)):
                h = module(h)
        return h

    return ff_out


def wrap(sites: BlockSites, options: Mapping[str, Any], kernels: Mapping[str, Any]) -> BlockSites:
    """on: to_q/k/v's input from the fused modulation's NVFP4 producer (where it is fused); with the plan's
    feed-forward too, ff.net.0.proj's input from the residual fold (the attention's gated residual in the same kernel)
    and ff.net.2's from SwiGLU's."""
    if not options["nvfp4_producer_quant"]:
        return sites
    mode, bf16, activate = sites.norm_mode, sites.modulate, sites.activate
    qkv, ffn, fold, ff_out = sites.qkv_input, sites.ffn_input, sites.fold, sites.ff_out
    if mode is not None:
        def qkv(norm, x, scale, shift, index, linears, refuse):
            return _modulated(kernels, mode, bf16, norm, x, scale, shift, index, linears, refuse)

        if activate is not None:
            def ffn(norm, h, scale, shift, index, ff):
                return _modulated(kernels, mode, bf16, norm, h, scale, shift, index, (ff.net[0].proj,), no_refusal)

            fold = _fold(kernels, mode, sites.unfolded(ffn))
    if activate is not None:
        ff_out = _swiglu_codes(kernels, activate)
    return replace(sites, qkv_input=qkv, ffn_input=ffn, fold=fold, ff_out=ff_out)
