"""The plan-driven forward of diffusers' MiniMaxH3TransformerBlock, and its install (`install_forwards`: a named
diffusers hook `h3plan.<lever>` on each block, install/hooks.py, removed by uninstall).

Mathematically diffusers' `MiniMaxH3TransformerBlock.forward` (diffusers 0.42.1), op for op. Where the
plan enables a lever, that op goes through its Triton kernel (h3plan/runtime/kernels) behind the kernel's own
`<op>_check`; a refused call, or one autograd needs, runs diffusers' eager expression instead and is
counted as a fallback. The exact-mode kernels keep eager's bf16 rounding points, so with every lossless
lever on this forward is bitwise equal to diffusers'; `modulation="fp32"` single-rounds and is lossy.

fp8_act_quant=row (the block linears are FP8RowLinear, install/fp8_rows.py): the kernels that produce the
FP8 GEMM inputs write e4m3 with one scale per row (h3plan/runtime/kernels/fp8_producers.py) and hand the linears
`RowCodes` -- norm1 + AdaLN -> to_q/k/v (one set of codes), norm2 + AdaLN -> ff.net.0.proj, SwiGLU ->
ff.net.2; to_out.0 casts the attention output per row itself. Each producer call is guarded under
`fp8_act_quant`; a refused one runs the bf16 producer above instead and the linear casts that output per row
(quant/fp8_rowwise.quantize_activation_rows): the same codes, so a fallback changes no bits.

nvfp4_producer_quant (install/nvfp4_inputs.py): the same call sites hand NVFP4Linear consumers `NVFP4Codes`, and
the attention's gated residual is folded into norm2's producer (one kernel writes the next residual and the codes).
"""

from __future__ import annotations

from typing import Any

import torch

from h3plan.levers import OPTIONS, SPECS, counter, owner
from h3plan.runtime.quant.fp8_rowwise import FP8RowLinear, RowCodes
from h3plan.runtime.guards import run_guarded
from .hooks import attach
from h3plan.runtime.kernels.table import kernel
from .nvfp4_inputs import fold_nvfp4, modulate_nvfp4, swiglu_nvfp4_rows
from .options import BlockOptions
from .processor import H3PlanAttnProcessor
from .shard import shard_heads

COUNTERS = {k: counter(k) for k in ("modulation", "gated_residual", "swiglu", "fp8_act_quant")}  # by install option


def modulate(kernels, opts, norm, x, scale, shift, index):
    """norm(x) * (1 + scale[index]) + shift[index]; scale/shift are (R, D) row views of the AdaLN output."""

    def eager():
        n = norm(x)
        return n * (1.0 + scale.index_select(0, index)) + shift.index_select(0, index)

    if opts.modulation == "eager":
        return eager()
    fn, check = kernels["modulation"]
    eps, w = norm.eps, norm.weight

    def guard():
        if eps is None or w is None:
            return "RMSNorm without eps or affine weight"
        return check(x, w, scale, shift, index, eps, mode=opts.modulation)

    return run_guarded(COUNTERS["modulation"], guard, lambda: fn(x, w, scale, shift, index, eps, mode=opts.modulation),
                       eager, (x, w, scale, shift))


def _row_consumers_reason(linears) -> str | None:
    """None when every linear takes the same per-row codes (FP8RowLinear, one static scale or none)."""
    for lin in linears:
        if not isinstance(lin, FP8RowLinear):
            return f"the consumer is {type(lin).__name__}, not an FP8RowLinear"
    if len({lin.act_scale for lin in linears}) > 1:
        return "to_q/to_k/to_v have different static scales: each casts its own input"
    return None


def modulate_rows(kernels, opts, norm, x, scale, shift, index, linears, refuse=None):
    """The input of `linears` (to_q/k/v or ff.net.0.proj): with fp8_act_quant=row and a fused modulation,
    rmsnorm_modulate_fp8's per-row codes (RowCodes, the linears' static scale if they have one); else, or
    when refused (`refuse`: a reason the caller found, e.g. an attention mask), `modulate`'s bf16 output."""
    if opts.nvfp4_producer_quant and opts.modulation != "eager":  # NVFP4Codes (install/nvfp4_inputs.py)
        return modulate_nvfp4(kernels, opts, norm, x, scale, shift, index, linears, refuse,
                              lambda: modulate(kernels, opts, norm, x, scale, shift, index))
    if opts.fp8_act_quant != "row" or opts.modulation == "eager":
        return modulate(kernels, opts, norm, x, scale, shift, index)

    fn, check = kernels["rmsnorm_modulate_fp8"]
    eps, w, mode = norm.eps, norm.weight, opts.modulation
    act_scale = getattr(linears[0], "act_scale", None)

    def guard():
        why = refuse or _row_consumers_reason(linears)
        if why is None and (eps is None or w is None):
            why = "RMSNorm without eps or affine weight"
        return why or check(x, w, scale, shift, index, eps, mode=mode, act_scale=act_scale)

    return run_guarded(COUNTERS["fp8_act_quant"], guard,
                       lambda: RowCodes(*fn(x, w, scale, shift, index, eps, mode=mode, act_scale=act_scale), x.dtype),
                       lambda: modulate(kernels, opts, norm, x, scale, shift, index), (x, w, scale, shift))


