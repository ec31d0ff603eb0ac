"""qk_norm_rope (Triton interpreter) against its references.

Numeric contract: rtol=0, atol=0 (bits) against the eager sequence with torch's RMSNorm replaced by
`emulate_cuda_rms_norm` (the CUDA reduction order the kernel reproduces; torch on the CPU sums in
another order), including against diffusers' own MiniMaxH3Attention processor with that one swap.
Against unmodified CPU eager: differences only where the two sum orders differ, at most 1 ulp of the
normed value on a small fraction of elements (measured ~5e-6 of bf16 elements over 2e5 rows).
The GPU suite checks the real CUDA eager bit for bit.
"""

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from h3plan.runtime.kernels import qk_norm_rope as m


def cuda_order_rms_norm(x, normalized_shape, weight=None, eps=None):
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    return m.emulate_cuda_rms_norm(x, weight, eps)


@pytest.fixture
def cuda_order(monkeypatch):
    monkeypatch.setattr(F, "rms_norm", cuda_order_rms_norm)


def rope(S, R, seed=0):
    """cos/sin (S, R) fp32 from (t, h, w) positions, as MiniMaxH3RotaryPosEmbed builds them."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 60, (S, 3), generator=g).float()
    inv = 1.0 / (10000.0 ** (torch.arange(0, R // 3, 2).float() / (R // 3)))
    f = (pos[:, :, None] * inv).flatten(1)
    f = torch.cat([f, f], -1)
    return f.cos(), f.sin()


def inputs(B, S, H, D, R, seed=0, dtype=torch.bfloat16, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, S, H * D, generator=g) * scale).to(dtype)
    k = (torch.randn(B, S, H * D, generator=g) * 2 * scale).to(dtype)
    v = torch.randn(B, S, H * D, generator=g).to(dtype)
    wq = (1 + 0.3 * torch.randn(D, generator=g)).to(dtype)
    wk = (1 + 0.3 * torch.randn(D, generator=g)).to(dtype)
    return q, k, v, wq, wk, *rope(S, R, seed)


def bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.uint8)


def assert_bits(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(bits(a), bits(b)), f"{(bits(a) != bits(b)).sum().item()} of {a.numel()} differ"


@pytest.mark.parametrize("B,S,H,D,R", [pytest.param(2, 7, 4, 32, 24, marks=pytest.mark.slow),  # B=2: ~2 s
                                       (1, 3, 8, 128, 96), (1, 2, 3, 64, 48), (1, 5, 2, 96, 96)])
def test_exact_vs_cuda_order(cuda_order, B, S, H, D, R):
    q, k, v, wq, wk, cos, sin = inputs(B, S, H, D, R)
    got = m.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-5, v=v)
    ref = m.qk_norm_rope_ref(q, k, wq, wk, cos, sin, 1e-5, v=v)
    for a, b in zip(got, ref):
        assert a.is_contiguous() and a.shape == (B, S, H, D)
        assert_bits(a, b)
    assert_bits(got[2], v.unflatten(-1, (H, D)))


def test_fp16_and_4d_views_and_special_rows(cuda_order):
    B, S, H, D, R = 2, 5, 4, 32, 24
    q, k, v, wq, wk, cos, sin = inputs(B, S, H, D, R, dtype=torch.float16, scale=3.0)
    q[0, 1] = 0.0  # all-zero rows
    k[1, 2] = 6e-8  # fp16 subnormals
    q[1, 3] = 1000.0  # large, equal values
    q4, k4 = q.unflatten(-1, (H, D)), k.unflatten(-1, (H, D))
    got = m.qk_norm_rope(q4, k4, wq, wk, cos, sin, 1e-6)
    ref = m.qk_norm_rope_ref(q4, k4, wq, wk, cos, sin, 1e-6)
    for a, b in zip(got, ref):
        assert_bits(a, b)


def test_bf16_subnormal_inputs(cuda_order):
    q, k, v, wq, wk, cos, sin = inputs(1, 3, 2, 32, 24)
    q[0, 0] = 1e-39  # bf16 subnormal: the interpreter's bf16 -> fp32 cast would mangle these
    got = m.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-5)
    ref = m.qk_norm_rope_ref(q, k, wq, wk, cos, sin, 1e-5)
    for a, b in zip(got, ref):
        assert_bits(a, b)


def test_packed_row_stride_and_batch_stride(cuda_order):
    """q, k, v as slices of one fused QKV projection (row stride 3*H*D) and of a larger batch."""
    B, S, H, D, R = 2, 6, 4, 32, 24
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(B + 1, S, 3 * H * D, generator=g).bfloat16()[1:]
    q, k, v = qkv.chunk(3, dim=-1)
    assert q.stride() == (S * 3 * H * D, 3 * H * D, 1)
    _, _, _, wq, wk, cos, sin = inputs(B, S, H, D, R)
    got = m.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-5, v=v)
    ref = m.qk_norm_rope_ref(q.contiguous(), k.contiguous(), wq, wk, cos, sin, 1e-5, v=v.contiguous())
    for a, b in zip(got, ref):
        assert_bits(a, b)


@pytest.mark.parametrize("U,with_v", [(2, True), (4, False), (4, True)])
def test_destination_major_pack(cuda_order, U, with_v):
    B, S, H, D, R = 2, 3, 8, 32, 24
    q, k, v, wq, wk, cos, sin = inputs(B, S, H, D, R, seed=U)
    packed = m.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-5, v=v if with_v else None, ulysses_degree=U)
    n = 3 if with_v else 2
    assert packed.shape == (U, n, B, S, H // U, D) and packed.is_contiguous()
    outs = m.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-5, v=v if with_v else None)
    # reference permutation, element by element: [u, i, b, s, hl] = outs[i][b, s, u * H/U + hl]
    Hl = H // U
    for u in range(U):
        for i in range(n):
            for hl in range(Hl):
                assert torch.equal(bits(packed[u, i, :, :, hl]), bits(outs[i][:, :, u * Hl + hl]))
    assert_bits(packed, m.qk_norm_rope_ref(q, k, wq, wk, cos, sin, 1e-5, v=v if with_v else None, ulysses_degree=U))


@pytest.mark.slow  # diffusers' processor against the kernel in the interpreter (~3 s)
def test_matches_diffusers_attention_processor(cuda_order, monkeypatch):
    """The real MiniMaxH3Attention processor (to_q/k -> unflatten -> norm_q/k -> _apply_rotary_emb), with its
    attention call captured, against the kernel on the same projections."""
    import diffusers.models.transformers.transformer_minimax_h3 as tm

    torch.manual_seed(0)
    H, D, hidden, S = 4, 32, 48, 9
    attn = tm.MiniMaxH3Attention(hidden_size=hidden, heads=H, dim_head=D, qk_norm_eps=1e-5).bfloat16()
    with torch.no_grad():
        attn.norm_q.weight.normal_(1.0, 0.3)
        attn.norm_k.weight.normal_(1.0, 0.3)
    rope_mod = tm.MiniMaxH3RotaryPosEmbed(rope_freq_dim=4)  # R = 24
    pos = torch.stack(torch.meshgrid(torch.arange(1), torch.arange(3), torch.arange(3), indexing="ij"), -1).view(-1, 3)
    cos, sin = rope_mod(pos)
    seen = {}

    def capture(query, key, value, **kw):
        seen["q"], seen["k"] = query, key
        return torch.zeros_like(query)

    monkeypatch.setattr(tm, "dispatch_attention_fn", capture)
    x = torch.randn(2, S, hidden).bfloat16()
    with torch.no_grad():
        attn(x, (cos, sin))
        q, k = attn.to_q(x), attn.to_k(x)
    got = m.qk_norm_rope(q, k, attn.norm_q.weight, attn.norm_k.weight, cos, sin, attn.norm_q.eps)
    assert_bits(got[0], seen["q"])
    assert_bits(got[1], seen["k"])


def test_vs_cpu_eager_within_one_ulp():
    """Unmodified CPU eager (its own sum order): equal but for rare 1-ulp differences of the normed value."""
    B, S, H, D, R = 1, 4, 8, 128, 96
    q, k, v, wq, wk, cos, sin = inputs(B, S, H, D, R, seed=7)
    got = m.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-5)
    ref = m.qk_norm_rope_ref(q, k, wq, wk, cos, sin, 1e-5)
    for a, b in zip(got, ref):
        assert (a != b).float().mean().item() <= 1e-3
    # the only source of difference: the norm's sum order, <= 1 ulp on a small fraction
    x = torch.randn(20000, D, generator=torch.Generator().manual_seed(1)).bfloat16()
    eager = F.rms_norm(x, (D,), wq, 1e-5).view(torch.int16).int()
    emu = m.emulate_cuda_rms_norm(x, wq, 1e-5).view(torch.int16).int()
    d = (eager - emu).abs()
    assert d.max().item() <= 1 and (d > 0).float().mean().item() <= 1e-4


@pytest.mark.slow  # torch.library.opcheck (~4 s)
def test_opcheck_fake_impl():
    q, k, v, wq, wk, cos, sin = inputs(1, 3, 4, 32, 24)
    torch.library.opcheck(torch.ops.h3plan.qk_norm_rope.default, (q, k, wq, wk, cos, sin, 1e-5, v, 2))
    torch.library.opcheck(torch.ops.h3plan.qk_norm_rope.default, (q, k, wq, wk, cos, sin, 1e-5, None, 1))


def _bad_cases():
    q, k, v, wq, wk, cos, sin = inputs(1, 3, 4, 32, 24)
    nc = torch.randn(1, 3, 4, 64).bfloat16()[..., ::2]  # last dim strided
    q30 = torch.randn(1, 3, 4 * 30).bfloat16()
    w30 = torch.randn(30).bfloat16()
    cos2, sin2 = torch.cat([cos, cos[:, :1]], -1), torch.cat([sin, sin[:, :1]], -1)
    return [
        ("dtype", dict(q=q.float(), k=k.float()), "dtype"),
        ("k dtype", dict(k=k.half()), "dtype"),
        ("last dim", dict(q=nc, k=nc), "contiguous"),
        ("H % U", dict(ulysses_degree=3), "ulysses_degree"),
        ("D % 4", dict(q=q30, k=q30, wq=w30, wk=w30, cos=cos[:, :24], sin=sin[:, :24]), "multiple of 4"),
        ("R odd", dict(cos=cos2, sin=sin2), "even"),
        ("R > D", dict(cos=torch.cat([cos, cos], -1)[:, :34], sin=torch.cat([sin, sin], -1)[:, :34]), "rotary dim"),
        ("cos rows", dict(cos=cos[:2], sin=sin[:2]), "rows"),
        ("cos dtype", dict(cos=cos.half(), sin=sin.half()), "dtype"),
        ("weight size", dict(wk=wk[:16]), "head_dim"),
        ("weight dtype", dict(wq=wq.float()), "dtype"),
        ("shape", dict(k=k[:, :2]), "shape"),
        ("v shape", dict(v=v[:, :2]), "shape"),
        ("eps", dict(eps=-1.0), "eps"),
        ("ndim", dict(q=q[0], k=k[0]), "(B, S"),
    ]


@pytest.mark.parametrize("name,over,msg", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_guards(name, over, msg):
    q, k, v, wq, wk, cos, sin = inputs(1, 3, 4, 32, 24)
    args = dict(q=q, k=k, wq=wq, wk=wk, cos=cos, sin=sin, eps=1e-5, v=None, ulysses_degree=1)
    args.update(over)
    reason = m.qk_norm_rope_check(**args)
    assert reason is not None and msg in reason, reason
    assert "\n" not in reason
    with pytest.raises(ValueError, match="."):
        m.qk_norm_rope(**args)
    base = dict(q=q, k=k, wq=wq, wk=wk, cos=cos, sin=sin, eps=1e-5)
    assert m.qk_norm_rope_check(**base) is None


@triton.jit
def _sumsq_probe(x_ptr, out_ptr, ROWS: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, REDUCTION: tl.constexpr):
    r = tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, D_PAD)[None, :]
    x = tl.load(x_ptr + r * D + c, mask=c < D, other=0.0)
    tl.store(out_ptr + tl.arange(0, ROWS), m._sumsq_rows(x, ROWS, D_PAD, D_PAD // 4, REDUCTION))


@pytest.mark.parametrize("D", [128, 96, 64, 32])
def test_sum_of_squares_order(D):
    """The fp32 sum of squares in torch's CUDA order, bit for bit, on rows whose magnitudes spread over
    2^-8..2^8 so that any other order rounds differently on some rows (checked: the plain tl.sum does)."""
    rows = 256
    g = torch.Generator().manual_seed(D)
    x = (torch.randn(rows, D, generator=g) * 2.0 ** torch.randint(-8, 9, (rows, D), generator=g)).bfloat16().float()
    D_PAD = max(4, 1 << (D - 1).bit_length())
    sq = (x * x).unflatten(-1, (D // 4, 4))
    s = torch.nn.functional.pad(((sq[..., 0] + sq[..., 1]) + sq[..., 2]) + sq[..., 3], (0, D_PAD // 4 - D // 4))
    while s.shape[-1] > 1:
        s = s[..., : s.shape[-1] // 2] + s[..., s.shape[-1] // 2 :]
    out = torch.empty(rows)
    _sumsq_probe[(1,)](x, out, ROWS=rows, D=D, D_PAD=D_PAD, REDUCTION=0)
    assert torch.equal(out.view(torch.int32), s[:, 0].view(torch.int32))
    _sumsq_probe[(1,)](x, out, ROWS=rows, D=D, D_PAD=D_PAD, REDUCTION=1)
    assert not torch.equal(out.view(torch.int32), s[:, 0].view(torch.int32))
