"""rmsnorm_modulate (runtime/kernels/modulation.py) in Triton's CPU interpreter.

Numeric contracts:
- sum of squares: bit-identical (rtol=0, atol=0) to an emulation of torch's CUDA order
  (vectorized_layer_norm_kernel: 128 threads x 4-vectors, sequential per thread, shuffle-down trees).
- exact mode: bit-identical to the emulation of the whole CUDA eager sequence (that sum, IEEE / D, + eps,
  1/sqrt -- the interpreter's rsqrt --, one rounding of w * (rstd * x), then eager's bf16 modulation).
- exact mode vs torch's CPU eager: torch's CPU sums in another order and its rsqrt is not 1/sqrt; rstd
  then differs by a few fp32 ulps (relative ~2^-22), which flips the rounding of n = bf16(w * rstd * x)
  only where that product lies within ~2^-22 (relative) of a bf16 midpoint: ~2^-22 / 2^-9 = 2^-13 of the
  elements at worst. With zero tables (out == n) we allow 1 ulp on at most 1e-3 of the elements.
- fp32 mode vs exact mode: per element |exact - fp32| <= the sum of the half-ulp rounding errors of the
  exact chain (n, 1 + scale, the product, the sum) carried to the output, plus half an ulp of each output.
"""

import pytest
import torch
import triton
import triton.language as tl

from h3plan.runtime.kernels import modulation as mm
from h3plan.runtime.kernels._rmsnorm import cuda_rms_iters, cuda_rms_sumsq
from h3plan.runtime.kernels.modulation import rmsnorm_modulate, rmsnorm_modulate_check, rmsnorm_modulate_ref

EPS = 1e-5


def bits(t):
    return t.contiguous().view(torch.int16)


def sumsq_cuda_order(x2):
    """fp32 sum of squares per row of x2 (M, D), in torch's vectorized CUDA rms_norm order."""
    M, D = x2.shape
    niter = cuda_rms_iters(D)
    v = torch.zeros(M, niter * 512)
    v[:, :D] = x2.float()
    sq = (v * v).view(M, niter, 128, 4)  # [row, step, thread, vector element]
    acc = torch.zeros(M, 128)
    for j in range(niter):
        for e in range(4):
            acc = acc + sq[:, j, :, e]
    s = acc.view(M, 4, 32)
    for h in (16, 8, 4, 2, 1):
        s = s[..., :h] + s[..., h:2 * h]
    s = s.view(M, 4)
    s = s[:, :2] + s[:, 2:]
    return s[:, 0] + s[:, 1]


def emulate_exact(x, w, scale, shift, index, eps):
    B, S, D = x.shape
    ss = sumsq_cuda_order(x.reshape(-1, D)).view(B, S, 1)
    rstd = 1.0 / torch.sqrt(ss / D + eps)
    y = rstd * x.float()
    if w is not None:
        y = w.float() * y
    n = y.to(torch.bfloat16)
    return n * (1.0 + scale.index_select(0, index)) + shift.index_select(0, index)


