"""swiglu (runtime/kernels/swiglu.py) in Triton's CPU interpreter.

silu depends only on the 16-bit gate value, so it is checked exhaustively over all 65,536 of them.
- bf16: bit-identical to eager (rtol=0, atol=0) for every gate value, subnormals and infinities included;
  NaN where eager has NaN.
- fp16: the interpreter's exp is numpy's, torch's CPU exp is its own vectorized one; they differ by an
  fp32 ulp on a few percent of inputs, and that flips the fp16 rounding of silu only where the fp32
  quotient lies within ~2^-23 (relative) of an fp16 midpoint: ~2^-23 / 2^-12 = 2^-11 of those, i.e.
  about one gate value in 65,536 expected. Allowed: at most 8 values, each by 1 ulp. (On the GPU the
  kernel calls the same expf as torch: tests/gpu checks it bit for bit.)
"""

import pytest
import torch

from h3plan.runtime.kernels import swiglu as sw
from h3plan.runtime.kernels.swiglu import swiglu, swiglu_check, swiglu_ref

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on inf/nan inputs

ALL16 = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)


def split_nan(out, ref):
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(out), nan)
    return out.view(torch.int16)[~nan].int(), ref.view(torch.int16)[~nan].int()


@pytest.mark.parametrize("hidden", ["ones", "random"])
def test_bf16_every_gate_value(hidden):
    gate = ALL16.view(torch.bfloat16).reshape(64, 1024)
    h = torch.ones_like(gate) if hidden == "ones" else torch.randn(64, 1024).bfloat16()
    x = torch.cat([h, gate], dim=-1)
    a, b = split_nan(sw._launch(x, (8, 256, 4)), swiglu_ref(x))
    assert torch.equal(a, b)


def test_fp16_every_gate_value():
    gate = ALL16.view(torch.float16).reshape(64, 1024)
    x = torch.cat([torch.ones_like(gate), gate], dim=-1)
    a, b = split_nan(sw._launch(x, (8, 256, 4)), swiglu_ref(x))
    diff = (a - b).abs()
    assert diff.max() <= 1 and (diff > 0).sum() <= 8


def test_fp32_is_the_fp32_ops_unrounded():
    """fp32 x (the VAE's fp32 decode): silu's fp32 quotient and the product, no rounding step; against the same
    fp32 operations with the interpreter's (numpy's) exp, bit for bit (the GPU suite checks torch's own expf)."""
    import numpy as np

    g = torch.Generator().manual_seed(5)
    x = torch.randn(37, 2 * 96, generator=g) * 6
    x[0, 96:100] = torch.tensor([0.0, -0.0, 1e-35, -88.0])
    out = sw._launch(x, (4, 32, 4))
    h, gate = x[:, :96].numpy(), x[:, 96:].numpy()
    with np.errstate(over="ignore"):
        ref = h * np.where(np.abs(gate) < 1e-30, gate * np.float32(0.5), gate / (np.float32(1) + np.exp(-gate)))
    assert out.dtype == torch.float32 and torch.equal(out.view(torch.int32),
                                                      torch.from_numpy(ref.astype(np.float32)).view(torch.int32))


@pytest.mark.parametrize("shape,config", [((2, 3, 200), None), ((5, 2 * 14336), (2, 1024, 4)), ((7, 96), (4, 32, 4))])
def test_shapes(shape, config):
    g = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(shape, generator=g) * 3).bfloat16()
    out = sw._launch(x, config)
    assert out.shape == shape[:-1] + (shape[-1] // 2,)
    assert torch.equal(out.view(torch.int16), swiglu_ref(x).view(torch.int16))


@pytest.mark.parametrize("x,reason", [
    (torch.randn(2, 8).double(), "x dtype"),
    (torch.randn(2, 7).bfloat16(), "not even"),
    (torch.randn(8, 2).bfloat16().t(), "x is not contiguous"),
])
def test_guards(x, reason):
    got = swiglu_check(x)
    assert got is not None and reason in got, got
    with pytest.raises(ValueError, match="."):
        swiglu(x)


def test_float32_is_the_vaes_only():
    x = torch.randn(2, 8)
    assert "x dtype" in swiglu_check(x) and sw.vae_swiglu_check(x) is None


def test_custom_op_traces():
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(3, 64).bfloat16()
    gm = make_fx(swiglu)(x)
    assert torch.ops.h3plan.swiglu.default in [n.target for n in gm.graph.nodes]
    f = torch.compile(lambda x: swiglu(x) * 2, backend="eager", fullgraph=True)
    assert torch.equal(f(x).view(torch.int16), (swiglu_ref(x) * 2).view(torch.int16))
    assert swiglu(x[:0]).shape == (0, 32)
