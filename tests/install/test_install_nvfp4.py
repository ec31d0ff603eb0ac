"""NVFP4 linears (runtime/quant/nvfp4.py): the emulated GEMM, the _scaled_mm argument contract, ModelOpt checkpoints.

Contracts: the emulation is exactly fp32 (dequantised codes x block scales) @ (same)^T, x (g_x g_w), + bias,
one rounding (rtol=0, atol=0 against that expression). The arguments the SM100 path hands torch._scaled_mm pass
torch's own meta implementation (torch/_meta_registrations.py `_check_scaled_mm_sizes`: 2-D fp4 operands,
self row-major, mat2 column-major, K/2 and N multiples of 16, flat e4m3 scales of 128 * ceil(M/128) *
4 * ceil(K/64) entries, contiguous) and carry the same codes and scales the emulation reads.
"""

from pathlib import Path

import pytest
import torch
from install_helpers import forward, plan, tiny_inputs, tiny_model

from h3plan.errors import InstallError, UsageError
from h3plan.install import fallback_reasons, install, reset_counters, uninstall
from h3plan.runtime.kernels import nvfp4 as n4
from h3plan.runtime.quant import BLOCK_LINEARS, load_nvfp4_checkpoint
from h3plan.runtime.quant import nvfp4 as q4

E4M3 = torch.float8_e4m3fn
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy in the interpreter


