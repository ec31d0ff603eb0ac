"""The plan-driven forward of diffusers' MiniMaxH3TransformerBlock.

Mathematically diffusers' `MiniMaxH3TransformerBlock.forward` (diffusers 0.42.1), op for op. Where the
plan enables a lever, that op goes through its Triton kernel (h3plan/kernels) behind the kernel's own
`<op>_check`; a refused call, or one autograd needs, runs diffusers' eager expression instead and is
counted as a fallback. The exact-mode kernels keep eager's bf16 rounding points, so with every lossless
lever on this forward is bitwise equal to diffusers'; `modulation="fp32"` single-rounds and is lossy.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

from h3plan.runtime.guards import run_guarded


def load_kernel(op: str) -> tuple[Callable, Callable]:
    """(public fn, check fn) of a kernel op the levers declare (h3plan.levers.KERNELS, "module:fn:check");
    raises ImportError naming the missing piece."""
    from h3plan.levers import KERNELS

    mod_name, fn_name, check_name = KERNELS[op].split(":")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as exc:
        raise ImportError(f"{op}: cannot import {mod_name} ({type(exc).__name__}: {exc})") from exc
    missing = [n for n in (fn_name, check_name) if not hasattr(mod, n)]
    if missing:
        raise ImportError(f"{op}: {mod_name} lacks {missing} (docs/architecture.md kernel contract)")
    return getattr(mod, fn_name), getattr(mod, check_name)


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

    return run_guarded(
        "modulation", guard, lambda: fn(x, w, scale, shift, index, eps, mode=opts.modulation), eager, (x, w, scale, shift)
    )


def gate(kernels, opts, h, g, index, y):
    """h + g[index] * y."""

    def eager():
        return h + g.index_select(0, index) * y

    if not opts.gated_residual:
        return eager()
    fn, check = kernels["gated_residual"]
    return run_guarded("gated_residual", lambda: check(h, g, index, y), lambda: fn(h, g, index, y), eager, (h, g, y))


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
    h = run_guarded("swiglu", lambda: check(proj), lambda: fn(proj), eager, (proj,))
    for module in ff.net[1:]:
        h = module(h)
    return h


def plan_block_forward(
    self,
    hidden_states: torch.Tensor,
    temb: torch.Tensor,
    adaln_indices: torch.Tensor,
    rotary_emb: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Bound to a block as its instance `forward` by the installer; options in `self._h3plan_block`."""
    opts, kernels, shard = self._h3plan_block
    if shard is not None:  # Ulysses: this rank's rows of the sequence (see install/shard.py)
        hidden_states, adaln_indices, rotary_emb = shard.enter(self, hidden_states, adaln_indices, rotary_emb)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaln_proj(temb)

    residual = hidden_states
    norm_hidden_states = modulate(kernels, opts, self.norm1, hidden_states, scale_msa, shift_msa, adaln_indices)
    attn_output = self.attn(norm_hidden_states, rotary_emb, attention_mask)
    hidden_states = gate(kernels, opts, residual, gate_msa, adaln_indices, attn_output)

    residual = hidden_states
    norm_hidden_states = modulate(kernels, opts, self.norm2, hidden_states, scale_mlp, shift_mlp, adaln_indices)
    ff_output = feed_forward(kernels, opts, self.ff, norm_hidden_states)
    hidden_states = gate(kernels, opts, residual, gate_mlp, adaln_indices, ff_output)
    if shard is not None:
        hidden_states = shard.exit(self, hidden_states)
    return hidden_states


def block_kernels(opts) -> dict[str, Any]:
    """The kernels of every block option the plan changes (each lever's SPEC.kernels)."""
    from h3plan.levers import OPTIONS, SPECS

    ops = [op for key in opts.non_default() for op in SPECS[OPTIONS[key][0]].kernels]
    return {op: load_kernel(op) for op in ops}
