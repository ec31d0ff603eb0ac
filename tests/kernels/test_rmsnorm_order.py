"""The torch-CUDA RMSNorm reduction order (runtime/kernels/_rmsnorm.py) against a numpy emulation of
torch's vectorized_layer_norm_kernel: exact (rtol=0, atol=0), since both do the same fp32 adds."""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from h3plan.runtime.kernels._rmsnorm import cuda_rms_iters, cuda_rms_rstd, cuda_rms_sumsq


@triton.jit
def _sumsq_kernel(x_ptr, out_ptr, rstd_ptr, n_rows, N, eps, NITER: tl.constexpr, ROWS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * ROWS + tl.arange(0, ROWS).to(tl.int64)
    rmask = rows < n_rows
    s = cuda_rms_sumsq(x_ptr, rows * N, rmask, N, NITER, ROWS)
    tl.store(out_ptr + rows, s, mask=rmask)
    tl.store(rstd_ptr + rows, cuda_rms_rstd(s, N, eps), mask=rmask)


def sumsq_emulated(x: np.ndarray) -> np.ndarray:
    """float32 emulation: 128 threads x 4-vectors, sequential per thread, then the shuffle trees."""
    rows, n = x.shape
    nv = n // 4
    out = np.empty(rows, np.float32)
    for r in range(rows):
        acc = np.zeros(128, np.float32)
        for t in range(128):
            for i in range(t, nv, 128):
                for ii in range(4):
                    v = np.float32(x[r, 4 * i + ii])
                    acc[t] = np.float32(acc[t] + v * v)
        lanes = acc.reshape(4, 32)
        for off in (16, 8, 4, 2, 1):
            lanes = (lanes[:, :off] + lanes[:, off : 2 * off]).astype(np.float32)
        w = lanes[:, 0]
        w = (w[:2] + w[2:]).astype(np.float32)
        out[r] = np.float32(w[0] + w[1])
    return out


@pytest.mark.parametrize("n,rows,block_rows", [(96, 3, 1), (128, 5, 2), (5376, 2, 1), (1028, 3, 4)])
def test_sumsq_matches_cuda_order(n, rows, block_rows):
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(rows, n, generator=g) * 3).to(torch.bfloat16)
    out = torch.empty(rows, dtype=torch.float32)
    rstd = torch.empty(rows, dtype=torch.float32)
    grid = (triton.cdiv(rows, block_rows),)
    _sumsq_kernel[grid](x, out, rstd, rows, n, 1e-5, NITER=cuda_rms_iters(n), ROWS=block_rows)
    ref = sumsq_emulated(x.float().numpy())
    assert np.array_equal(out.numpy().view(np.int32), ref.view(np.int32))
    # rstd: IEEE division then rsqrt; the interpreter's rsqrt is numpy's 1/sqrt, so compare to that.
    ms = (ref / np.float32(n)).astype(np.float32)
    np.testing.assert_allclose(rstd.numpy(), 1.0 / np.sqrt(ms + np.float32(1e-5)), rtol=2e-7, atol=0)
