"""The FP8 q/k/v cast (qk_fp8_lean.qk_norm_rope_fp8_lean, Triton interpreter): e4m3 rounding helper, dynamic /
static scales, hook, layouts.

Numeric contract: the e4m3 codes and descales are bit-exact (rtol=0, atol=0) against
`qk_norm_rope_fp8_ref` (torch amax / scale / clamp / `.to(float8_e4m3fn)` on the eager norm + RoPE, with
torch's RMSNorm swapped for the CUDA-order emulation as in test_qk_norm_rope.py). The FP8 values are
lossy against the bf16 attention inputs by design: |dequant - x| <= 2^-4 |x| where |x*scale| >= 2^-6
(3 mantissa bits, round to nearest) and <= 2^-10 / scale below (subnormal step 2^-9, halved).
"""

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from h3plan.runtime.kernels import fp8
from h3plan.runtime.kernels import qk_fp8_lean as lean
from h3plan.runtime.kernels import qk_norm_rope as m

E4M3 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def cuda_order(monkeypatch):
    monkeypatch.setattr(F, "rms_norm", lambda x, shape, w=None, eps=None: m.emulate_cuda_rms_norm(x, w, eps))


def inputs(B=2, S=7, H=4, D=32, R=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, S, H * D, generator=g).bfloat16() for _ in range(3))
    wq = (1 + 0.3 * torch.randn(D, generator=g)).bfloat16()
    wk = (1 + 0.3 * torch.randn(D, generator=g)).bfloat16()
    f = torch.randn(S, R // 2, generator=g) * 3
    f = torch.cat([f, f], -1)
    return q, k, v, wq, wk, f.cos(), f.sin()


def codes(t):
    return t.view(torch.uint8)


def assert_fp8_equal(got, ref):
    *g8, gd = got
    *r8, rd = ref
    for a, b in zip(g8, r8):
        assert a.dtype == E4M3 and a.shape == b.shape
        assert torch.equal(codes(a), codes(b)), f"{(codes(a) != codes(b)).sum().item()} codes differ"
    assert torch.equal(gd.view(torch.int32), rd.view(torch.int32)), (gd, rd)


@triton.jit
def _e4m3_probe(x_ptr, o_ptr, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    z = tl.load(x_ptr + i, mask=i < N, other=0.0)
    z = tl.where(z > 448.0, 448.0, tl.where(z < -448.0, -448.0, z))
    tl.store(o_ptr + i, fp8.round_to_e4m3(z).to(tl.float8e4nv), mask=i < N)


def test_e4m3_rne_helper_exhaustive():
    """Every non-NaN bf16 value (incl. +-inf, subnormals, -0, out of range), every e4m3 midpoint and its fp32
    neighbours, and random fp32: same codes as torch's clamp + .to(float8_e4m3fn). (NaN is left out: the
    interpreter's fp8 cast does not produce the NaN code; on the GPU NaN stays NaN.)"""
    allbf16 = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(E4M3).float()
    grid = grid[torch.isfinite(grid)].unique()
    mid = (grid[1:] + grid[:-1]) / 2
    up, down = torch.full_like(mid, 1e30), torch.full_like(mid, -1e30)
    near = torch.cat([mid, torch.nextafter(mid, up), torch.nextafter(mid, down)])
    g = torch.Generator().manual_seed(0)
    x = torch.cat([allbf16, near, -near, torch.randn(50000, generator=g) * 100,
                   torch.randn(50000, generator=g) * 1e-3])
    x = x[~torch.isnan(x)].contiguous()
    out = torch.empty(x.numel(), dtype=E4M3)
    _e4m3_probe[(triton.cdiv(x.numel(), 65536),)](x, out, x.numel(), BLOCK=65536)
    ref = x.clamp(-448, 448).to(E4M3)
    assert torch.equal(codes(out), codes(ref)), f"{(codes(out) != codes(ref)).sum().item()} codes differ"


@pytest.mark.slow  # interpreter at a larger shape (~2 s)
def test_dynamic_excludes_padding_rows():
    q, k, v, wq, wk, cos, sin = inputs()
    valid = 5
    # padding rows: one spike per head row in a pass-through channel (normed value sqrt(D) * w = 17,
    # above any valid row) and huge v
    c = 30
    wq[c] = 3.0
    q[:, valid:] = 0.0
    q[:, valid:, c::32] = 1.0
    v[:, valid:] = 3e4
    got = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=valid)
    assert_fp8_equal(got, m.qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=valid))
    qo, ko, vo = m.qk_norm_rope_ref(q, k, wq, wk, cos, sin, 1e-5, v=v)
    amax = torch.stack([t[:, :valid].float().abs().amax() for t in (qo, ko, vo)])
    assert torch.equal(got[3], torch.ones(3) / (torch.full((3,), 448.0) / amax))
    inflated = torch.stack([t.float().abs().amax() for t in (qo, vo)])
    assert (inflated > amax[[0, 2]]).all()  # the padding would have moved both scales


