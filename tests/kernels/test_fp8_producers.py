"""FP8 producers (runtime/kernels/fp8_producers.py) and the rowwise FP8 GEMM (runtime/quant/fp8_rowwise.py), Triton
interpreter.

Numeric contracts:
- codes and descales: bit-identical (rtol=0, atol=0) to `rows_to_e4m3_ref` applied to the producer's bf16
  output computed exactly as eager does on CUDA (modulation: the CUDA-order emulation of test_modulation.py;
  SwiGLU: CPU eager, exact in the interpreter for bf16; the cast: x itself). The interpreter's fp8 cast does
  not give NaN codes, so elements whose reference code is NaN are left out here (tests/gpu checks them).
- the emulated rowwise GEMM against a float64 reference: |out - ref| <= u_bf16 (|ref| + e) + e with
  u_bf16 = 2^-8 (the output's one rounding to 8 significant bits) and e = gamma_{K+2} * (|a| @ |w|^T + |bias|), gamma_n
  = n 2^-24 / (1 - n 2^-24) (fp32 dot product of K terms, each product's operands dequantised with one fp32
  rounding, plus the bias add).
"""

import pytest
import torch

from h3plan.errors import UsageError
from h3plan.runtime.kernels import fp8_producers as fp
from h3plan.runtime.kernels import modulation as mm
from h3plan.runtime.kernels import swiglu as sw
from h3plan.runtime.quant import fp8 as q8
from h3plan.runtime.quant import fp8_rowwise as qr
from h3plan.runtime.counters import counters, fallback_reasons, reset_counters

from test_modulation import emulate_exact, make, wide_range  # noqa: E402  (same folder: CUDA-order emulation)
from scripts import load_script

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on inf/nan inputs

E4M3 = torch.float8_e4m3fn
EPS = 1e-5


def assert_rows_equal(got, ref):
    (c, d), (cr, dr) = got, ref
    assert c.dtype == E4M3 and c.shape == cr.shape and d.dtype == torch.float32 and d.shape == dr.shape
    keep = ~cr.float().isnan()
    a, b = c.view(torch.uint8)[keep], cr.view(torch.uint8)[keep]
    assert torch.equal(a, b), f"{(a != b).sum().item()} of {b.numel()} codes differ"
    assert torch.equal(d.view(torch.int32), dr.view(torch.int32)), (d.flatten()[:8], dr.flatten()[:8])


def test_chunks():
    assert fp.chunks(5376) == (4096, 1024, 256, 0)
    assert fp.chunks(14336) == (8192, 4096, 2048, 0)
    assert fp.chunks(7168) == (4096, 2048, 1024, 0)
    assert fp.chunks(1000) == (512, 256, 128, 128)  # 1000 = 512 + 256 + 128 + 104: the last one masked
    assert fp.chunks(5376, 1) == (8192, 0, 0, 0)
    assert fp.chunks(7) == (4, 2, 1, 0)


# ---------------------------------------------------------------------------------------------- modulation
def special_rows(x, scale, shift, index):
    """Row 0 all zero with zero table rows (amax 0 -> scale 1), row 1 one huge value among tiny ones."""
    x[0, 0] = 0.0
    scale[index[0]] = 0.0
    shift[index[0]] = 0.0
    x[0, 1] = 1e-3
    x[0, 1, 7] = 3e4


@pytest.mark.parametrize("B,S,D,act_scale", [(2, 5, 96, None), (2, 5, 96, 2.5), (1, 3, 100, None), (1, 2, 1028, 2.5),
                                              (1, 2, 5376, None)])
