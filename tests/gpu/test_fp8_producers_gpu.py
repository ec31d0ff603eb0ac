"""H200 suite for the FP8 producers (runtime/kernels/fp8_producers.py), the rowwise FP8 GEMM
(runtime/quant/fp8_rowwise.py) and the lean q/k/v FP8 cast (runtime/kernels/qk_fp8_lean.py).

Contracts: e4m3 codes and fp32 descales bit-identical (rtol=0, atol=0) to the torch reference built on the
block's own eager bf16 output at H3 width (hidden 5376, ffn 14336, attention output 7168; S = 19,000),
NaN codes included (compared as NaN); one input over 2^31 elements (int64 offsets); the rowwise
`torch._scaled_mm` against a float64 GEMM within |out - ref| <= 2^-8 (|ref| + e) + e, e = gamma_{K+2}
(|a| @ |w|^T + |b|) (fp32 accumulation, one bf16 rounding). Each test prints one line; the last one
prints every producer's time against the current path (bf16 producer + amax pass + cast pass) and as a
fraction of copy bandwidth (benchmarks/probes/fp8_producers.py is the full benchmark).

    python -m pytest tests/gpu/test_fp8_producers_gpu.py -m gpu -q -s
"""

import pytest
import torch

from h3plan.runtime.kernels import fp8 as f8
from h3plan.runtime.kernels import fp8_producers as fp
from h3plan.runtime.kernels import modulation as mm
from h3plan.runtime.kernels import qk_fp8_lean as lean
from h3plan.runtime.kernels import qk_norm_rope as qk
from h3plan.runtime.kernels import swiglu as sw

from test_kernels_block_gpu import EPS, FFN, HIDDEN, S, activations, block, index_for  # noqa: F401  (fixture)

pytestmark = pytest.mark.gpu

INNER = 7168  # 56 heads x 128: the attention output, to_out.0's input


def ndiff_rows(got, ref) -> int:
    """Codes that differ (NaN compared as NaN) + descales that differ, bitwise."""
    (c, d), (cr, dr) = got, ref
    assert c.shape == cr.shape and d.shape == dr.shape and c.dtype == cr.dtype == torch.float8_e4m3fn
    nan = cr.float().isnan()
    n = int((c.float().isnan() != nan).sum()) + int((c.view(torch.uint8) != cr.view(torch.uint8))[~nan].sum())
    dn = dr.isnan()
    return n + int((d.isnan() != dn).sum()) + int((d.view(torch.int32) != dr.view(torch.int32))[~dn].sum())


def special_rows(x):
    """Row 0 zero, row 1 one huge value among small ones, row 2 a NaN, row 3 an inf, row 4 tiny (448 / amax
    overflows in bf16)."""
    x[..., 0, :] = 0.0
    x[..., 1, :] = 1e-3
    x[..., 1, 17] = 3e4
    x[..., 2, 5] = float("nan")
    x[..., 3, 9] = float("inf")
    x[..., 4, :] = 1e-38
    return x


@torch.no_grad()
def test_modulation_fp8_vs_block(block):
    b, (shift_msa, scale_msa, _, shift_mlp, scale_mlp, _) = block
    x, idx = activations((1, S, HIDDEN), 1), index_for(S)
    x[0, 5, 100] = 3e4  # a row with one huge value
    lines, bad = [], 0
    for name, norm, shift, scale in (("norm1", b.norm1, shift_msa, scale_msa),
                                     ("norm2", b.norm2, shift_mlp, scale_mlp)):
        eager = norm(x) * (1.0 + scale.index_select(0, idx)) + shift.index_select(0, idx)  # the block's lines
        for act in (None, 37.0):
            n = ndiff_rows(fp.rmsnorm_modulate_fp8(x, norm.weight, scale, shift, idx, norm.eps, "exact", act),
                           fp.rows_to_e4m3_ref(eager, act))
            lines.append(f"{name} {'row' if act is None else 'static'}: {n}")
            bad += n
        f32 = mm.rmsnorm_modulate(x, norm.weight, scale, shift, idx, norm.eps, mode="fp32")
        n = ndiff_rows(fp.rmsnorm_modulate_fp8(x, norm.weight, scale, shift, idx, norm.eps, "fp32"),
                       fp.rows_to_e4m3_ref(f32))
        lines.append(f"{name} fp32 mode: {n}")
        bad += n
    print(f"\n[gpu] rmsnorm_modulate_fp8 1x{S}x{HIDDEN} codes+descales differing: " + "; ".join(lines))
    assert bad == 0


