"""The NVFP4 linears' inputs at install and in the block forward (nvfp4_producer_quant, nvfp4_out_quant).

nvfp4_out_quant=on: every NVFP4Linear to_out.0 casts the attention output with the one-pass Triton kernel
(runtime/kernels/nvfp4.py `cast_nvfp4`, counted `nvfp4_out_quant`) instead of the torch reference chain; the same codes.
nvfp4_producer_quant=on: the patched block forward (install/block.py) takes the NVFP4 GEMM inputs from the kernels
that produce them (runtime/kernels/nvfp4_producers.py): norm1 + AdaLN -> to_q/k/v (one set of codes), the residual fold
(the attention's gated residual, norm2 + AdaLN) -> ff.net.0.proj and the next residual, SwiGLU -> ff.net.2. Each
call is guarded under `nvfp4_producer_quant`; a refused one runs the bf16 producer and the NVFP4Linear quantizes
that output itself with the same quantizer: a fallback changes no bits. The producers use the consumers' static
input_scale (a ModelOpt checkpoint's) when they share one, else the dynamic scale (amax / 2688 of the tensor).
"""

from __future__ import annotations

import functools

import torch

from h3plan.levers import counter, owner
from h3plan.runtime.quant import BLOCK_LINEARS
from h3plan.runtime.quant.nvfp4 import NVFP4Codes, NVFP4Linear
from h3plan.runtime.guards import run_guarded

from .hooks import effect

PRODUCER = counter("nvfp4_producer_quant")
OUT = owner("nvfp4_out_quant")


def _nvfp4_linears(model):
    return [(i, path, block.get_submodule(path)) for i, block in enumerate(model.transformer_blocks)
            for path in BLOCK_LINEARS if isinstance(block.get_submodule(path), NVFP4Linear)]


def install_nvfp4(model, builder, state, swap) -> bool:
    """Apply nvfp4_out_quant to the to_out.0 linears; return whether the block forward runs the NVFP4 producers
    (the plan records nvfp4_producer_quant and NVFP4 block linears exist to feed), else report why not."""
    blk = builder.view("block")
    out, prod = builder.view("linears").nvfp4_out_quant, blk.nvfp4_producer_quant
    if not (out or prod):
        return False
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
        return False
    if prod:
        mod, sw = blk.modulation, blk.swiglu
        if mod == "eager" or not sw:
            state.report.notes.append(f"nvfp4_producer_quant with modulation={mod}, swiglu={sw}: where no fused "
                                      "producer runs, the NVFP4 linear quantizes its bf16 input itself (same codes, "
                                      "more passes)")
    return prod


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


def modulate_nvfp4(kernels, opts, norm, x, scale, shift, index, linears, refuse, bf16):
    """NVFP4Codes of norm(x) * (1 + scale[index]) + shift[index] for `linears`; bf16() when refused."""
    fn, check = kernels["rmsnorm_modulate_nvfp4"]
    eps, w, mode = norm.eps, norm.weight, opts.modulation
    why, g = consumers_scale(linears)
    g = None if g is None else g.to(x.device)

    def guard():
        reason = refuse or why
        if reason is None and (eps is None or w is None):
            reason = "RMSNorm without eps or affine weight"
        return reason or check(x, w, scale, shift, index, eps, mode=mode, global_scale=g)

    return run_guarded(PRODUCER, guard,
                       lambda: _codes(fn(x, w, scale, shift, index, eps, mode=mode, global_scale=g), x.dtype),
                       bf16, (x, w, scale, shift))


def fold_nvfp4(kernels, opts, norm, h, gate, index, y, scale, shift, linears, unfused):
    """The residual fold: (h + gate[index] * y, NVFP4Codes of norm2 + AdaLN of it for `linears`); unfused() -> the
    same pair from the gated residual and `modulate_nvfp4` when refused."""
    fn, check = kernels["gated_residual_modulate_nvfp4"]
    eps, w, mode = norm.eps, norm.weight, opts.modulation
    why, g = consumers_scale(linears)
    g = None if g is None else g.to(h.device)

    def guard():
        reason = why or (None if torch.is_tensor(y) else f"the attention output is {type(y).__name__}")
        if reason is None and (eps is None or w is None):
            reason = "RMSNorm without eps or affine weight"
        return reason or check(h, gate, y, w, scale, shift, index, eps, mode=mode, global_scale=g)

    def fused():
        h2, *codes = fn(h, gate, y, w, scale, shift, index, eps, mode=mode, global_scale=g)
        return h2, _codes(codes, h.dtype)

    return run_guarded(PRODUCER, guard, fused, unfused, (h, gate, y, w, scale, shift))


def swiglu_nvfp4_rows(kernels, ff, proj, bf16):
    """NVFP4Codes of SwiGLU(proj) straight into ff.net.2 (the dropouts around it must be inactive); refused: the
    bf16 SwiGLU, which ff.net.2 quantizes itself."""
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

    h = run_guarded(PRODUCER, guard, lambda: _codes(fn(proj, global_scale=g), proj.dtype), bf16, (proj,))
    for module in ff.net[1:]:
        if not (isinstance(h, NVFP4Codes) and isinstance(module, torch.nn.Dropout)):  # inactive (the guard saw to it)
            h = module(h)
    return h
