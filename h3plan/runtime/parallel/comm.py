"""Collectives for Ulysses over any torch.distributed group (gloo on CPU, NCCL on GPU).

1-byte floats (float8 e4m3/e5m2) travel as uint8 views: gloo has no float8 type and a byte view is
bit-preserving on every backend. `group=None` means the default group when torch.distributed is
initialised, else a single process (degree 1, no communication).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from h3plan.facts.sizes import padded_len, shard_len


def degree_rank(group) -> tuple[int, int]:
    """(group size, rank in the group); (1, 0) for group=None without an initialised process group."""
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def backend_name(group) -> str:
    return str(dist.get_backend(group)).lower()


def wire(t: torch.Tensor) -> torch.Tensor:
    """The tensor as the collectives see it: 1-byte floats viewed as uint8, anything else unchanged."""
    if t.is_floating_point() and t.element_size() == 1:
        return t.view(torch.uint8)
    return t


def device_reason(group, device: torch.device) -> str | None:
    """None when the group's backend can move tensors on `device`, else the one-line reason."""
    be = backend_name(group)
    if device.type == "cuda" and "nccl" not in be:
        return f"tensors are on {device} but the Ulysses group backend is {be!r} (CUDA tensors need NCCL)"
    if device.type != "cuda" and be == "nccl":
        return f"tensors are on {device} but the Ulysses group backend is 'nccl' (CUDA tensors only)"
    return None


def all_to_all(recv: torch.Tensor, send: torch.Tensor, group, *, out_splits=None, in_splits=None, async_op=False):
    """all_to_all_single along dim 0 (element splits on flat tensors); returns the Work when async."""
    return dist.all_to_all_single(
        wire(recv), wire(send), output_split_sizes=out_splits, input_split_sizes=in_splits,
        group=group, async_op=async_op,
    )


def high_priority_group(group):
    """A group over `group`'s ranks, in its order, whose NCCL stream has high priority: its kernels take SMs
    as soon as any frees up instead of queueing behind a running compute kernel (what lets an exchange
    overlap FA4). Other backends have no stream priority: `group` itself. Members call it (local sync)."""
    if backend_name(group) != "nccl":
        return group
    opts = dist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = True
    ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
    kw = dict(ranks=ranks, backend="nccl", pg_options=opts, use_local_synchronization=True)
    if ranks != sorted(ranks):  # keep the group's rank order (group_peer numbers must mean the same ranks)
        kw["sort_ranks"] = False
    return dist.new_group(**kw)


def shard_rows(x: torch.Tensor, group, dim: int = 1) -> torch.Tensor:
    """This rank's rows of the full sequence `x` (same on every rank), zero-padded at the tail.

    Returns a contiguous tensor with S_loc = ceil(S/U) rows along `dim`; no communication.
    """
    U, r = degree_rank(group)
    dim = dim % x.dim()
    S = x.shape[dim]
    S_loc = shard_len(S, U)
    lo, hi = r * S_loc, min(S, (r + 1) * S_loc)
    shape = list(x.shape)
    shape[dim] = S_loc
    out = torch.zeros(shape, dtype=x.dtype, device=x.device)
    if hi > lo:
        wire(out).narrow(dim, 0, hi - lo).copy_(wire(x).narrow(dim, lo, hi - lo))
    return out


def gather_rows(x: torch.Tensor, group, dim: int = 1, *, seq_len: int | None = None) -> torch.Tensor:
    """Inverse of `shard_rows`: all-gather the row shards and trim to `seq_len` rows (None: keep padding)."""
    U, _ = degree_rank(group)
    dim = dim % x.dim()
    if seq_len is not None and padded_len(seq_len, U) != U * x.shape[dim]:
        raise ValueError(f"seq_len={seq_len} does not match {x.shape[dim]} rows per rank at degree {U}")
    if U == 1:
        full = x
    else:
        xs = wire(x).movedim(dim, 0).contiguous()
        parts = [torch.empty_like(xs) for _ in range(U)]
        dist.all_gather(parts, xs, group=group)
        full = torch.cat(parts, 0).movedim(0, dim).view(x.dtype)
    return full if seq_len is None else full.narrow(dim, 0, seq_len).contiguous()


def amax_allreduce_hook(group):
    """Hook for `qk_norm_rope_fp8_lean(amax_hook=...)`: MAX all-reduce of the local amax over the group.

    Takes the fp32 amax tensor (any shape, e.g. (3,) for q, k, v), reduces it in place and returns
    it, so every rank casts with the same per-tensor scale and a receiver's descale matches the
    sender's codes. Padding rows must already be excluded from the local amax (the kernel's
    valid_len); a rank holding only padding contributes its amax of nothing (0).
    """
    U, _ = degree_rank(group)

    def hook(amax: torch.Tensor) -> torch.Tensor:
        if U > 1:
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
        return amax

    return hook


def check_qkv(q, k, v, layout: str, error=ValueError) -> None:
    """q, k, v: 4-dim tensors of one shape, dtype and device; else `error` with one line (layout names the dims)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise error(f"{name} must be a 4-dim {layout} tensor")
    if not q.shape == k.shape == v.shape:
        raise error(f"q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise error(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise error(f"q, k, v devices differ: {q.device}, {k.device}, {v.device}")