def linear(K=96, N=64, bias=True, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(K, N, bias=bias).to(torch.bfloat16)


@pytest.mark.slow  # a 4 x 1024 x 512 NVFP4 GEMM emulated in the interpreter (~5 s)
def test_emulation_is_the_dequantised_product():
    lin = linear()
    nl = q4.NVFP4Linear.from_linear(lin)
    x = (torch.randn(3, 5, 96) * 2).bfloat16()
    reset_counters()
    y = nl(x)
    assert fallback_reasons() == {"gemm_quant": {"NVFP4 GEMMs need SM100+": 1}}
    xp, xs, xg = n4.quantize_ref(x)
    want = n4.dequantize_ref(xp, xs).reshape(15, 96) @ n4.dequantize_ref(nl.weight, nl.weight_scale).t()
    want = (want * (xg * nl.weight_scale_2) + lin.bias.float()).to(torch.bfloat16).reshape(3, 5, 64)
    assert torch.equal(y.view(torch.int16), want.view(torch.int16))
    # the producer's codes (here the Triton cast's) give the same bits as the linear's own cast
    codes = q4.NVFP4Codes(*n4.cast_nvfp4(x), x.dtype)
    assert torch.equal(nl(codes).view(torch.int16), y.view(torch.int16))
    nl.input_kernel = True
    reset_counters()
    assert torch.equal(nl(x).view(torch.int16), y.view(torch.int16))
    assert fallback_reasons()["gemm_quant"] and "nvfp4_out_quant" not in fallback_reasons()


def test_static_input_scale():
    nl = q4.NVFP4Linear.from_linear(linear(bias=False))
    nl.input_scale = torch.tensor(0.002)
    x = torch.randn(4, 96).bfloat16()
    xp, xs, _ = n4.quantize_ref(x, torch.tensor(0.002))
    want = ((n4.dequantize_ref(xp, xs) @ n4.dequantize_ref(nl.weight, nl.weight_scale).t())
            * (torch.tensor(0.002) * nl.weight_scale_2))
    assert torch.equal(nl(x).view(torch.int16), want.to(torch.bfloat16).view(torch.int16))


def _meta(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


@pytest.mark.parametrize("M", [5, 130])
def test_scaled_mm_arguments_meet_torchs_contract(monkeypatch, M):
    lin = linear(K=96, N=64)
    nl = q4.NVFP4Linear.from_linear(lin)
    x = torch.randn(M, 96).bfloat16()
    calls = []

    def recorder(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
        calls.append(dict(a=a, b=b, scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=out_dtype))
        # torch's meta implementation raises on any violated constraint (meta tensors count as CUDA)
        torch.ops.aten._scaled_mm.default(_meta(a), _meta(b), _meta(scale_a), _meta(scale_b), None, None, out_dtype,
                                          use_fast_accum)
        # and the product the arguments describe, read back from them alone
        K = a.shape[1] * 2
        sa = n4.from_blocked(scale_a, a.shape[0], K // 16)
        sb = n4.from_blocked(scale_b, b.shape[1], K // 16)
        return n4.dequantize_ref(a.view(torch.uint8), sa) @ n4.dequantize_ref(b.t().view(torch.uint8), sb).t()

    monkeypatch.setattr(torch, "_scaled_mm", recorder)
    monkeypatch.setattr(q4, "nvfp4_gemm_reason", lambda *a: None)
    reset_counters()
    y = nl(x)
    (c,) = calls
    assert c["a"].dtype == c["b"].dtype == torch.float4_e2m1fn_x2
    assert c["a"].shape == (M, 48) and c["a"].stride() == (48, 1)  # row-major
    assert c["b"].shape == (48, 64) and c["b"].stride() == (1, 48)  # column-major: the weight (N, K/2) transposed
    n = 128 * -(-M // 128) * 4 * -(-6 // 4)
    assert (c["scale_a"].dtype == c["scale_b"].dtype == E4M3 and c["scale_a"].shape == (n,)
            and c["scale_b"].shape == (128 * 8,))
    assert c["bias"] is None and c["out_dtype"] == torch.float32
    monkeypatch.undo()
    assert torch.equal(y.view(torch.int16), nl(x).view(torch.int16))  # the emulation: the same product


def test_scaled_mm_meta_rejects_what_the_guard_refuses():
    """K = 48 (K/2 = 24) is what nvfp4_gemm_reason refuses; torch's meta check refuses it too."""
    fp4 = torch.float4_e2m1fn_x2
    a = torch.empty((5, 24), dtype=fp4, device="meta")
    b = torch.empty_strided((24, 64), (1, 24), dtype=fp4, device="meta")
    s = torch.empty(512, dtype=E4M3, device="meta")
    with pytest.raises(RuntimeError, match="divisible by 16"):
        torch.ops.aten._scaled_mm.default(a, b, s, s, None, None, torch.float32)
    nl = q4.NVFP4Linear.from_linear(linear(K=48))

    class Fake:  # a CUDA SM100 tensor as far as the guard asks
        device = torch.device("cuda", 0)

    orig = torch.cuda.get_device_capability
    try:
        torch.cuda.get_device_capability = lambda d=None: (10, 0)
        assert "K divisible by 32" in q4.nvfp4_gemm_reason(Fake, nl)
    finally:
        torch.cuda.get_device_capability = orig


# ---------------------------------------------------------------------------------------------- checkpoints
def modelopt_export(model, input_scale=0.003):
    """A ModelOpt-format NVFP4 state dict of the model's block linears (as `hf_quant_config` exports write them)."""
    sd = {}
    for i, block in enumerate(model.transformer_blocks):
        for path in BLOCK_LINEARS:
            lin = block.get_submodule(path)
            packed, bs, g = n4.quantize_ref(lin.weight)
            fqn = f"transformer_blocks.{i}.{path}"
            sd.update({f"{fqn}.weight": packed, f"{fqn}.weight_scale": bs, f"{fqn}.weight_scale_2": g.reshape(1),
                       f"{fqn}.input_scale": torch.tensor([input_scale])})
            if lin.bias is not None:
                sd[f"{fqn}.bias"] = lin.bias.detach().clone()
    return sd


def test_modelopt_checkpoint_loads_from_safetensors(tmp_path: Path):
    from safetensors.torch import save_file

    src = tiny_model()
    path = tmp_path / "nvfp4.safetensors"
    save_file(modelopt_export(src), str(path))
    dst = tiny_model(seed=1)
    keep = {k: v for k, v in src.state_dict().items()
            if not (k.startswith("transformer_blocks.") and any(f".{p}." in k for p in BLOCK_LINEARS))}
    dst.load_state_dict(keep, strict=False)  # everything but the block linears, which the checkpoint brings
    swapped = load_nvfp4_checkpoint(dst, path)
    assert len(swapped) == 6 * len(dst.transformer_blocks)
    lin = dst.transformer_blocks[0].attn.to_q
    assert isinstance(lin, q4.NVFP4Linear) and float(lin.input_scale) == pytest.approx(0.003)
    # the same weights quantised at install, with the same static input scales: the same bits
    report = install(src, plan(attention="sdpa", gemm_quant="nvfp4"))
    for block in src.transformer_blocks:
        for path_ in BLOCK_LINEARS:
            block.get_submodule(path_).input_scale = torch.tensor(0.003)
    inputs = tiny_inputs()
    want = forward(src, inputs)
    install(dst, plan(attention="sdpa", gemm_quant="nvfp4"))
    got = forward(dst, inputs)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert report.swaps and any("already NVFP4Linear" in r for _, r in installed_skips(dst))
    uninstall(src)
    uninstall(dst)


def installed_skips(model):
    return model._h3plan_state.report.skipped


def test_modelopt_checkpoint_torch_save(tmp_path: Path):
    src = tiny_model()
    path = tmp_path / "nvfp4.pt"
    torch.save(modelopt_export(src), path)
    assert len(load_nvfp4_checkpoint(tiny_model(), path)) == 12


@pytest.mark.parametrize("edit,msg", [
    (lambda sd, k: sd.pop(k + ".weight_scale"), "weight_scale missing"),
    (lambda sd, k: sd.__setitem__(k + ".weight_scale", sd[k + ".weight_scale"].float()),
     "weight_scale is torch.float32"),
    (lambda sd, k: sd.__setitem__(k + ".weight", sd[k + ".weight"][:, :-1]), r"weight is torch.uint8 \(128, 47\)"),
    (lambda sd, k: sd.__setitem__(k + ".input_scale", torch.tensor([0.0])), "input_scale = 0.0 is not finite and > 0"),
    (lambda sd, k: sd.__setitem__(k + ".weight_scale_2", torch.tensor([1.0, 2.0])),
     "weight_scale_2 is torch.float32 \\(2,\\)"),
    (lambda sd, k: sd.__setitem__(k + ".bias", torch.zeros(128)), r"bias \(128,\), the model's linear has no bias"),
])
def test_malformed_checkpoint_refused_in_one_line(edit, msg):
    src = tiny_model()
    sd = modelopt_export(src)
    edit(sd, "transformer_blocks.1.attn.to_q")
    dst = tiny_model()
    before = dst.transformer_blocks[0].attn.to_q
    with pytest.raises(InstallError, match=msg) as e:
        load_nvfp4_checkpoint(dst, sd)
    assert "\n" not in str(e.value) and "transformer_blocks.1.attn.to_q" in str(e.value)
    assert dst.transformer_blocks[0].attn.to_q is before  # nothing swapped


def test_unreadable_checkpoint(tmp_path: Path):
    with pytest.raises(UsageError, match="no such file"):
        load_nvfp4_checkpoint(tiny_model(), tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(UsageError, match="cannot read it"):
        load_nvfp4_checkpoint(tiny_model(), bad)


# ---------------------------------------------------------------------------------------------- the installed plan
NVFP4_PLAN = dict(attention="sdpa", gemm_quant="nvfp4", modulation="exact", gated_residual="on", swiglu="on")


def run(model, p, inputs):
    install(model, p)
    try:
        reset_counters()
        out = forward(model, inputs)
        from h3plan.install import counters

        return out, counters(), fallback_reasons(), model._h3plan_state.report
    finally:
        uninstall(model)


def small(static=True):
    """One block, 16 rows (the interpreter runs a program per row); NVFP4 linears loaded from a ModelOpt export,
    so with static input scales (one producer pass), or quantized at install (dynamic: two passes)."""
    from h3plan.actions.inputs import build_model
    from install_helpers import TINY

    model = build_model(TINY, blocks=1)
    if static:
        load_nvfp4_checkpoint(model, modelopt_export(model))
    return model, tiny_inputs(seq_len=16)


@pytest.mark.slow  # NVFP4 producers over the tiny model in the interpreter (~4 s a case)
@pytest.mark.parametrize("static", [True, False])
def test_producers_and_out_cast_give_the_linears_own_bits(static):
    """nvfp4_producer_quant + nvfp4_out_quant write the same codes the NVFP4 linears compute from bf16 inputs."""
    model, inputs = small(static)
    want, c0, _, _ = run(model, plan(**NVFP4_PLAN), inputs)
    got, c, reasons, report = run(model, plan(**NVFP4_PLAN, nvfp4_producer_quant="on", nvfp4_out_quant="on"), inputs)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert c["nvfp4_producer_quant.fused"] == 3 and "nvfp4_producer_quant.fallback" not in c  # norm1, fold, swiglu
    assert c["nvfp4_out_quant.fused"] == 1 and c["gemm_quant.fallback"] == c0["gemm_quant.fallback"] == 6
    assert reasons["gemm_quant"] == {"NVFP4 GEMMs need SM100+": 6}
    logged = {(s.lever, s.fqn) for s in report.swaps}
    assert ("nvfp4_out_quant", "transformer_blocks.0.attn.to_out.0") in logged
    assert any(lv == "nvfp4_producer_quant" for lv, _ in logged)


@pytest.mark.slow  # NVFP4 forwards in the interpreter (~4 s)
def test_a_refused_producer_falls_back_with_the_same_bits(monkeypatch):
    from h3plan.runtime.kernels import nvfp4_producers as npd

    model, inputs = small()
    want, *_ = run(model, plan(**NVFP4_PLAN), inputs)
    monkeypatch.setattr(npd, "gated_residual_modulate_nvfp4_check", lambda *a, **k: "refused by the test")
    got, c, reasons, _ = run(model, plan(**NVFP4_PLAN, nvfp4_producer_quant="on"), inputs)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert reasons["nvfp4_producer_quant"] == {"refused by the test": 1}
    assert c["nvfp4_producer_quant.fused"] == 3  # norm1, swiglu, and norm2 through the unfolded producer


def test_nvfp4_levers_without_nvfp4_linears_are_skipped():
    model, inputs = small(static=False)
    p = plan(attention="sdpa", modulation="exact", swiglu="on", nvfp4_producer_quant="on", nvfp4_out_quant="on")
    report = install(model, p)
    try:
        skipped = dict(report.skipped)
        assert "not NVFP4" in skipped["nvfp4_producer_quant"] and "not NVFP4" in skipped["nvfp4_out_quant"]
        reset_counters()
        forward(model, inputs)
        from h3plan.install import counters

        assert not any(k.startswith("nvfp4") for k in counters())
    finally:
        uninstall(model)


def test_verify_video_ssim():
    """verify's SSIM of the video output: 1 for identical outputs, lower as the error grows."""
    from h3plan.actions.verify import video_ssim

    ref = torch.randn(1, 4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    near, far = ref + 0.01 * torch.randn_like(ref), ref + 0.5 * torch.randn_like(ref)
    assert video_ssim(ref, ref) == pytest.approx(1.0)
    assert 1.0 > video_ssim(near, ref) > video_ssim(far, ref) > 0.0


@pytest.mark.slow  # torch.compile of an installed block (~10 s)
def test_installed_nvfp4_block_compiles_fullgraph():
    """The producers, the fold, the out cast and the emulated GEMM trace as one graph (custom ops, counters
    through h3plan::count): no graph break, no recompile on the second call, the eager bits."""
    import torch._dynamo

    model, inputs = small()
    install(model, plan(**NVFP4_PLAN, nvfp4_producer_quant="on", nvfp4_out_quant="on"))
    # config.patch, not monkeypatch: monkeypatch's undo deletes the attribute (torch's config module keeps its values
    # outside __dict__), and every later test that patches error_on_recompile then raises AttributeError
    with torch._dynamo.config.patch(error_on_recompile=True):
        try:
            want = forward(model, inputs)
            block = model.transformer_blocks[0]
            block.forward = torch.compile(block.forward, fullgraph=True, backend="eager")
            reset_counters()
            got = [forward(model, inputs) for _ in range(2)]
            from h3plan.install import counters

            assert all(torch.equal(a, b) for g in got for a, b in zip(g, want))
            assert counters()["nvfp4_producer_quant.fused"] == 6 and counters()["nvfp4_out_quant.fused"] == 2
        finally:
            torch._dynamo.reset()
            uninstall(model)
