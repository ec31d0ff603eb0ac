"""NVFP4 producers (runtime/kernels/nvfp4_producers.py), Triton interpreter.

Contract: packed codes, swizzled scales, g (and the fold's h') bit-identical (rtol=0, atol=0) to the unfused
chain: the producer's bf16 output as eager computes it on CUDA (modulation: the CUDA-order emulation of
test_modulation.py; SwiGLU and the gated residual: CPU eager, exact in the interpreter), then `cast_nvfp4_ref`.
"""

import pytest
import torch

from h3plan.runtime.kernels import gated_residual as gr
from h3plan.runtime.kernels import modulation as mm
from h3plan.runtime.kernels import nvfp4 as n4
from h3plan.runtime.kernels import nvfp4_producers as npd
from h3plan.runtime.kernels import swiglu as sw

from test_modulation import emulate_exact, make, wide_range  # noqa: E402  (same folder: CUDA-order emulation)
from test_nvfp4 import assert_same  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on inf/nan inputs
EPS = 1e-5


def modulation_inputs(B, S, D, seed):
    x, w, scale, shift, index = make(B, S, D, seed=seed)
    x = x * wide_range((B, S, D), seed=1)  # spread magnitudes: the statistic's order matters
    scale, shift = scale.clone(), shift.clone()
    x[0, 0, :16] = 0.0  # a zero block in, with a zero table row a zero output block
    return x, w, scale, shift, index


# the slow cases repeat what the fast ones and the planned sweep layouts check, at more interpreter time
@pytest.mark.parametrize("B,S,D,static", [pytest.param(2, 3, 96, False, marks=pytest.mark.slow), (1, 3, 96, True),
                                          (1, 2, 1040, False), pytest.param(1, 2, 5376, True, marks=pytest.mark.slow)])
def test_modulation_exact(B, S, D, static):
    x, w, scale, shift, index = modulation_inputs(B, S, D, seed=D)
    g = torch.tensor([0.004]) if static else None
    got = npd.rmsnorm_modulate_nvfp4(x, w, scale, shift, index, EPS, "exact", g)
    y = emulate_exact(x, w, scale, shift, index, EPS)  # eager on CUDA, in CUDA order
    assert torch.equal(y.view(torch.int16), mm._launch(x, w, scale, shift, index, EPS, "exact").view(torch.int16))
    assert_same(got, n4.cast_nvfp4_ref(y, g))
    assert got[0].shape == (B, S, D // 2)


def test_modulation_fp32_mode():
    x, w, scale, shift, index = modulation_inputs(1, 3, 96, seed=7)
    got = npd.rmsnorm_modulate_nvfp4(x, w, scale, shift, index, EPS, "fp32")
    assert_same(got, n4.cast_nvfp4_ref(mm._launch(x, w, scale, shift, index, EPS, "fp32")))


@pytest.mark.parametrize("D,static", [pytest.param(96, False, marks=pytest.mark.slow), (96, True),
                                      pytest.param(1040, False, marks=pytest.mark.slow)])
def test_residual_fold(D, static):
    B, S = 2, 3
    x, w, scale, shift, index = modulation_inputs(B, S, D, seed=D + 3)
    gen = torch.Generator().manual_seed(D)
    y = (torch.randn(B, S, D, generator=gen) * 4).bfloat16()
    gate = (torch.randn(7, 3 * D, generator=gen)).bfloat16()[:, D:2 * D]  # a row-strided view, as chunk() gives
    g = torch.tensor([0.01]) if static else None
    got = npd.gated_residual_modulate_nvfp4(x, gate, y, w, scale, shift, index, EPS, "exact", g)
    h2 = gr.gated_residual_ref(x, gate, index, y)
    assert torch.equal(got[0].view(torch.int16), h2.view(torch.int16))
    assert_same(got[1:], n4.cast_nvfp4_ref(emulate_exact(h2, w, scale, shift, index, EPS), g))


@pytest.mark.parametrize("shape,static", [((2, 3, 64), False), ((2, 3, 64), True), ((3, 2080), False),
                                          pytest.param((1, 2 * 14336), False, marks=pytest.mark.slow)])
def test_swiglu(shape, static):
    gen = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(shape, generator=gen) * 3).bfloat16()
    F = shape[-1] // 2
    x.view(-1, 2 * F)[0, :16] = 0.0
    g = torch.tensor([0.02]) if static else None
    got = npd.swiglu_nvfp4(x, g)
    assert torch.equal(sw.swiglu_ref(x).view(torch.int16), sw._launch(x).view(torch.int16))
    assert_same(got, npd.swiglu_nvfp4_ref(x, g))


def test_swiglu_fp16():
    x = (torch.randn(3, 2 * 96, generator=torch.Generator().manual_seed(2)) * 3).half()
    assert_same(npd.swiglu_nvfp4(x), n4.cast_nvfp4_ref(sw._launch(x)))  # the kernel's own fp16 values


