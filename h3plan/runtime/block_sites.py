"""The call sites of the plan's transformer block forward (install/block.py `plan_block_forward`), which calls them and
nothing else of a lever's: each site is a function of the block's modules and tensors, diffusers' own op until a lever
that changes it wraps it.

`BlockSites()` is diffusers' `MiniMaxH3TransformerBlock.forward` (diffusers 0.42.1), op for op. At install, each block
lever whose option the plan changes wraps the sites it changes, in the order of h3plan/levers/rules.py `BLOCK_SITES`
(its runtime module h3plan/runtime/levers/<lever>.py: `wrap(sites, options, kernels) -> sites`), and `finish()` derives
the sites no lever wrote from the producers. Two kinds of site:

- the bf16 producers: `modulate` (norm + AdaLN scale/shift, `norm_mode` the fused kernel's mode where a lever fused
  it), `attn_residual` and `ff_residual` (h + gate[index] * y), `activate` (the SwiGLU of ff.net.0's projection; None:
  diffusers' FeedForward runs whole, on bf16 only);
- the consumers' inputs, each derived from the producers where no lever writes it (codes for the linears it feeds):
  (a) `qkv_input`, to_q/k/v's; (c) `ffn_input`, ff.net.0.proj's; (b)+(c) `fold`, the attention's gated residual and
  ff.net.0.proj's input together (one kernel may write both); (d) `ff_out`, the feed-forward's output from the
  projection (SwiGLU, then ff.net[1:]), and `feed_forward`, the whole feed-forward.

Every site is a plain function shared by all blocks (the modules come as arguments), so a hooked block forward compiles
one graph for every block, and every choice between sites is made here at install, not per call.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

Fn = Callable[..., Any]


def modulate(norm, x, scale, shift, index):
    """norm(x) * (1 + scale[index]) + shift[index]; scale/shift are (R, D) row views of the AdaLN output."""
    n = norm(x)
    return n * (1.0 + scale.index_select(0, index)) + shift.index_select(0, index)


def gate(h, g, index, y):
    """h + g[index] * y."""
    return h + g.index_select(0, index) * y


def whole_feed_forward(ff, x):
    """diffusers' FeedForward(activation_fn="swiglu") as it is."""
    return ff(x)


def no_refusal() -> Optional[str]:
    return None


NORM_REASON = "RMSNorm without eps or affine weight"  # a fused norm's refusal: the kernels take eps and the weight


@dataclass(frozen=True)
class BlockSites:
    """The block forward's sites (module docstring). The consumers' inputs are None until a lever writes them or
    `finish()` derives them.

    qkv_input(norm, x, scale, shift, index, linears, refuse): to_q/k/v's input; `refuse()` says why the attention cannot
        take codes (None: it can).
    attn_residual(h, gate, index, y), ff_residual(h, gate, index, y): the gated residuals.
    ffn_input(norm, h, scale, shift, index, ff): ff.net.0.proj's input.
    fold(norm, h, gate, index, y, scale, shift, ff) -> (h', ff.net.0.proj's input): the attention's gated residual, then
        norm2 + AdaLN of it.
    ff_out(ff, proj): the feed-forward's output from ff.net.0's projection (with `activate` only).
    feed_forward(ff, x): the feed-forward's output.
    """

    modulate: Fn = modulate
    norm_mode: Optional[str] = None
    attn_residual: Fn = gate
    ff_residual: Fn = gate
    activate: Optional[Fn] = None
    qkv_input: Optional[Fn] = None
    ffn_input: Optional[Fn] = None
    fold: Optional[Fn] = None
    ff_out: Optional[Fn] = None
    feed_forward: Optional[Fn] = None

    def unfolded(self, ffn_input: Fn) -> Fn:
        """The fold as two sites: this `attn_residual`, then `ffn_input` of its output."""
        residual = self.attn_residual

        def fold(norm, h, g, index, y, scale, shift, ff):
            h = residual(h, g, index, y)
            return h, ffn_input(norm, h, scale, shift, index, ff)

        return fold

    def finish(self) -> BlockSites:
        """Every site set: a consumer's input no lever wrote is the bf16 producer's output."""
        produce = self.modulate

        def bf16_input(norm, x, scale, shift, index, *consumers):
            return produce(norm, x, scale, shift, index)

        ffn_input = self.ffn_input or bf16_input
        ff_out, feed_forward = self.ff_out, self.feed_forward or whole_feed_forward
        if self.activate is not None and self.feed_forward is None:
            ff_out = ff_out or _through(self.activate)
            feed_forward = _projected(ff_out)
        return replace(self, qkv_input=self.qkv_input or bf16_input, ffn_input=ffn_input,
                       fold=self.fold or self.unfolded(ffn_input), ff_out=ff_out, feed_forward=feed_forward)


def _through(activate: Fn) -> Fn:
    """ff.net[1:] (dropout, ff.net.2, dropout) over the SwiGLU's bf16 output."""

    def ff_out(ff, proj):
        h = activate(ff, proj)
        for module in ff.net[1:]:
            h = module(h)
        return h

    return ff_out


def _projected(ff_out: Fn) -> Fn:
    """The plan's feed-forward: ff.net.0's projection, then `ff_out`."""

    def feed_forward(ff, x):
        return ff_out(ff, ff.net[0].proj(x))

    return feed_forward


__all__ = ["BlockSites", "NORM_REASON", "gate", "modulate", "no_refusal", "whole_feed_forward"]