def test_modulation_exact(B, S, D, act_scale):
    x, w, scale, shift, index = make(B, S, D, seed=D)
    x = x * wide_range((B, S, D), seed=1)  # spread magnitudes: the statistic's order matters
    index[0] = 0
    index[1] = 1
    scale, shift = scale.clone(), shift.clone()
    special_rows(x, scale, shift, index)
    got = fp.rmsnorm_modulate_fp8(x, w, scale, shift, index, EPS, "exact", act_scale)
    y = emulate_exact(x, w, scale, shift, index, EPS)  # eager on CUDA, in CUDA order
    assert torch.equal(y.view(torch.int16), mm._launch(x, w, scale, shift, index, EPS, "exact").view(torch.int16))
    assert_rows_equal(got, fp.rows_to_e4m3_ref(y, act_scale))
    if act_scale is None:
        assert got[1][0, 0].item() == 1.0  # the zero row
        assert got[0][0, 1].float().abs().max().item() == 448.0  # the huge value sets its row's scale


@pytest.mark.parametrize("D", [94, 1028])
def test_modulation_fp32_mode(D):
    x, w, scale, shift, index = make(1, 3, D, seed=D + 1)
    got = fp.rmsnorm_modulate_fp8(x, w, scale, shift, index, EPS, "fp32")
    assert_rows_equal(got, fp.rows_to_e4m3_ref(mm._launch(x, w, scale, shift, index, EPS, "fp32")))


@pytest.mark.parametrize("config", [(1, 4, None), (2, 2, 64)])
def test_modulation_configs(config):
    x, w, scale, shift, index = make(1, 2, 1028, seed=4)
    got = fp._launch_modulate(x, w, scale, shift, index, EPS, "exact", None, config=config)
    assert_rows_equal(got, fp.rows_to_e4m3_ref(emulate_exact(x, w, scale, shift, index, EPS)))


# ---------------------------------------------------------------------------------------------- swiglu
@pytest.mark.parametrize("shape,act_scale", [((2, 3, 96), None), ((2, 3, 96), 0.75), ((5, 200), None),
                                             ((3, 2000), 0.75),
                                             ((3, 2000), None), ((1, 2 * 14336), None)])
def test_swiglu(shape, act_scale):
    g = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(shape, generator=g) * 3).bfloat16()
    F = shape[-1] // 2
    x.view(-1, 2 * F)[0] = 0.0  # a zero row
    if x.numel() // (2 * F) > 1:
        x.view(-1, 2 * F)[1, :F] = 1e-2
        x.view(-1, 2 * F)[1, 3] = 2e4  # one huge value
    got = fp.swiglu_fp8(x, act_scale)
    assert torch.equal(sw.swiglu_ref(x).view(torch.int16), sw._launch(x).view(torch.int16))
    assert_rows_equal(got, fp.swiglu_fp8_ref(x, act_scale))
    if act_scale is None:
        assert got[1].view(-1)[0].item() == 1.0


def test_swiglu_fp16_and_configs():
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 2 * 100, generator=g) * 3).half()
    assert_rows_equal(fp.swiglu_fp8(x), fp.rows_to_e4m3_ref(sw._launch(x)))  # the kernel's own fp16 values
    x = x.bfloat16()
    for config in [(1, 4, None), (4, 8, 128), (2, 2, None)]:
        assert_rows_equal(fp._launch_swiglu(x, None, config=config), fp.swiglu_fp8_ref(x))


# ---------------------------------------------------------------------------------------------- cast
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cast_rows_special_values(dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(8, 100, generator=g) * 5).to(dtype)
    x[0] = 0.0
    x[1] = -0.0
    x[2, 5] = float("nan")  # amax NaN -> scale 1, as torch
    x[3, 9] = float("inf")  # amax inf -> scale 0, descale inf
    x[4] = 1e-38 if dtype == torch.bfloat16 else 1e-7  # tiny amax: 448 / amax overflows for bf16
    x[5, :] = 1e-3
    x[5, 50] = 6e4 if dtype == torch.float16 else 3e38
    x[6, :3] = torch.tensor([448.0, -448.0, 2.0 ** -10])
    got, ref = fp.cast_rows_fp8(x), fp.cast_rows_fp8_ref(x)
    assert_rows_equal(got, ref)
    assert got[1][2].item() == 1.0 and got[1][3].item() == float("inf") and got[1][0].item() == 1.0