def wide_range(shape, seed):
    """bf16 values spread over 2^-8 .. 2^8, so that different fp32 summation orders give different sums."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * torch.exp2(torch.randint(-8, 9, shape, generator=g).float())).bfloat16()


def make(B, S, D, R=7, seed=0, weight=True):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, S, D, generator=g) * 2).bfloat16()
    w = (1 + 0.1 * torch.randn(D, generator=g)).bfloat16() if weight else None
    table = (torch.randn(R, 6 * D, generator=g) * 0.5).bfloat16()
    shift, scale = table.chunk(6, dim=-1)[:2]  # row-strided views, as the block's AdaLN module returns
    index = torch.randint(0, R, (S,), generator=g)
    return x, w, scale, shift, index


@triton.jit
def _sumsq_probe(x_ptr, out_ptr, ref_ptr, M, D, NITER: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    rmask = rows < M
    tl.store(out_ptr + rows, mm._sumsq_vec(x_ptr, rows * D, rmask, D, NITER, ROWS, False), mask=rmask)
    tl.store(ref_ptr + rows, cuda_rms_sumsq(x_ptr, rows * D, rmask, D, NITER, ROWS), mask=rmask)


@pytest.mark.parametrize("M,D,rows", [(5, 96, 2), (3, 1028, 1), (4, 5376, 2)])
def test_sumsq_is_cuda_order(M, D, rows):
    x = wide_range((M, D), seed=D)
    out, ref = torch.empty(M), torch.empty(M)
    _sumsq_probe[(triton.cdiv(M, rows),)](x, out, ref, M, D, NITER=cuda_rms_iters(D), ROWS=rows)
    want = sumsq_cuda_order(x)
    assert torch.equal(out.view(torch.int32), want.view(torch.int32))
    assert torch.equal(out.view(torch.int32), ref.view(torch.int32))  # the same adds as runtime/kernels/_rmsnorm.py
    if D > 96:  # the check is sensitive: a plain left-to-right sum differs on these rows
        seq = torch.zeros(M)
        for j in range(D):
            seq = seq + x[:, j].float() ** 2
        assert not torch.equal(seq, want)


@pytest.mark.parametrize("B,S,D,config,weight", [
    (2, 7, 96, None, True),
    (3, 5, 96, (2, 64, 4), True),  # 15 rows: the last program is half empty; blocks of 64 leave a tail
    (2, 3, 1028, (1, 256, 2), False),
    (1, 3, 5376, None, True),
])
def test_exact_matches_cuda_emulation(B, S, D, config, weight):
    x, w, scale, shift, index = make(B, S, D, seed=B * S + D, weight=weight)
    x = x * wide_range((B, S, D), seed=1)  # spread magnitudes: the statistic's order matters
    out = mm._launch(x, w, scale, shift, index, EPS, "exact", config=config)
    want = emulate_exact(x, w, scale, shift, index, EPS)
    assert torch.equal(bits(out), bits(want))


@pytest.mark.slow  # interpreter at a larger shape (~3 s)
def test_exact_vs_cpu_eager():
    x, w, scale, shift, index = make(2, 6, 5376, seed=3)
    zeros = torch.zeros_like(scale)
    n = rmsnorm_modulate(x, w, zeros, zeros, index, EPS)  # 1 + 0 and + 0 are exact: out == n
    ref = torch.nn.functional.rms_norm(x, (5376,), w, EPS)
    ulps = (bits(n).int() - bits(ref).int()).abs()
    assert ulps.max() <= 1 and (ulps > 0).float().mean() <= 1e-3
    out = rmsnorm_modulate(x, w, scale, shift, index, EPS)
    full = rmsnorm_modulate_ref(x, w, scale, shift, index, EPS)
    assert (bits(out) != bits(full)).float().mean() <= 1e-3


def _ulp(t):
    """bf16 ulp at |t| (normal range; 2^-133 below it)."""
    e = torch.floor(torch.log2(t.float().abs().clamp_min(2.0 ** -126)))
    return torch.exp2(e - 7)


@pytest.mark.slow  # interpreter at a larger shape (~2 s)
def test_fp32_mode_error_bound():
    x, w, scale, shift, index = make(2, 5, 5376, seed=5)
    exact = mm._launch(x, w, scale, shift, index, EPS, "exact")
    fp32 = rmsnorm_modulate(x, w, scale, shift, index, EPS, mode="fp32")
    # The exact chain's intermediates, from the same statistic (the emulation equals the kernel).
    ss = sumsq_cuda_order(x.reshape(-1, 5376)).view(2, 5, 1)
    n32 = w.float() * ((1.0 / torch.sqrt(ss / 5376 + EPS)) * x.float())
    n = n32.bfloat16()
    s1 = (1.0 + scale.index_select(0, index)).float()
    s1b = s1.bfloat16()
    m = n * s1b
    bound = (0.5 * _ulp(n) * s1b.float().abs() + 0.5 * n32.abs() * _ulp(s1b) + 0.5 * _ulp(m)
             + 0.5 * _ulp(exact) + 0.5 * _ulp(fp32)
             + 2.0 ** -20 * (n32.abs() * s1.abs() + shift.index_select(0, index).float().abs()))
    err = (exact.float() - fp32.float()).abs()
    assert torch.all(err <= bound)
    differ = (bits(exact) != bits(fp32)).float().mean().item()
    print(f"fp32 vs exact: max abs {err.max().item():.3g}, max rel "
          f"{(err / exact.float().abs().clamp_min(1e-3)).max().item():.3g}, differing {differ:.3%}")
    assert differ > 0.01  # the modes really differ (fp32 drops three roundings)
    ref = rmsnorm_modulate_ref(x, w, scale, shift, index, EPS, mode="fp32")
    ulps = (bits(fp32).int() - bits(ref).int()).abs()
    assert ulps.max() <= 1 and (ulps > 0).float().mean() <= 1e-3  # only the statistic's order differs


def _refusal(**change):
    x, w, scale, shift, index = make(1, 4, 96)
    args = dict(x=x, weight=w, scale=scale, shift=shift, index=index, eps=EPS, mode="exact")
    args.update(change)
    return rmsnorm_modulate_check(**args)


@pytest.mark.parametrize("change,reason", [
    (lambda x, w, s, h, i: dict(x=x.float()), "x dtype"),
    (lambda x, w, s, h, i: dict(x=torch.cat([x, x], -1)[..., ::2]), "x is not contiguous"),
    (lambda x, w, s, h, i: dict(x=x[0]), "x has 2 dims"),
    (lambda x, w, s, h, i: dict(index=i.int()), "index dtype"),
    (lambda x, w, s, h, i: dict(index=i[:3]), "index has 3 rows"),
    (lambda x, w, s, h, i: dict(weight=w[:48]), "weight has 48"),
    (lambda x, w, s, h, i: dict(weight=w.half()), "weight dtype"),
    (lambda x, w, s, h, i: dict(scale=s.t().contiguous().t()), "scale columns not unit-stride"),
    (lambda x, w, s, h, i: dict(shift=h[:, :48]), "shift has 48 columns"),
    (lambda x, w, s, h, i: dict(mode="fp16"), "mode"),
    (lambda x, w, s, h, i: dict(x=x[..., :94].contiguous(), weight=None, scale=s[:, :94], shift=h[:, :94]),
     "D % 4"),
    (lambda x, w, s, h, i: dict(x=torch.empty(4 * 96 + 1, dtype=torch.bfloat16)[1:].view(1, 4, 96)),
     "8-byte aligned"),
])
def test_guards(change, reason):
    x, w, scale, shift, index = make(1, 4, 96)
    got = _refusal(**change(x, w, scale, shift, index))
    assert got is not None and reason in got, got
    with pytest.raises(ValueError, match="."):
        args = dict(x=x, weight=w, scale=scale, shift=shift, index=index, eps=EPS, mode="exact")
        args.update(change(x, w, scale, shift, index))
        rmsnorm_modulate(**args)


def test_fp32_mode_takes_any_width():
    x, w, scale, shift, index = make(1, 3, 94, seed=9)  # D % 4 != 0: refused by exact, fine for fp32
    assert _refusal(x=x, weight=w, scale=scale, shift=shift, index=index, mode="fp32") is None
    out = rmsnorm_modulate(x, w, scale, shift, index, EPS, mode="fp32")
    ref = rmsnorm_modulate_ref(x, w, scale, shift, index, EPS, mode="fp32")
    assert (bits(out).int() - bits(ref).int()).abs().max() <= 1


def test_custom_op_traces():
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w, scale, shift, index = make(1, 3, 96, seed=11)
    gm = make_fx(lambda x: rmsnorm_modulate(x, w, scale, shift, index, EPS))(x)
    assert torch.ops.h3plan.rmsnorm_modulate.default in [n.target for n in gm.graph.nodes]
    f = torch.compile(lambda x: rmsnorm_modulate(x, w, scale, shift, index, EPS) * 2, backend="eager",
                      fullgraph=True)
    assert torch.equal(bits(f(x)), bits(mm._launch(x, w, scale, shift, index, EPS, "exact") * 2))


def test_empty_rows():
    x, w, scale, shift, index = make(1, 0, 96)
    assert rmsnorm_modulate(x, w, scale, shift, index, EPS).shape == (1, 0, 96)