@pytest.mark.slow  # interpreter at a larger shape (~3 s)
def test_amax_hook_sees_and_sets_the_amax():
    q, k, v, wq, wk, cos, sin = inputs(seed=1)
    calls = []

    def hook(amax):
        calls.append(amax.clone())
        amax.mul_(4.0)  # an all-reduce MAX with a larger peer

    got = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=6, amax_hook=hook)
    assert len(calls) == 1 and calls[0].shape == (3,) and calls[0].dtype == torch.float32
    qo, ko, vo = m.qk_norm_rope_ref(q, k, wq, wk, cos, sin, 1e-5, v=v)
    assert torch.equal(calls[0], torch.stack([t[:, :6].float().abs().amax() for t in (qo, ko, vo)]))
    ref = m.qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=6, amax_hook=lambda a: a.mul_(4.0))
    assert_fp8_equal(got, ref)
    plain = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=6)
    assert torch.equal(got[3], plain[3] * 4)


def test_zero_amax_uses_unit_scale():
    q, k, v, wq, wk, cos, sin = inputs()
    got = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=0)
    assert torch.equal(got[3], torch.ones(3))
    assert_fp8_equal(got, m.qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=0))


def test_static_scales_and_saturation():
    q, k, v, wq, wk, cos, sin = inputs(seed=2)
    scales = torch.tensor([300.0, 0.75, 1000.0])  # q and v saturate at +-448
    got = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, scales=scales)
    assert_fp8_equal(got, m.qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, 1e-5, scales=scales))
    assert (codes(got[2]) & 0x7F == 0x7E).any()  # +-448 reached, never the NaN code
    assert not (codes(got[2]) & 0x7F == 0x7F).any()


@pytest.mark.slow  # interpreter at both Ulysses degrees (~4-5 s a case)
@pytest.mark.parametrize("U", [2, 4])
def test_fp8_destination_major(U):
    q, k, v, wq, wk, cos, sin = inputs(H=8, seed=U)
    packed, descale = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=4, ulysses_degree=U)
    B, S, H, D = 2, 7, 8, 32
    assert packed.shape == (U, 3, B, S, H // U, D) and packed.dtype == E4M3
    flat = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=4)
    assert torch.equal(descale, flat[3])
    for u in range(U):
        for i in range(3):
            assert torch.equal(codes(packed[u, i]), codes(flat[i][:, :, u * (H // U):(u + 1) * (H // U)]))
    ref = m.qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=4, ulysses_degree=U)
    assert torch.equal(codes(packed), codes(ref[0]))


@pytest.mark.slow  # interpreter at a larger shape (~3 s)
def test_quantisation_error_budget():
    q, k, v, wq, wk, cos, sin = inputs(seed=3)
    *f8, descale = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5)
    for x8, x, d in zip(f8, m.qk_norm_rope_ref(q, k, wq, wk, cos, sin, 1e-5, v=v), descale):
        x = x.float()
        err = (x8.float() * d - x).abs()
        scale = 1.0 / d
        normal = (x * scale).abs() >= 2.0 ** -6
        # descale = 1/scale rounds once more: allow its half-ulp (2^-24 relative) on top
        assert (err[normal] <= x[normal].abs() * (2.0 ** -4 + 2.0 ** -22)).all()
        assert (err[~normal] <= 2.0 ** -10 / scale * (1 + 2.0 ** -20)).all()


@pytest.mark.parametrize("bad,msg", [
    ([1.0, 2.0], "shape (3,)"),
    ([1.0, float("nan"), 1.0], "finite"),
    ([1.0, float("inf"), 1.0], "finite"),
    ([0.0, 1.0, 1.0], "> 0"),
    ([1.0, -2.0, 1.0], "> 0"),
    ("abc", "numeric"),
    (torch.ones(3, 1), "shape (3,)"),
])
def test_malformed_static_table(bad, msg):
    q, k, v, wq, wk, cos, sin = inputs()
    reason = m.qk_norm_rope_fp8_check(q, k, v, wq, wk, cos, sin, 1e-5, scales=bad)
    assert reason is not None and msg in reason and "\n" not in reason
    with pytest.raises(ValueError, match="static FP8 scales"):
        lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, scales=bad)


def test_fp8_guards():
    q, k, v, wq, wk, cos, sin = inputs()
    assert m.qk_norm_rope_fp8_check(q, k, v, wq, wk, cos, sin, 1e-5) is None
    assert "v is required" in m.qk_norm_rope_fp8_check(q, k, None, wq, wk, cos, sin, 1e-5)
    assert "valid_len" in m.qk_norm_rope_fp8_check(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=8)
    assert "valid_len" in m.qk_norm_rope_fp8_check(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=-1)
    assert "callable" in m.qk_norm_rope_fp8_check(q, k, v, wq, wk, cos, sin, 1e-5, amax_hook=3)
    assert "ulysses_degree" in m.qk_norm_rope_fp8_check(q, k, v, wq, wk, cos, sin, 1e-5, ulysses_degree=3)
    with pytest.raises(ValueError, match="v is required"):
        lean.qk_norm_rope_fp8_lean(q, k, None, wq, wk, cos, sin, 1e-5)
