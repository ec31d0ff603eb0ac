"""Gated residual of the MiniMax-H3 block: `h + gate.index_select(0, index) * y`, exact.

h, y: (B, S, D) bf16, contiguous. gate: (R, D) bf16 with unit column stride and any row stride (the
`chunk(6, -1)` views of the AdaLN projection). index: (S,) int64, shared by the batch; its values must
lie in [0, R) -- the kernel does not check them (a device-side check would synchronize), the reference
raises.

Numerics: eager rounds the product to bf16, then the sum; the kernel does both products and sums in fp32
and rounds at exactly those two points (bit-identical to eager on the GPU and in the interpreter).
Fallback: `gated_residual_ref`, the eager sequence itself; `gated_residual_check` says why an input is
refused.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from h3plan.runtime.kernels._common import (INTERPRET, LAUNCH_OPTS, from_f32, guard, interpreter_tile, round_hw,
                                            tensor_checks, to_f32)
from h3plan.runtime.kernels._registry import custom_op

# (rows per program, columns per program, warps). Columns: the largest power of two <= 1024 dividing D
# (5376 = 21 * 256), so no lanes are masked. Untimed until benchmarks/fused_kernels.py --sweep runs on the H200.
SWEEP_CONFIGS = [(8, 256, 4), (4, 256, 4), (16, 256, 8), (4, 512, 4), (2, 1024, 4), (8, 512, 8)]


def _config(D: int):
    block = next((b for b in (1024, 512, 256, 128) if D % b == 0), min(1024, triton.next_power_of_2(D)))
    return (interpreter_tile(max(1, 2048 // block)), block, 4)


@triton.jit
def _gated_residual_kernel(h_ptr, g_ptr, idx_ptr, y_ptr, out_ptr, M, S, D, g_stride,
                           ROWS: tl.constexpr, BLOCK_D: tl.constexpr, HW: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    rmask = rows < M
    m = rmask[:, None] & (cols < D)[None, :]
    idx = tl.load(idx_ptr + rows % S, mask=rmask, other=0)
    offs = rows[:, None] * D + cols[None, :]
    h = to_f32(tl.load(h_ptr + offs, mask=m, other=0.0), HW)
    y = to_f32(tl.load(y_ptr + offs, mask=m, other=0.0), HW)
    g = to_f32(tl.load(g_ptr + idx[:, None] * g_stride + cols[None, :], mask=m, other=0.0), HW)
    p = round_hw(g * y, True, HW)
    out = round_hw(h + p, True, HW)
    tl.store(out_ptr + offs, from_f32(out, tl.bfloat16, HW), mask=m)


def gated_residual_ref(h, gate, index, y):
    """The block's eager expression (oracle and fallback)."""
    return h + gate.index_select(0, index) * y


def gated_residual_check(h, gate, index, y) -> str | None:
    """None if the kernel takes these inputs, else the one-line reason."""
    def checks():
        yield from tensor_checks("h", h, (torch.bfloat16,), ndim=3)
        yield from tensor_checks("y", y, (torch.bfloat16,), ndim=3, device=h.device)
        yield y.shape == h.shape, f"y shape {tuple(y.shape)} != h shape {tuple(h.shape)}"
        yield from tensor_checks("gate", gate, (torch.bfloat16,), ndim=2, contiguous=False, device=h.device)
        yield gate.shape[1] == h.shape[2], f"gate has {gate.shape[1]} columns, h has {h.shape[2]}"
        yield gate.stride(1) == 1 or gate.shape[1] == 1, f"gate columns not unit-stride (strides {gate.stride()})"
        yield from tensor_checks("index", index, (torch.int64,), ndim=1, device=h.device)
        yield index.shape[0] == h.shape[1], f"index has {index.shape[0]} rows, h has S={h.shape[1]}"
        yield gate.shape[0] > 0 or h.numel() == 0, "gate table has no rows"
    return guard(checks())


def _launch(h, gate, index, y, config=None):
    B, S, D = h.shape
    out = torch.empty_like(h)
    M = B * S
    if M == 0 or D == 0:
        return out
    rows, block_d, warps = config or _config(D)
    grid = (triton.cdiv(M, rows), triton.cdiv(D, block_d))
    _gated_residual_kernel[grid](h, gate, index, y, out, M, S, D, gate.stride(0),
                                 ROWS=rows, BLOCK_D=block_d, HW=not INTERPRET, num_warps=warps, **LAUNCH_OPTS)
    return out


@custom_op("gated_residual", fake=lambda h, gate, index, y: torch.empty_like(h))
def _gated_residual_op(h: torch.Tensor, gate: torch.Tensor, index: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    reason = gated_residual_check(h, gate, index, y)
    if reason is not None:
        raise ValueError(reason)
    return _launch(h, gate, index, y)


def gated_residual(h, gate, index, y):
    """`h + gate[index] * y` in one pass, bit-identical to eager; ValueError(reason) if refused."""
    reason = gated_residual_check(h, gate, index, y)
    if reason is not None:
        raise ValueError(reason)
    return torch.ops.h3plan.gated_residual(h, gate, index, y)


# the kernel ops of this module a lever names (SPEC.kernels): op -> (function, its check), read by table.py
OPS = {"gated_residual": ("gated_residual", "gated_residual_check")}