@torch.no_grad()
def test_swiglu_fp8_vs_eager():
    x = special_rows(activations((1, S, 2 * FFN), 2))
    lines, bad = [], 0
    for act in (None, 0.5):
        n = ndiff_rows(fp.swiglu_fp8(x, act), fp.rows_to_e4m3_ref(sw.swiglu_ref(x), act))
        lines.append(f"{'row' if act is None else 'static'}: {n}")
        bad += n
    print(f"\n[gpu] swiglu_fp8 1x{S}x{2 * FFN} codes+descales differing: " + "; ".join(lines))
    assert bad == 0


@torch.no_grad()
def test_cast_rows_fp8_every_midpoint_and_real_size():
    grid = torch.arange(256, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn).float()
    grid = grid[grid.isfinite()].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    inf = torch.tensor(float("inf"), device="cuda")
    row = torch.cat([grid, mids, mids.nextafter(inf), mids.nextafter(-inf),
                     torch.tensor([0.0, -0.0, 2.0 ** -10, -(2.0 ** -10)], device="cuda")])
    row = torch.cat([row, torch.zeros(INNER - row.numel(), device="cuda")])  # amax 448: scale exactly 1
    x = special_rows(activations((1, S, INNER), 3))
    x[0, 10] = row.bfloat16()
    bad = ndiff_rows(fp.cast_rows_fp8(x), fp.cast_rows_fp8_ref(x))
    bad += ndiff_rows(fp.cast_rows_fp8(x, 1e4), fp.cast_rows_fp8_ref(x, 1e4))  # saturates
    xh = x.half()
    bad += ndiff_rows(fp.cast_rows_fp8(xh), fp.cast_rows_fp8_ref(xh))
    print(f"\n[gpu] cast_rows_fp8 1x{S}x{INNER} (+ every e4m3 midpoint, fp16, static): {bad} differ")
    assert bad == 0


@torch.no_grad()
def test_cast_rows_over_2_31_elements():
    rows = 300_000  # x 7168 = 2.15e9 elements
    x = torch.empty(rows, INNER, device="cuda", dtype=torch.bfloat16).normal_()
    x[-1, -1] = 500.0
    c, d = fp.cast_rows_fp8(x)
    bad = ndiff_rows((c[-2000:], d[-2000:]), fp.cast_rows_fp8_ref(x[-2000:]))  # rows are independent
    bad += ndiff_rows((c[:2000], d[:2000]), fp.cast_rows_fp8_ref(x[:2000]))
    print(f"\n[gpu] cast_rows_fp8 {rows}x{INNER}: {bad} differ in the first and last 2000 rows")
    assert bad == 0


