"""Merge of received Ulysses head chunks into the attention output, tail zeroed, in one kernel.

Scope: after the output all-to-all, `recv` (U, B, S_loc, Hl, D) holds from each source rank u the heads
u*Hl .. (u+1)*Hl - 1 of this rank's S_loc rows (any strides with the last dim contiguous). The result is
(B, S_loc, U*Hl*D) with out[b, s, (u*Hl + h)*D + d] = recv[u, b, s, h, d] for s < valid_rows and 0 for
the padded tail s >= valid_rows (whose rows are never read). `out` may be preallocated, e.g. a strided
view into a larger buffer with its last dim contiguous.

Fallback: `merge_head_chunks_check` names the reason a call is refused; `merge_head_chunks_ref` is the
eager permute + copy + zero fill. Numerics: pure data movement, bit-exact (any 1, 2 or 4-byte dtype).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import INTERPRET, LAUNCH_OPTS, guard, next_pow2
from ._registry import custom_op


@triton.jit
def _merge_kernel(
    recv_ptr, out_ptr, T, S, valid_rows, HD,
    sru, srb, srs, srh, sob, sos,
    D: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, NCB: tl.constexpr,
):
    pid_t = tl.program_id(0).to(tl.int64)
    pid_c = tl.program_id(1).to(tl.int64)
    u = pid_c // NCB  # source rank
    col = (pid_c - u * NCB) * BC + tl.arange(0, BC).to(tl.int64)  # column within rank u's Hl*D chunk
    tok = pid_t * BT + tl.arange(0, BT).to(tl.int64)
    b = tok // S
    s = tok - b * S
    hh = col // D
    d = col - hh * D
    m = (tok < T)[:, None] & (col < HD)[None, :]
    live = m & (s < valid_rows)[:, None]
    src = u * sru + (b * srb + s * srs)[:, None] + (hh * srh + d)[None, :]
    x = tl.load(recv_ptr + src, mask=live, other=0.0)
    dst = (b * sob + s * sos)[:, None] + (u * HD + col)[None, :]
    tl.store(out_ptr + dst, x, mask=m)


# moved as raw bits, so any 1/2/4-byte dtype (bf16, fp16, fp32, e4m3 codes, uint8 wire views) works
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _rows_disjoint(out) -> bool:
    """True when the (B, S) rows of `out` (last dim contiguous) never share an element."""
    dims = sorted((out.stride(i), out.shape[i]) for i in (0, 1) if out.shape[i] > 1)
    extent = out.shape[-1]
    for stride, size in dims:
        if stride < extent:
            return False
        extent = (size - 1) * stride + extent
    return True


def merge_head_chunks_check(recv, valid_rows, out=None) -> str | None:
    """None when the kernel takes these inputs, else the one-line reason."""
    def checks():
        yield isinstance(recv, torch.Tensor), "recv is not a tensor"
        yield recv.dim() == 5, f"recv must be (U, B, S_loc, H/U, D), got shape {tuple(recv.shape)}"
        yield (recv.device.type == "cuda" or (INTERPRET and recv.device.type == "cpu"),
               f"recv is on {recv.device.type}; Triton needs CUDA (or TRITON_INTERPRET=1 on the CPU)")
        yield (recv.element_size() in _BITS and not recv.is_complex(),
               f"recv dtype {recv.dtype} not supported (1, 2 or 4-byte elements)")
        yield (recv.stride(-1) == 1 or recv.shape[-1] == 1,
               f"recv last dim is not contiguous (strides {tuple(recv.stride())})")
        U, B, S, Hl, D = recv.shape
        yield (isinstance(valid_rows, int) and 0 <= valid_rows <= S,
               f"valid_rows {valid_rows!r} must be an int in [0, S_loc={S}]")
        if out is not None:
            yield isinstance(out, torch.Tensor), "out is not a tensor"
            yield out.shape == (B, S, U * Hl * D), f"out shape {tuple(out.shape)} != {(B, S, U * Hl * D)}"
            yield out.dtype == recv.dtype, f"out dtype {out.dtype} != recv dtype {recv.dtype}"
            yield out.device == recv.device, f"out is on {out.device}, recv on {recv.device}"
            yield (out.stride(-1) == 1 or out.shape[-1] == 1,
                   f"out last dim is not contiguous (strides {tuple(out.stride())})")
            yield _rows_disjoint(out), f"out rows overlap (shape {tuple(out.shape)}, strides {tuple(out.stride())})"
        yield recv.numel() < 2**62, "tensor too large for int64 offsets"
    return guard(checks())


def merge_head_chunks_ref(recv, valid_rows, out=None):
    """Eager: one permuted copy of the valid rows and one fill of the tail."""
    U, B, S, Hl, D = recv.shape
    if out is None:
        out = torch.empty((B, S, U * Hl * D), device=recv.device, dtype=recv.dtype)
    out.unflatten(-1, (U, Hl, D))[:, :valid_rows].copy_(recv[:, :, :valid_rows].permute(1, 2, 0, 3, 4))
    out[:, valid_rows:].zero_()
    return out


def _launch(recv, valid_rows, out):
    U, B, S, Hl, D = recv.shape
    T, HD = B * S, Hl * D
    if T == 0 or HD == 0 or U == 0:
        return
    BC = min(next_pow2(HD), 1024)
    BT = max(1, 2048 // BC)
    ncb = triton.cdiv(HD, BC)
    bits = _BITS[recv.element_size()]
    _merge_kernel[(triton.cdiv(T, BT), U * ncb)](
        recv.view(bits), out.view(bits), T, S, valid_rows, HD, *recv.stride()[:4], out.stride(0), out.stride(1),
        D=D, BT=BT, BC=BC, NCB=ncb, num_warps=4, **LAUNCH_OPTS,
    )


def _fake_merge(recv, valid_rows):
    U, B, S, Hl, D = recv.shape
    return recv.new_empty((B, S, U * Hl * D))


@custom_op("merge_head_chunks", fake=_fake_merge)
def _merge_op(recv: torch.Tensor, valid_rows: int) -> torch.Tensor:
    U, B, S, Hl, D = recv.shape
    out = torch.empty((B, S, U * Hl * D), device=recv.device, dtype=recv.dtype)
    _launch(recv, valid_rows, out)
    return out


@custom_op("merge_head_chunks_out", fake=lambda recv, valid_rows, out: None, mutates_args=("out",))
def _merge_out_op(recv: torch.Tensor, valid_rows: int, out: torch.Tensor) -> None:
    _launch(recv, valid_rows, out)


def merge_head_chunks(recv, valid_rows, out=None):
    """recv (U, B, S_loc, H/U, D) -> (B, S_loc, H*D) with rows >= valid_rows zeroed; writes into `out`
    (and returns it) when given. Exact."""
    reason = merge_head_chunks_check(recv, valid_rows, out)
    if reason:
        raise ValueError(reason)
    if out is None:
        return torch.ops.h3plan.merge_head_chunks(recv, int(valid_rows))
    torch.ops.h3plan.merge_head_chunks_out(recv, int(valid_rows), out)
    return out