def test_references_are_the_unfused_chain():
    x, w, scale, shift, index = make(1, 3, 64, seed=9)
    y = mm.rmsnorm_modulate_ref(x, w, scale, shift, index, EPS, "exact")
    assert_same(npd.rmsnorm_modulate_nvfp4_ref(x, w, scale, shift, index, EPS), n4.cast_nvfp4_ref(y))


def test_guards():
    x, w, scale, shift, index = make(1, 4, 96)
    assert npd.rmsnorm_modulate_nvfp4_check(x, w, scale, shift, index, EPS) is None
    assert "multiple of 16" in npd.rmsnorm_modulate_nvfp4_check(x[..., :88].contiguous(), None, scale[:, :88],
                                                                shift[:, :88], index, EPS)
    assert "global_scale" in npd.rmsnorm_modulate_nvfp4_check(x, w, scale, shift, index, EPS, "exact",
                                                              torch.ones(()).double())
    assert "not even" in npd.swiglu_nvfp4_check(torch.randn(2, 7).bfloat16())
    assert "multiple of 16" in npd.swiglu_nvfp4_check(torch.randn(2, 40).bfloat16())
    assert "y shape" in npd.gated_residual_modulate_nvfp4_check(x, scale, x[:, :2], w, scale, shift, index, EPS)
    # the kernel's row index is 32-bit: 2^31 rows are refused in one line (meta tensors: no memory)
    big = torch.empty((1, 2 ** 31, 16), device="meta", dtype=torch.bfloat16)
    t = torch.empty((2, 16), device="meta", dtype=torch.bfloat16)
    wm = torch.empty(16, device="meta", dtype=torch.bfloat16)
    idx = torch.empty(2 ** 31, device="meta", dtype=torch.int64)
    assert "2147483648 rows" in npd.rmsnorm_modulate_nvfp4_check(big, wm, t, t, idx, EPS)
    assert npd.rmsnorm_modulate_nvfp4_check(big[:, :-1], wm, t, t, idx[:-1], EPS) is None
    with pytest.raises(ValueError, match="not even"):
        npd.swiglu_nvfp4(torch.randn(2, 7).bfloat16())


@pytest.mark.slow  # torch.library.opcheck (~3 s)
def test_opcheck_ops():
    x, w, scale, shift, index = make(1, 3, 64, seed=6)
    torch.library.opcheck(torch.ops.h3plan.rmsnorm_modulate_nvfp4.default,
                          (x, w, scale, shift, index, EPS, "exact", None))
    torch.library.opcheck(torch.ops.h3plan.gated_residual_modulate_nvfp4.default,
                          (x, scale, x, w, scale, shift, index, EPS, "exact", torch.tensor([0.5])))
    torch.library.opcheck(torch.ops.h3plan.swiglu_nvfp4.default, (torch.randn(2, 64).bfloat16(), None))


@pytest.mark.slow  # three producers on the element-pair path, ~10 s interpreted
def test_element_pair_fallback_and_masked_tail():
    """Tables whose rows start at odd elements (no int32 view: every tensor read as elements, KIND 2) and a width
    ending in a masked 64-column group (80 = 64 + 16), for the modulation, the fold and SwiGLU."""
    B, S, D = 1, 5, 80
    x, w, _, _, index = make(B, S, D, seed=4)
    gen = torch.Generator().manual_seed(5)
    table = (torch.randn(7, 3 * D + 1, generator=gen) * 0.5).bfloat16()
    shift, scale, gate = table[:, 1:D + 1], table[:, D + 1:2 * D + 1], table[:, 2 * D + 1:]
    assert npd.pair_args(x, scale)[-1] == 2
    got = npd.rmsnorm_modulate_nvfp4(x, w, scale, shift, index, EPS, "exact", torch.tensor([0.003]))
    assert_same(got, n4.cast_nvfp4_ref(emulate_exact(x, w, scale, shift, index, EPS), torch.tensor([0.003])))
    y = (torch.randn(B, S, D, generator=gen) * 4).bfloat16()
    got = npd.gated_residual_modulate_nvfp4(x, gate, y, w, scale, shift, index, EPS, "exact")
    h2 = gr.gated_residual_ref(x, gate, index, y)
    assert torch.equal(got[0].view(torch.int16), h2.view(torch.int16))
    assert_same(got[1:], n4.cast_nvfp4_ref(emulate_exact(h2, w, scale, shift, index, EPS)))
    xs = (torch.randn(3, 2 * D, generator=gen) * 3).bfloat16()
    assert_same(npd.swiglu_nvfp4(xs), npd.swiglu_nvfp4_ref(xs))


