"""H200: an RMSNorm built on runtime/kernels/_rmsnorm.py is bit-identical to torch's CUDA F.rms_norm
(bf16 hidden rows of 5376, bf16 heads of 128, fp16 VAE heads of 64 without weight)."""

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from h3plan.runtime.kernels._common import LAUNCH_OPTS, round_to
from h3plan.runtime.kernels._rmsnorm import cuda_rms_iters, cuda_rms_rstd, cuda_rms_sumsq

pytestmark = pytest.mark.gpu


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, n_rows, N, eps, HAS_W: tl.constexpr, IS_BF16: tl.constexpr,
                    NITER: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * ROWS + tl.arange(0, ROWS).to(tl.int64)
    rmask = rows < n_rows
    rstd = cuda_rms_rstd(cuda_rms_sumsq(x_ptr, rows * N, rmask, N, NITER, ROWS), N, eps)
    for c in tl.range(0, N, BLOCK):
        cols = c + tl.arange(0, BLOCK)
        m = rmask[:, None] & (cols < N)[None, :]
        offs = rows[:, None] * N + cols[None, :]
        x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
        y = rstd[:, None] * x
        if HAS_W:
            y = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :] * y
        tl.store(y_ptr + offs, round_to(y, IS_BF16).to(y_ptr.dtype.element_ty), mask=m)


def _rmsnorm(x, w, eps):
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    y = torch.empty_like(x2)
    rows = 2
    _rmsnorm_kernel[(triton.cdiv(x2.shape[0], rows),)](
        x2, w if w is not None else x2, y, x2.shape[0], n, eps, HAS_W=w is not None,
        IS_BF16=x.dtype == torch.bfloat16, NITER=cuda_rms_iters(n), ROWS=rows, BLOCK=256, **LAUNCH_OPTS)
    return y.view_as(x)


@pytest.mark.parametrize("shape,dtype,affine,eps", [
    ((19000, 5376), torch.bfloat16, True, 1e-5),
    ((4000, 56, 128), torch.bfloat16, True, 1e-5),
    ((8192, 32, 64), torch.float16, False, 1e-6),
])
def test_rmsnorm_bitwise_vs_torch_cuda(shape, dtype, affine, eps):
    torch.manual_seed(0)
    x = (torch.randn(shape, device="cuda") * 3).to(dtype)
    n = shape[-1]
    w = (1 + 0.1 * torch.randn(n, device="cuda")).to(dtype) if affine else None
    ref = F.rms_norm(x, (n,), w, eps)
    out = _rmsnorm(x, w, eps)
    diff = (out.view(torch.int16) != ref.view(torch.int16)).sum().item()
    print(f"rmsnorm order {shape} {dtype}: {diff} of {ref.numel()} elements differ")
    assert diff == 0
