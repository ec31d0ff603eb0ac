"""`negate` flips exactly the sign bit, as torch's neg does: -(+0.0) is -0.0 (Triton's unary minus gives
+0.0 there on the GPU), and every other value, inf included, keeps its magnitude bits; NaN stays NaN. Runs in
the interpreter on the CPU and compiled on a GPU (where it also prints what the plain unary minus gives)."""

import torch
import triton
import triton.language as tl

from h3plan.runtime.kernels._common import negate


@triton.jit
def _negate_kernel(x_ptr, o_ptr, p_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    tl.store(o_ptr + offs, negate(x), mask=m)
    tl.store(p_ptr + offs, -x, mask=m)


def test_negate_flips_only_the_sign_bit():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.tensor([0.0, -0.0, 1.5, -2.0, 1e-45, -3e38, float("inf"), float("-inf"), float("nan")], device=dev)
    out, plain = torch.empty_like(x), torch.empty_like(x)
    _negate_kernel[(1,)](x, out, plain, x.numel(), BLOCK=16)
    # NaN: only NaN-ness is compared (torch's own neg gives 0xffc00000 on the CPU, canonical 0x7fffffff on
    # CUDA; the kernels round every output through a conversion that canonicalises NaN anyway)
    nan = x.isnan()
    want = torch.neg(x).view(torch.int32)[~nan]
    print(f"\n[{dev}] Triton unary minus differs from torch.neg in "
          f"{int((plain.view(torch.int32)[~nan] != want).sum())} of {int((~nan).sum())} non-NaN values; negate in "
          f"{int((out.view(torch.int32)[~nan] != want).sum())}")
    assert torch.equal(out.view(torch.int32)[~nan], want) and bool(out[nan].isnan().all())