def _sweep_cases():
    """(kind, (rows, warps, chunk)) of every SWEEP layout, one per (rows, chunk): warps do not change the
    interpreter's arithmetic (the H200 probe checks each warps count on the device). The planned layout (TUNED at
    H3 width) runs in the fast lane, the others, and the planned one without the next-chunk prefetch, in the slow
    one."""
    widths = {"modulation": 5376, "fold": 5376, "swiglu": 14336, "cast": 7168}
    for kind in widths:
        seen = set()
        for cfg in n4.SWEEP[kind]:
            if (cfg[0], cfg[2]) not in seen:
                seen.add((cfg[0], cfg[2]))
                plan = n4.launch_config(kind, widths[kind])
                planned = (cfg[0], cfg[2]) == (plan[0], plan[2])
                yield pytest.param(kind, cfg, id=f"{kind}-{n4.config_name(cfg)}",
                                   marks=() if planned else pytest.mark.slow)
                if planned:  # the full-chunk loop without the next-chunk prefetch (the probe's suffix n)
                    yield pytest.param(kind, (*cfg, False), id=f"{kind}-{n4.config_name((*cfg, False))}",
                                       marks=pytest.mark.slow)


@pytest.mark.parametrize("kind,cfg", list(_sweep_cases()))
def test_every_sweep_layout_is_bit_exact(kind, cfg):
    """Every launch layout the H200 probe may pick (runtime/kernels/nvfp4.py SWEEP: rows a program, chunk), static and
    dynamic, against the unfused chain: a width of two whole chunks and a masked 80-column tail, and one row more
    than a program holds (the last program's clamped lanes)."""
    rows, _warps, chunk = cfg[:3]
    n = 2 * (chunk or 128) + 80
    gen = torch.Generator().manual_seed(rows * 7 + chunk)
    with n4.tuned(kind, n, cfg):
        for g in (torch.tensor([0.004]), None):
            if kind == "cast":
                x = (torch.randn(rows + 1, n, generator=gen) * 3).bfloat16()
                x[0, :16] = 0.0
                assert_same(n4.cast_nvfp4(x, g), n4.cast_nvfp4_ref(x, g))
            elif kind == "swiglu":
                x = (torch.randn(rows + 1, 2 * n, generator=gen) * 3).bfloat16()
                assert_same(npd.swiglu_nvfp4(x, g), npd.swiglu_nvfp4_ref(x, g))
            else:
                x, w, scale, shift, index = modulation_inputs(1, rows + 1, n, seed=n + rows)
                if kind == "modulation":
                    got = npd.rmsnorm_modulate_nvfp4(x, w, scale, shift, index, EPS, "exact", g)
                    assert_same(got, n4.cast_nvfp4_ref(emulate_exact(x, w, scale, shift, index, EPS), g))
                    continue
                y = (torch.randn(1, rows + 1, n, generator=gen) * 4).bfloat16()
                gate = torch.randn(7, 3 * n, generator=gen).bfloat16()[:, n:2 * n]
                got = npd.gated_residual_modulate_nvfp4(x, gate, y, w, scale, shift, index, EPS, "exact", g)
                h2 = gr.gated_residual_ref(x, gate, index, y)
                assert torch.equal(got[0].view(torch.int16), h2.view(torch.int16))
                assert_same(got[1:], n4.cast_nvfp4_ref(emulate_exact(h2, w, scale, shift, index, EPS), g))
    assert n4.launch_config(kind, n) == (1, 4, 0, True)  # the planned table is back


def test_sweep_layouts_give_every_thread_a_half_block():
    """No SWEEP candidate (bar the one-row layout) has fewer half blocks (16 bytes of input, what a thread loads) a
    tile than threads (they would repeat work)."""
    for kind, layouts in n4.SWEEP.items():
        assert len(set(layouts)) == len(layouts), kind
        for rows, warps, chunk in layouts:
            assert (rows == 1 and chunk == 0) or rows * chunk // 8 >= 32 * warps, (kind, rows, warps, chunk)
        assert all(n4.launch_config(k, n)[:3] in n4.SWEEP[k] for k, n in n4.TUNED)


def test_row_plan_covers_the_row():
    """Chunks whole inside the row, then tails covering it to the next 64 columns; bad chunks refused."""
    for n in (16, 80, 96, 1040, 5376, 7168, 14336):
        for chunk in (0, 64, 256, 512, 1024, 8192):
            p = n4.row_plan(n, chunk)
            assert p["NFULL"] * p["CH"] <= n < p["NFULL"] * p["CH"] + p["T0"] + p["T1"] + p["T2"] + 64
            assert p["NFULL"] * p["CH"] + p["T0"] + p["T1"] + p["T2"] >= n
    assert n4.row_plan(5376, 0) == dict(CH=4096, NFULL=1, T0=1024, T1=256, T2=0)  # the one-row layout
    assert n4.row_plan(5376, 256) == dict(CH=256, NFULL=21, T0=0, T1=0, T2=0)
    with pytest.raises(ValueError, match="power of two"):
        n4.row_plan(96, 96)
