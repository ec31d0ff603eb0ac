"""Block-sparse attention over the router's kept blocks: FA4's CuTe block-sparse forward, and its torch reference.

    q (B, Rq, H, D), k, v (B, S, H, D), full_block_cnt (B, H, M), full_block_idx (B, H, M, N) -> (B, Rq, H, D)

A row of query block i attends the key rows of the blocks idx[b, h, i, :cnt] only (softmax over those keys,
scale 1/sqrt(D)); the router lists every block for a dense query block, so dense rows run in the same call.

- `fa4_block_sparse`: `flash_attn_func(..., block_sparse_tensors=BlockSparseTensorsTorch(...))` with the kept blocks
  as FA4's "full" blocks (no mask inside a block) and no "mask" blocks (docs/sources.md#fa4-block-sparse). FA4 walks
  a row's list from its last entry and masks the key tail only there: the router lists ascending.
- `block_sparse_ref`: the same block mask in torch, fp32 scores and softmax, over chunks of query blocks (its
  memory stays bounded at real lengths); the CPU tests' oracle and the per-call fallback.
- `sparse_attention`: router + attention as one custom op (`h3plan::sparse_attention`), so a traced block sees
  one opaque call; `video_start` is a device tensor (no host sync).

Numerics: FA4's (fp32 accumulation, bf16 output). Where every key block is listed the rows see what dense FA4 computes
from the same blocks in the same order; the GPU bench checks the bits (benchmarks/sparse_attention_h200.py).
"""

from __future__ import annotations

import inspect
import math

import torch

from h3plan.runtime.kernels.block_router import block_router, block_router_check, block_router_ref, blocks_to_mask

from .base import device_cc, device_facts, dtype_reason, facts_reason
from h3plan.facts.attention.specs.fa4 import SPEC as FA4_SPEC

_REF_ELEMENTS = 1 << 26  # score elements per chunk of the reference (256 MiB in fp32)
_FA4: list = []  # [(flash_attn_func, BlockSparseTensorsTorch) or (None, reason)], resolved once


def _fa4():
    if not _FA4:
        try:
            from flash_attn.cute import flash_attn_func
            from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch

            if "block_sparse_tensors" not in inspect.signature(flash_attn_func).parameters:
                _FA4.append((None, "this flash_attn.cute's flash_attn_func takes no block_sparse_tensors"))
            else:
                _FA4.append((flash_attn_func, BlockSparseTensorsTorch))
        except Exception as exc:  # ImportError, or a CUDA / cutlass error raised at import
            _FA4.append((None, f"flash_attn.cute block sparsity import failed ({type(exc).__name__}: {exc})"))
    return _FA4[0]


def fa4_block_sparse_reason(q, block_q: int, block_k: int) -> str | None:
    """None when FA4's block-sparse forward takes q at these blocks on its device; else why not."""
    if q.device.type != "cuda":
        return f"FA4 block-sparse needs a CUDA device (tensors on {q.device.type})"
    cc = device_cc(q)
    facts, why = device_facts(cc)
    if facts is None:
        return f"FA4 block-sparse: {why}"
    reason = facts_reason(FA4_SPEC, facts) or dtype_reason(FA4_SPEC, q)
    if reason:
        return reason
    blocks = facts["fa4"].get("block_sparse")
    if blocks is None:
        return f"FA4 has no block-sparse forward on {facts['name']} (hardware.fa4.block_sparse is null)"
    if [block_q, block_k] != list(blocks):
        return (f"blocks {block_q}x{block_k} are not FA4's {blocks[0]}x{blocks[1]} on {facts['name']} "
                "(hardware.fa4.block_sparse)")
    if q.shape[-1] != 128:
        return f"the block sizes are FA4's head_dim-128 tile; head_dim is {q.shape[-1]}"
    fn, detail = _fa4()
    return detail if fn is None else None


def fa4_block_sparse(q, k, v, cnt, idx, block_q: int, block_k: int):
    fn, tensors = _fa4()
    if fn is None:
        raise RuntimeError(tensors)
    B, H, M = cnt.shape
    none = torch.zeros_like(cnt)
    bst = tensors(mask_block_cnt=none, mask_block_idx=torch.zeros((B, H, M, 1), dtype=torch.int32, device=cnt.device),
                  full_block_cnt=cnt, full_block_idx=idx, block_size=(block_q, block_k))
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    o, _ = fn(q, k, v, softmax_scale=None, causal=False, block_sparse_tensors=bst)
    return o


def block_sparse_ref(q, k, v, cnt, idx, block_q: int, block_k: int):
    """The block mask applied with torch math: fp32 scores, softmax over the kept keys, output in q's dtype."""
    B, Rq, H, D = q.shape
    S = k.shape[1]
    mask = blocks_to_mask(cnt, idx)  # (B, H, M, N)
    kf, vf = k.float().permute(0, 2, 3, 1), v.float().permute(0, 2, 1, 3)  # (B, H, D, S), (B, H, S, D)
    out = torch.empty_like(q)
    M = mask.shape[2]
    per = max(1, _REF_ELEMENTS // max(1, B * H * block_q * S))
    for i0 in range(0, M, per):
        r0, r1 = i0 * block_q, min(Rq, (i0 + per) * block_q)
        qc = q[:, r0:r1].float().permute(0, 2, 1, 3)  # (B, H, r, D)
        s = torch.matmul(qc, kf) / math.sqrt(D)
        m = mask[:, :, i0:i0 + per].repeat_interleave(block_q, 2)[:, :, :r1 - r0]
        m = m.repeat_interleave(block_k, 3)[..., :S]
        p = torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1)
        out[:, r0:r1] = torch.matmul(p, vf).permute(0, 2, 1, 3).to(q.dtype)
    return out


def _route(q, k, video_start, keep, block_q, block_k, video_only):
    if block_router_check(q, k, video_start, keep, block_q, block_k) is None:
        return block_router(q, k, video_start, keep, block_q=block_q, block_k=block_k, video_only=video_only)
    return block_router_ref(q, k, video_start, keep, block_q=block_q, block_k=block_k, video_only=video_only)


@torch.library.custom_op("h3plan::sparse_attention", mutates_args=())
def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, video_start: torch.Tensor, keep: float,
                     block_q: int, block_k: int, video_only: bool, fa4: bool) -> torch.Tensor:
    """Router + block-sparse attention; fa4: FA4's forward (the caller checked `fa4_block_sparse_reason`), else the
    torch reference of the same mask."""
    cnt, idx = _route(q, k, video_start, keep, block_q, block_k, video_only)
    if fa4:
        return fa4_block_sparse(q, k, v, cnt, idx, block_q, block_k)
    return block_sparse_ref(q, k, v, cnt, idx, block_q, block_k)


@sparse_attention.register_fake
def _(q, k, v, video_start, keep, block_q, block_k, video_only, fa4):
    return q.new_empty(q.shape)


def router_reason(q, k, video_start, keep, block_q, block_k) -> str | None:
    """Why the router's Triton kernels do not take this call (its torch reference routes it then), or None."""
    return block_router_check(q, k, video_start, keep, block_q, block_k)


__all__ = ["block_sparse_ref", "fa4_block_sparse", "fa4_block_sparse_reason", "router_reason", "sparse_attention"]
