"""The plan-driven forward of diffusers' MiniMaxH3TransformerBlock, and its install (`install_forwards`: a named
diffusers hook `h3plan.<lever>` on each block, install/hooks.py, removed by uninstall).

Mathematically diffusers' `MiniMaxH3TransformerBlock.forward` (diffusers 0.42.1), op for op: `plan_block_forward` calls
the block's sites (runtime/block_sites.py: to_q/k/v's input, the attention's gated residual and ff.net.0.proj's input
(together, the fold), the feed-forward, its gated residual) and names no lever. At install, `block_sites` composes them
from diffusers' ops and the runtime module of each block lever whose option the plan changes
(h3plan/runtime/levers/<lever>.py `wrap`), in the one order levers/rules.py `BLOCK_SITES` declares. Where the plan
enables a lever, its op goes through its Triton kernel (h3plan/runtime/kernels) behind the kernel's own `<op>_check`; a
refused call, or one autograd needs, runs the site it wraps (diffusers' expression, or the bf16 producer a codes writer
feeds from) and is counted as a fallback under that lever's counter. The exact-mode kernels keep eager's bf16 rounding
points, so with every lossless lever on this forward is bitwise equal to diffusers'.

The forward stays here, in install/, because what it decides per call reads install's own objects: whether the
attention passes codes on to to_q/k/v (the plan's processor, install/processor.py) and the Ulysses shard
(install/shard.py); every lever's op is in the runtime, chosen at install.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from h3plan.levers import OPTIONS, SPECS, owner, rules
from h3plan.runtime.block_sites import BlockSites
from h3plan.runtime.kernels.table import kernel
from .hooks import attach
from .options import BlockOptions
from .processor import H3PlanAttnProcessor
from .shard import shard_heads


def _attention_refuses(attn, attention_mask) -> str | None:
    """Why to_q/k/v cannot take codes from the block: only the plan's processor passes them on."""
    if attention_mask is not None:
        return "attention mask given: diffusers' processor takes the bf16 input"
    if not isinstance(attn.processor, H3PlanAttnProcessor):
        return f"the attention processor is {type(attn.processor).__name__}, not the plan's"
    if attn.fused_projections:
        return "fused QKV projections (to_qkv is not an FP8 row linear)"
    return None


def plan_block_forward(
    self,
    hidden_states: torch.Tensor,
    temb: torch.Tensor,
    adaln_indices: torch.Tensor,
    rotary_emb: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """A block's forward under its `h3plan.<lever>` hook (install_forwards); its sites in `self._h3plan_sites`, the
    options, kernels and shard in `self._h3plan_block`."""
    shard = self._h3plan_block[2]
    sites = self._h3plan_sites
    if shard is not None:  # Ulysses: this rank's rows of the sequence (see install/shard.py)
        hidden_states, adaln_indices, rotary_emb = shard.enter(self, hidden_states, adaln_indices, rotary_emb)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaln_proj(temb)

    attn, ff = self.attn, self.ff
    residual = hidden_states
    norm_hidden_states = sites.qkv_input(self.norm1, hidden_states, scale_msa, shift_msa, adaln_indices,
                                         (attn.to_q, attn.to_k, attn.to_v),
                                         lambda: _attention_refuses(attn, attention_mask))
    attn_output = attn(norm_hidden_states, rotary_emb, attention_mask)
    hidden_states, norm_hidden_states = sites.fold(self.norm2, residual, gate_msa, adaln_indices, attn_output,
                                                   scale_mlp, shift_mlp, ff)
    residual = hidden_states
    ff_output = sites.feed_forward(ff, norm_hidden_states)
    hidden_states = sites.ff_residual(residual, gate_mlp, adaln_indices, ff_output)
    if shard is not None:
        hidden_states = shard.exit(self, hidden_states)
    return hidden_states


def block_sites(opts, kernels) -> BlockSites:
    """The block forward's sites for these options: diffusers' ops, wrapped by the runtime module of each lever of
    levers/rules.py `BLOCK_SITES` (in that order, innermost first) whose block options the plan changes, each handed its
    own options and the kernels (looked up per call: a kernel patched in `kernels` is the one that runs)."""
    sites = BlockSites()
    changed = opts.non_default()
    for lever in rules.BLOCK_SITES:
        own = {o.key: getattr(opts, o.key) for o in SPECS[lever].options if o.scope == "block"}
        if any(k in changed for k in own):
            sites = importlib.import_module(f"h3plan.runtime.levers.{lever}").wrap(sites, own, kernels)
    return sites.finish()


def block_kernels(opts) -> dict[str, Any]:
    """The kernels of every block option the plan changes (each lever's SPEC.kernels)."""
    ops = [op for key in opts.non_default() for op in SPECS[OPTIONS[key][0]].kernels]
    return {op: kernel(op) for op in ops}


def _hook_lever(opts, shard) -> str:
    """The lever a block's hook is named for: the first (registry order) whose block option the forward carries,
    else the one that owns Ulysses' degree (the forward shards the sequence)."""
    changed = opts.non_default()
    return owner(next(iter(changed))) if changed else owner("ulysses_degree")


def install_forwards(model, builder, state, shard, fed: dict[str, Any] | None = None) -> None:
    """Each transformer block's forward as `plan_block_forward` with the plan's block options, kernels and sites (also
    under Ulysses alone, to shard the sequence; the output heads then shard too, install/shard.py).
    fed: block options the linears' install set back where no linear takes what they write (the levers' input
    steps, Spec.input_step)."""
    recorded = builder.recorded("block")
    recorded.update({k: v for k, v in (fed or {}).items() if k in recorded})
    opts = BlockOptions(**recorded)
    if not opts.enabled and shard is None:
        return
    kernels = block_kernels(opts)
    sites = block_sites(opts, kernels)
    lever = _hook_lever(opts, shard)
    for i, block in enumerate(model.transformer_blocks):
        fqn = f"transformer_blocks.{i}"
        attach(block, fqn, lever, plan_block_forward, state,
               attrs={"_h3plan_block": (opts, kernels, shard), "_h3plan_sites": sites, "_h3plan_index": i})
        state.report.option_swaps(builder, "block", recorded, fqn)
        if shard is not None:
            state.report.swap("ulysses", f"{fqn}.forward", "full sequence", f"1/{shard.degree} sequence shard")
    if shard is not None:
        shard_heads(model, shard, state)
        for fqn in ("norm_out", "proj_out", "audio_proj_out"):
            state.report.swap("ulysses", f"{fqn}.forward", "full sequence",
                              f"1/{shard.degree} sequence shard" + (", outputs gathered" if fqn != "norm_out" else ""))