@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 96), (1, 4, 7168)])
@pytest.mark.parametrize("act_scale", [None, 100.0, 3e4])  # 3e4 saturates at +-448
def test_cast_rows(shape, act_scale):
    g = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(shape, generator=g) * torch.exp2(torch.randint(-6, 7, shape[:-1] + (1,), generator=g))).bfloat16()
    got = fp.cast_rows_fp8(x, act_scale)
    assert_rows_equal(got, fp.cast_rows_fp8_ref(x, act_scale))
    if act_scale == 3e4:
        assert (got[0].view(torch.uint8) & 0x7F == 0x7E).any() and not (got[0].view(torch.uint8) & 0x7F == 0x7F).any()


def test_row_scales_do_not_depend_on_other_rows():
    """Ulysses: a rank quantising its rows alone gets the codes the whole sequence gets."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 9, 96, generator=g).bfloat16()
    whole = fp.cast_rows_fp8(x)
    for a, b in ((0, 5), (5, 9)):
        part = fp.cast_rows_fp8(x[:, a:b].contiguous())
        assert torch.equal(part[0].view(torch.uint8), whole[0][:, a:b].view(torch.uint8))
        assert torch.equal(part[1], whole[1][:, a:b])


def test_empty_rows():
    x = torch.empty(0, 96, dtype=torch.bfloat16)
    c, d = fp.cast_rows_fp8(x)
    assert c.shape == (0, 96) and d.shape == (0, 1)
    c, d = fp.swiglu_fp8(torch.empty(1, 0, 96, dtype=torch.bfloat16))
    assert c.shape == (1, 0, 48) and d.shape == (1, 0, 1)


# ---------------------------------------------------------------------------------------------- guards
@pytest.mark.parametrize("bad,msg", [(0.0, "> 0"), (-1.0, "> 0"), (float("nan"), "finite"), (float("inf"), "finite"),
                                     (1e39, "finite"), (10 ** 400, "finite"), (1e-40, "reciprocal"), (True, "number"),
                                     ("2", "number")])
def test_static_scale_refused(bad, msg):
    x = torch.randn(2, 96).bfloat16()
    reason = fp.cast_rows_fp8_check(x, bad)
    assert reason is not None and msg in reason and "\n" not in reason
    assert msg in fp.swiglu_fp8_check(x, bad)
    with pytest.raises(ValueError, match="act_scale"):
        fp.cast_rows_fp8(x, bad)


def test_guards():
    x, w, scale, shift, index = make(1, 4, 96)
    assert fp.rmsnorm_modulate_fp8_check(x, w, scale, shift, index, EPS) is None
    assert "D % 4" in fp.rmsnorm_modulate_fp8_check(x[..., :94].contiguous(), None, scale[:, :94], shift[:, :94],
                                                    index, EPS)
    assert "x dtype" in fp.swiglu_fp8_check(torch.randn(2, 8))
    assert "not even" in fp.swiglu_fp8_check(torch.randn(2, 7).bfloat16())
    assert "not contiguous" in fp.cast_rows_fp8_check(torch.randn(8, 4).bfloat16().t())
    assert "row length" in fp.cast_rows_fp8_check(torch.empty(1, fp.MAX_WIDTH + 1, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="not even"):
        fp.swiglu_fp8(torch.randn(2, 7).bfloat16())


@pytest.mark.slow  # torch.library.opcheck
def test_opcheck_ops():
    x, w, scale, shift, index = make(1, 3, 96, seed=6)
    torch.library.opcheck(torch.ops.h3plan.rmsnorm_modulate_fp8.default,
                          (x, w, scale, shift, index, EPS, "exact", None))
    h = torch.randn(1, 3, 64).bfloat16()
    torch.library.opcheck(torch.ops.h3plan.swiglu_fp8.default, (h, 2.0))
    torch.library.opcheck(torch.ops.h3plan.cast_rows_fp8.default, (h, None))


def test_custom_ops_trace():
    from torch.fx.experimental.proxy_tensor import make_fx

    h = torch.randn(1, 3, 64).bfloat16()
    gm = make_fx(lambda t: fp.swiglu_fp8(t)[0].float() * fp.cast_rows_fp8(t)[1])(h)
    targets = [n.target for n in gm.graph.nodes]
    assert torch.ops.h3plan.swiglu_fp8.default in targets and torch.ops.h3plan.cast_rows_fp8.default in targets


# ---------------------------------------------------------------------------------------------- rowwise GEMM
def linear(K, N, seed, scaling="channel", bias=True):
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(K, N, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=g) / K ** 0.5
                         * torch.exp2(torch.randint(-3, 4, (N, 1), generator=g)))
        if bias:
            lin.bias.copy_(torch.randn(N, generator=g))
    return q8.FP8Linear.from_linear(lin.bfloat16(), scaling=scaling)


@pytest.mark.parametrize("scaling", ["channel", "tensor"])
def test_rowwise_gemm_emulation_vs_float64(scaling):
    K, N = 96, 48
    lin = linear(K, N, seed=7, scaling=scaling)
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(2, 5, K, generator=g) * torch.exp2(torch.randint(-8, 9, (2, 5, 1), generator=g))).bfloat16()
    codes, desc = fp.cast_rows_fp8(x)
    reset_counters()
    out = qr.fp8_linear_codes(codes, desc, lin)
    assert out.shape == (2, 5, N) and out.dtype == torch.bfloat16
    assert counters() == {"gemm_quant.fallback": 1}
    assert "needs CUDA" in next(iter(fallback_reasons()["gemm_quant"]))
    a = codes.double() * desc.double()
    ws = lin.weight_scale.double()
    w = lin.weight.double() * (ws[:, None] if ws.dim() else ws)
    ref = a @ w.t() + lin.bias.double()
    n = K + 2
    gamma = n * 2.0 ** -24 / (1 - n * 2.0 ** -24)
    e = gamma * (a.abs() @ w.abs().t() + lin.bias.double().abs())
    bound = 2.0 ** -8 * (ref.abs() + e) + e
    err = (out.double() - ref).abs()
    assert (err <= bound).all(), (err / bound).max()
    # the rows really are scaled apart: per-tensor codes of the same x lose the small rows' mantissa
    pt_codes, pt_desc = q8.quantize_activation(x)
    pt = (pt_codes.double() * pt_desc.double()).view(2, 5, K)

    def worst_row(d):
        return ((d - x.double()).norm(dim=-1) / x.double().norm(dim=-1)).max().item()

    assert worst_row(a) <= 2.0 ** -4 < worst_row(pt)


def test_fp8_linear_rows_and_module():
    lin = linear(64, 32, seed=9)
    x = torch.randn(3, 64).bfloat16()
    codes, desc = fp.cast_rows_fp8(x)
    want = qr.emulate_rows(codes, desc, lin)
    reset_counters()
    assert torch.equal(qr.fp8_linear_rows(x, lin).view(torch.int16), want.view(torch.int16))
    row = qr.FP8RowLinear.from_fp8(lin)
    assert row.weight.data_ptr() == lin.weight.data_ptr() and "per row" in repr(row)  # shared, not copied
    assert torch.equal(row(x).view(torch.int16), want.view(torch.int16))
    assert counters() == {"fp8_act_quant.fused": 2, "gemm_quant.fallback": 2}
    static = qr.FP8RowLinear.from_fp8(lin, act_scale=50.0)
    c, d = fp.cast_rows_fp8_ref(x, 50.0)
    assert torch.equal(static(x).view(torch.int16), qr.emulate_rows(c, d, lin).view(torch.int16))


def test_shared_activation_quantises_once():
    x = torch.randn(4, 64).bfloat16()
    reset_counters()
    with q8.shared_activation(x):
        a = qr.quantize_activation_rows(x)
        b = qr.quantize_activation_rows(x)
        s = qr.quantize_activation_rows(x, 8.0)
    assert a is b and s is not a
    assert counters() == {"fp8_act_quant.fused": 2}


def test_refused_cast_falls_back_counted():
    x = torch.randn(4, 64).bfloat16().t()  # not contiguous
    reset_counters()
    codes, desc = qr.quantize_activation_rows(x)
    assert counters() == {"fp8_act_quant.fallback": 1}
    assert_rows_equal((codes, desc), fp.cast_rows_fp8_ref(x))


def test_operand_errors():
    lin = linear(64, 32, seed=10)
    codes, desc = fp.cast_rows_fp8(torch.randn(3, 64).bfloat16())
    with pytest.raises(UsageError, match="takes 48"):
        qr.fp8_linear_codes(codes, desc, linear(48, 32, seed=1))
    with pytest.raises(UsageError, match="row_descale"):
        qr.fp8_linear_codes(codes, desc.view(3), lin)
    with pytest.raises(UsageError, match="float8_e4m3fn"):
        qr.fp8_linear_codes(codes.float(), desc, lin)
    with pytest.raises(UsageError, match="FP8Linear"):
        qr.fp8_linear_codes(codes, desc, torch.nn.Linear(64, 32))


# ---------------------------------------------------------------------------------------------- the probe's block
@pytest.mark.slow
def test_probe_rowwise_block_forward():
    """benchmarks/probes/fp8_producers.py's rowwise_block_forward on the tiny H3 (interpreter, FP8 emulation):
    per-row codes stay within the per-tensor plan's error against eager; static scales calibrated on the same
    input are the per-tensor scales, so that arm gives the installed per-tensor plan's bits; the lean q/k/v
    cast gives qk_norm_rope_fp8's bits."""
    import copy

    from h3plan.actions import inputs
    from h3plan.actions.bench.measure import capture_block_inputs, rel_error, run_stack
    from h3plan.planning.config import compose
    from h3plan.install import install
    from h3plan.runtime.kernels import qk_fp8_lean as lean
    from h3plan.planner import resolve

    probe = load_script("benchmarks/probes/fp8_producers.py")
    S = 24
    cfg = compose(["hardware=sm90", "parallel=u1", "recipe=fp8", "model=h3_tiny", f"parallel.seq_len={S}",
                   "levers.qk_norm_rope=fused_fp8", "levers.fp8_act_quant=tensor", "levers.compile=off"])
    eager = inputs.build_model(cfg["model"]["diffusers_config"], blocks=1, dtype="bf16", seed=0)
    model = copy.deepcopy(eager)
    install(model, resolve(cfg))
    blk = model.transformer_blocks[0]
    block_in = capture_block_inputs(torch, eager, inputs.packed_inputs(cfg["model"]["diffusers_config"], S))
    with torch.no_grad():
        ref = run_stack(eager.transformer_blocks, *block_in)
        tensor = blk(*block_in)
        row = probe.rowwise_block_forward(blk, *block_in)
        lean_row = probe.rowwise_block_forward(blk, *block_in, qk_fn=lean.qk_norm_rope_fp8_lean)
        static = probe.rowwise_block_forward(blk, *block_in, act_scales=probe.calibrate(blk, block_in))
    e_tensor, e_row = rel_error(torch, tensor, ref)[0], rel_error(torch, row, ref)[0]
    assert 0 < e_row <= 1.5 * e_tensor < 1e-2, (e_row, e_tensor)
    assert torch.equal(lean_row.view(torch.int16), row.view(torch.int16))
    assert torch.equal(static.view(torch.int16), tensor.view(torch.int16))
