"""ulysses_exchange's runtime (its plan: levers/ulysses_exchange.py): the projection exchange as a site of the attention
processor (runtime/attention_sites.py `projection_exchange`), and the split output exchange as its options of the
Ulysses exchange (`exchange_options`: runtime/parallel/ulysses.py `split_output`, `post_group`).

projection, projection_split: the processor's q/k/v projections run one destination's heads at a time (weight rows
sliced), each normed + roped by qk_norm_rope's per-destination site (`project`) and sent while the next destination's
project (`UlyssesAttention.exchange_projected`). A call the guard refuses (`reason`: the same answer on every rank, it
reads only shapes, types and dtypes) runs the packed exchange, counted with the reason under this lever's counter.
projection_split: the output exchange per destination too, on a high-priority group (runtime/parallel/comm.py)."""

from __future__ import annotations

from dataclasses import replace

import torch

from h3plan.levers import counter
from h3plan.runtime.attention_sites import AttentionSites
from h3plan.runtime.guards import GRAD_REASON, count_route, needs_grad
from h3plan.runtime.parallel.comm import high_priority_group

COUNTER = counter("ulysses_exchange")


def reason(proc, attn, x, rotary_emb) -> str | None:
    """Why the projection exchange cannot run this call, or None."""
    if needs_grad(x, attn.to_q.weight, attn.to_k.weight, attn.to_v.weight, attn.norm_q.weight, attn.norm_k.weight):
        return GRAD_REASON
    if attn.fused_projections:
        return "fused q/k/v projections (to_qkv): no per-destination weight rows"
    lins = (attn.to_q, attn.to_k, attn.to_v)
    if any(type(m) is not torch.nn.Linear for m in lins):
        return "to_q/to_k/to_v are not plain nn.Linear (a quantised linear is not sliced per destination)"
    if any(m.weight.dtype != x.dtype for m in lins):
        return f"linear weights are not in the activations' dtype {x.dtype}"
    if x.dim() != 3 or x.shape[0] != 1:
        return f"hidden states {tuple(x.shape)}: the projection exchange takes batch 1"
    if (rotary_emb is None or attn.norm_q.eps != attn.norm_k.eps or attn.norm_q.weight is None
            or attn.norm_k.weight is None):
        return "no rotary embedding, or norm_q/norm_k differ in eps or lack a weight"
    U, H = proc.ulysses.degree, attn.heads
    if H % U or attn.to_q.out_features % H:
        return f"{H} heads do not split over degree {U}"
    h, D = H // U, attn.to_q.out_features // H
    if attn.to_k.out_features != H * D or attn.to_v.out_features != H * D:
        return "k/v projections differ in width from q (grouped heads)"
    chunk = x.new_empty((1, x.shape[1], h * D))
    return proc.sites.project_check(chunk, chunk, attn.norm_q.weight, attn.norm_k.weight, *rotary_emb,
                                    attn.norm_q.eps)


def gather(proc, attn, x, rotary_emb):
    """This rank's heads over every row, seq-major (q, k, v), through the processor's UlyssesAttention
    (`proc.ulysses`); None where `reason` refuses (counted: the caller runs the packed exchange)."""
    why = reason(proc, attn, x, rotary_emb)
    if why is not None:
        count_route(COUNTER, why)
        return None
    ua, S = proc.ulysses, proc.shard.seq_len
    U, H = ua.degree, attn.heads
    D = attn.to_q.out_features // H
    h = H // U
    fn = proc.sites.project
    wq, wk, eps = attn.norm_q.weight, attn.norm_k.weight, attn.norm_q.eps

    def rows(m, d):
        sl = slice(d * h * D, (d + 1) * h * D)
        return torch.nn.functional.linear(x, m.weight[sl], None if m.bias is None else m.bias[sl])

    def produce(d):
        qd, kd, vd = rows(attn.to_q, d), rows(attn.to_k, d), rows(attn.to_v, d)
        qn, kn = fn(qd, kd, wq, wk, *rotary_emb, eps)
        return qn, kn, vd.view(1, x.shape[1], h, D)

    gathered = ua.exchange_projected(produce, seq_len=S, shape=(1, x.shape[1], H, D), dtype=x.dtype, device=x.device)
    count_route(COUNTER, None)
    proc.sites.projected()
    return gathered


def _split(exchange_options):
    """The output exchange per destination, on a high-priority group over the exchange's (made by its members)."""

    def split(group) -> dict:
        return {**exchange_options(group), "split_output": True, "post_group": high_priority_group(group)}

    return split


def wrap(sites: AttentionSites, opts, kernels: dict) -> AttentionSites:
    """projection or projection_split at degree > 1: the projection exchange; projection_split: the split output
    exchange too. packed, or degree 1: the sites as they are."""
    if opts.ulysses_degree == 1 or opts.ulysses_exchange == "packed":
        return sites
    split = opts.ulysses_exchange == "projection_split"
    return replace(sites, projection_exchange=gather,
                   exchange_options=_split(sites.exchange_options) if split else sites.exchange_options)