@torch.no_grad()
def test_rowwise_gemm_within_bound():
    from h3plan.runtime.quant.fp8 import FP8Linear
    from h3plan.runtime.quant.fp8_rowwise import fp8_linear_codes
    from h3plan.runtime.counters import counters, reset_counters

    M, K, N = 4096, INNER, HIDDEN  # to_out.0
    g = torch.Generator(device="cuda").manual_seed(0)
    lin = torch.nn.Linear(K, N, device="cuda").bfloat16()
    lin.weight.copy_(torch.randn(N, K, device="cuda", generator=g) / K ** 0.5)
    lin8 = FP8Linear.from_linear(lin)
    x = activations((M, K), 5)
    codes, desc = fp.cast_rows_fp8(x)
    reset_counters()
    out = fp8_linear_codes(codes, desc, lin8)
    assert counters() == {"gemm_quant.fused": 1}
    a = codes.double() * desc.double()
    w = lin8.weight.double() * lin8.weight_scale.double()[:, None]
    ref = a @ w.t() + lin8.bias.double()
    n = K + 2
    gamma = n * 2.0 ** -24 / (1 - n * 2.0 ** -24)
    e = gamma * (a.abs() @ w.abs().t() + lin8.bias.double().abs())
    ratio = ((out.double() - ref).abs() / (2.0 ** -8 * (ref.abs() + e) + e)).max().item()
    print(f"\n[gpu] rowwise _scaled_mm {M}x{K}x{N}: max |err| / bound = {ratio:.3f}")
    assert ratio <= 1.0


@torch.no_grad()
def test_qk_fp8_lean_vs_ref():
    import diffusers.models.transformers.transformer_minimax_h3 as tm

    from test_kernels_attention_gpu import D, H, _rope, _weights

    valid = S - 37
    q, k, v = (activations((1, S, H * D), 10 + i) for i in range(3))
    q[:, valid:, 5::D] = 1e4  # padding rows: must not move the scales
    v[:, valid:] = 3e4
    wq, wk = _weights(4)
    cos, sin = _rope(tm, S)
    lines, bad = [], 0
    for label, kw in (("dynamic", dict(valid_len=valid)), ("dynamic U=4", dict(valid_len=valid, ulysses_degree=4)),
                      ("static", dict(scales=[60.0, 40.0, 0.01]))):
        got = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, **kw)
        ref = qk.qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, 1e-5, **kw)
        n = sum(int((a.view(torch.uint8) != b.view(torch.uint8)).sum()) for a, b in zip(got[:-1], ref[:-1]))
        n += int(not torch.equal(got[-1], ref[-1]))
        lines.append(f"{label}: {n}")
        bad += n
    print(f"\n[gpu] qk_norm_rope_fp8_lean 1x{S}x{H}x{D} differing: " + "; ".join(lines))
    assert bad == 0


def _ms(fn, reps=20):
    import statistics

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    ev = []
    for _ in range(reps):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        ev.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


@torch.no_grad()
def test_bandwidth_report(block):
    """Times only (no assertion): fused producer vs bf16 producer + amax pass + cast pass, fraction of copy."""
    b, (shift, scale, *_rest) = block
    src = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = 2 * src.numel() / (_ms(lambda: dst.copy_(src)) * 1e-3) / 1e12
    del src, dst
    x, idx = activations((1, S, HIDDEN), 1), index_for(S)
    h = activations((1, S, 2 * FFN), 2)
    o = activations((1, S, INNER), 3)
    w, eps = b.norm1.weight, b.norm1.eps

    def current(y_fn):
        def run():
            y = y_fn()
            return f8.quantize(y.view(-1, y.shape[-1]))
        return run

    cases = [
        ("rmsnorm_modulate_fp8", S * HIDDEN * 3, lambda: fp.rmsnorm_modulate_fp8(x, w, scale, shift, idx, eps),
         current(lambda: mm.rmsnorm_modulate(x, w, scale, shift, idx, eps))),
        ("swiglu_fp8", S * FFN * 5, lambda: fp.swiglu_fp8(h), current(lambda: sw.swiglu(h))),
        ("cast_rows_fp8", S * INNER * 3, lambda: fp.cast_rows_fp8(o), current(lambda: o)),
    ]
    lines = [f"copy {copy:.3f} TB/s"]
    for name, nbytes, fused, cur in cases:
        tf, tc = _ms(fused), _ms(cur)
        lines.append(f"{name}: {tf:.4f} ms ({nbytes / tf / 1e9 / copy:.2f} of copy) vs current {tc:.4f} ms "
                     f"({tc / tf:.2f}x)")
    print("\n[gpu] fp8 producers S=19000: " + "; ".join(lines))
