"""qk_norm_rope_fp8_lean (runtime/kernels/qk_fp8_lean.py) in the Triton interpreter: the same codes and descales
(rtol=0, atol=0) as its reference, in every mode (dynamic with valid_len and an amax hook, static with saturation,
the Ulysses destination-major layout). As in test_qk_fp8.py, torch's
RMSNorm is swapped for the CUDA-order emulation in the reference."""

import pytest
import torch
import torch.nn.functional as F

from h3plan.runtime.kernels import qk_fp8_lean as lean
from h3plan.runtime.kernels import qk_norm_rope as m

from test_qk_fp8 import assert_fp8_equal, codes, inputs  # noqa: E402  (same folder)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(autouse=True)
def cuda_order(monkeypatch):
    monkeypatch.setattr(F, "rms_norm", lambda x, shape, w=None, eps=None: m.emulate_cuda_rms_norm(x, w, eps))


@pytest.mark.slow  # the FP8 kernel in the interpreter (~2 s)
def test_same_bits_as_the_reference():
    q, k, v, wq, wk, cos, sin = inputs(B=1, seed=1)
    q[0, 1, 5] = 40.0  # one large value: it sets q's scale
    got = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5)
    assert_fp8_equal(got, m.qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, 1e-5))


@pytest.mark.parametrize("kw", [dict(valid_len=0), dict(scales=[300.0, 0.75, 1000.0])])  # unit scales; saturation
def test_modes(kw):
    q, k, v, wq, wk, cos, sin = inputs(B=1, seed=2)
    got = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, **kw)
    assert_fp8_equal(got, m.qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, 1e-5, **kw))


def test_hook_and_padding_rows():
    q, k, v, wq, wk, cos, sin = inputs(B=1, seed=4)
    v[:, 5:] = 3e4  # padding rows must not set the scale
    seen = []

    def hook(amax):
        seen.append(amax.clone())
        amax.mul_(2.0)

    got = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=5, amax_hook=hook)
    ref = m.qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=5, amax_hook=lambda a: a.mul_(2.0))
    assert_fp8_equal(got, ref)
    assert len(seen) == 1 and seen[0][2] < 100


@pytest.mark.parametrize("launch", [dict(block_t=2, block_h=4, num_warps=4)])
def test_tilings(launch, monkeypatch):
    q, k, v, wq, wk, cos, sin = inputs(B=1, S=5, H=6, seed=5)  # tails in tokens and heads
    monkeypatch.setattr(lean, "LAUNCH", dict(lean.LAUNCH, **launch))
    assert_fp8_equal(lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5),
                     m.qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, 1e-5))


def test_destination_major():
    q, k, v, wq, wk, cos, sin = inputs(B=1, S=4, H=8, seed=6)
    packed, d = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=3, ulysses_degree=4)
    ref, rd = m.qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=3, ulysses_degree=4)
    assert torch.equal(codes(packed), codes(ref)) and torch.equal(d, rd)


@pytest.mark.slow  # torch.library.opcheck (~4 s)
def test_guards_and_opcheck():
    q, k, v, wq, wk, cos, sin = inputs(B=1, S=3)
    with pytest.raises(ValueError, match="v is required"):
        lean.qk_norm_rope_fp8_lean(q, k, None, wq, wk, cos, sin, 1e-5)
    torch.library.opcheck(torch.ops.h3plan.qk_norm_rope_fp8_lean_amax.default, (q, k, v, wq, wk, cos, sin, 1e-5, 2))
    torch.library.opcheck(torch.ops.h3plan.qk_norm_rope_fp8_lean_cast.default,
                          (q, k, v, wq, wk, cos, sin, 1e-5, torch.tensor([2.0, 3.0, 4.0]), None, 1))