def _attention_refuses(attn, attention_mask) -> str | None:
    """Why to_q/k/v cannot take codes from the block: only the plan's processor passes them on."""
    if attention_mask is not None:
        return "attention mask given: diffusers' processor takes the bf16 input"
    if not isinstance(attn.processor, H3PlanAttnProcessor):
        return f"the attention processor is {type(attn.processor).__name__}, not the plan's"
    if attn.fused_projections:
        return "fused QKV projections (to_qkv is not an FP8 row linear)"
    return None


def gate(kernels, opts, h, g, index, y):
    """h + g[index] * y."""

    def eager():
        return h + g.index_select(0, index) * y

    if not opts.gated_residual:
        return eager()
    fn, check = kernels["gated_residual"]
    return run_guarded(COUNTERS["gated_residual"], lambda: check(h, g, index, y), lambda: fn(h, g, index, y), eager,
                       (h, g, y))


def feed_forward(kernels, opts, ff, x):
    """diffusers FeedForward(activation_fn="swiglu"): net = [SwiGLU(proj), Dropout, Linear(, Dropout)]."""
    if not opts.swiglu:
        return ff(x)
    act = ff.net[0]
    proj = act.proj(x)

    def eager():
        a, g = proj.chunk(2, dim=-1)
        return a * act.activation(g)

    fn, check = kernels["swiglu"]

    def bf16():
        return run_guarded(COUNTERS["swiglu"], lambda: check(proj), lambda: fn(proj), eager, (proj,))

    if opts.nvfp4_producer_quant:
        return swiglu_nvfp4_rows(kernels, ff, proj, bf16)
    if opts.fp8_act_quant == "row":
        return _swiglu_rows(kernels, ff, proj, bf16)
    h = bf16()
    for module in ff.net[1:]:
        h = module(h)
    return h


def _swiglu_rows(kernels, ff, proj, bf16):
    """fp8_act_quant=row: swiglu_fp8's per-row codes straight into ff.net.2 (the dropouts around it must be
    inactive: they cannot take codes); refused: the bf16 SwiGLU, which ff.net.2 casts per row itself."""
    fn, check = kernels["swiglu_fp8"]
    out = ff.net[2]
    act_scale = getattr(out, "act_scale", None)
    dropouts = [m for i, m in enumerate(ff.net) if i not in (0, 2)]

    def guard():
        why = _row_consumers_reason([out])
        if why is None and (len(ff.net) < 3 or not all(isinstance(m, torch.nn.Dropout) for m in dropouts)):
            why = "FeedForward layout is not [SwiGLU, Dropout, Linear(, Dropout)]"
        if why is None and any(m.training and m.p > 0 for m in dropouts):
            why = "dropout active (training mode)"
        return why or check(proj, act_scale=act_scale)

    h = run_guarded(COUNTERS["fp8_act_quant"], guard, lambda: RowCodes(*fn(proj, act_scale=act_scale), proj.dtype),
                    bf16, (proj,))
    for module in ff.net[1:]:
        if not (isinstance(h, RowCodes) and isinstance(module, torch.nn.Dropout)):  # inactive (the guard saw to it)
            h = module(h)
    return h


def _ffn_input(kernels, opts, ff, h, norm, scale, shift, index):
    if opts.swiglu:  # else diffusers' FeedForward runs, on bf16 only
        return modulate_rows(kernels, opts, norm, h, scale, shift, index, (ff.net[0].proj,))
    return modulate(kernels, opts, norm, h, scale, shift, index)


def plan_block_forward(
    self,
    hidden_states: torch.Tensor,
    temb: torch.Tensor,
    adaln_indices: torch.Tensor,
    rotary_emb: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """A block's forward under its `h3plan.<lever>` hook (install_forwards); options in `self._h3plan_block`."""
    opts, kernels, shard = self._h3plan_block
    if shard is not None:  # Ulysses: this rank's rows of the sequence (see install/shard.py)
        hidden_states, adaln_indices, rotary_emb = shard.enter(self, hidden_states, adaln_indices, rotary_emb)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaln_proj(temb)

    attn, ff = self.attn, self.ff
    residual = hidden_states
    codes_in = opts.fp8_act_quant == "row" or opts.nvfp4_producer_quant
    refuse = _attention_refuses(attn, attention_mask) if codes_in else None
    norm_hidden_states = modulate_rows(kernels, opts, self.norm1, hidden_states, scale_msa, shift_msa, adaln_indices,
                                       (attn.to_q, attn.to_k, attn.to_v), refuse)
    attn_output = attn(norm_hidden_states, rotary_emb, attention_mask)
    ffn_in = (self.norm2, scale_mlp, shift_mlp, adaln_indices)
    if opts.nvfp4_producer_quant and opts.swiglu and opts.modulation != "eager":
        # the residual fold: the gated residual, norm2 + AdaLN and the NVFP4 cast in one kernel
        def unfused():
            h = gate(kernels, opts, residual, gate_msa, adaln_indices, attn_output)
            return h, _ffn_input(kernels, opts, ff, h, *ffn_in)

        hidden_states, norm_hidden_states = fold_nvfp4(kernels, opts, self.norm2, residual, gate_msa, adaln_indices,
                                                       attn_output, scale_mlp, shift_mlp, (ff.net[0].proj,), unfused)
    else:
        hidden_states = gate(kernels, opts, residual, gate_msa, adaln_indices, attn_output)
        norm_hidden_states = _ffn_input(kernels, opts, ff, hidden_states, *ffn_in)
    residual = hidden_states
    ff_output = feed_forward(kernels, opts, self.ff, norm_hidden_states)
    hidden_states = gate(kernels, opts, residual, gate_mlp, adaln_indices, ff_output)
    if shard is not None:
        hidden_states = shard.exit(self, hidden_states)
    return hidden_states


def block_kernels(opts) -> dict[str, Any]:
    """The kernels of every block option the plan changes (each lever's SPEC.kernels)."""
    ops = [op for key in opts.non_default() for op in SPECS[OPTIONS[key][0]].kernels]
    return {op: kernel(op) for op in ops}


def _hook_lever(opts, shard) -> str:
    """The lever a block's hook is named for: the first (registry order) whose block option the forward carries,
    else the one that owns Ulysses' degree (the forward shards the sequence)."""
    changed = opts.non_default()
    return owner(next(iter(changed))) if changed else owner("ulysses_degree")


def install_forwards(model, builder, state, shard, act_quant="tensor", nvfp4=False) -> None:
    """Each transformer block's forward as `plan_block_forward` with the plan's block options and kernels (also
    under Ulysses alone, to shard the sequence; the output heads then shard too, install/shard.py).
    act_quant / nvfp4: what the block linears take (install/fp8_rows.py, install/nvfp4_inputs.py)."""
    recorded = builder.recorded("block")
    if "fp8_act_quant" in recorded:  # row needs FP8 linears to feed (install/fp8_rows.py)
        recorded["fp8_act_quant"] = act_quant
    if "nvfp4_producer_quant" in recorded:  # needs NVFP4 linears to feed (install/nvfp4_inputs.py)
        recorded["nvfp4_producer_quant"] = nvfp4
    opts = BlockOptions(**recorded)
    if not opts.enabled and shard is None:
        return
    kernels = block_kernels(opts)
    lever = _hook_lever(opts, shard)
    for i, block in enumerate(model.transformer_blocks):
        fqn = f"transformer_blocks.{i}"
        attach(block, fqn, lever, plan_block_forward, state,
               attrs={"_h3plan_block": (opts, kernels, shard), "_h3plan_index": i})
        state.report.option_swaps(builder, "block", recorded, fqn)
        if shard is not None:
            state.report.swap("ulysses", f"{fqn}.forward", "full sequence", f"1/{shard.degree} sequence shard")
    if shard is not None:
        shard_heads(model, shard, state)
        for fqn in ("norm_out", "proj_out", "audio_proj_out"):
            state.report.swap("ulysses", f"{fqn}.forward", "full sequence",
                              f"1/{shard.degree} sequence shard" + (", outputs gathered" if fqn != "norm_out" else ""))
