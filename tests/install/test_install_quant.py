"""Checkpoint quantization: FP8 numerics (plain torch, exact on the CPU), guards, install. NVFP4: the format
in tests/kernels/test_nvfp4.py, the linears and their checkpoints in tests/install/test_install_nvfp4.py.

Contracts: e4m3 round to nearest even has relative error <= 2^-4 for normal values and absolute
error <= 2^-10 (half the smallest subnormal 2^-9) below 2^-6, both times the scale; values on the grid
round-trip exactly.
"""

import pytest
import torch
from install_helpers import LEVERS, forward, plan, tiny_inputs, tiny_model

from h3plan.install import counters, fallback_reasons, install, reset_counters, uninstall
from h3plan.runtime.quant import BLOCK_LINEARS
from h3plan.runtime.quant import fp8 as q8

E4M3 = torch.float8_e4m3fn


def _e4m3_bound(real, scale):
    return torch.maximum(real.abs() * 2.0**-4, torch.as_tensor(2.0**-10) * scale)


@pytest.mark.parametrize("scaling", ["channel", "tensor"])
def test_fp8_weight_quantization_error_bound(scaling):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 48, generator=g) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different scale
    w8, ws = q8.quantize_weight(w.to(torch.bfloat16), scaling)
    assert w8.dtype == E4M3 and ws.dtype == torch.float32 and ws.shape == ((64,) if scaling == "channel" else ())
    wb = w.to(torch.bfloat16).float()
    amax = wb.abs().amax(1) if scaling == "channel" else wb.abs().amax()
    torch.testing.assert_close(ws, amax / 448, rtol=0, atol=0)
    s = ws[:, None] if ws.dim() else ws
    err = (q8.dequantize_weight(w8, ws) - wb).abs()
    assert bool((err <= _e4m3_bound(wb, s) * (1 + 1e-6)).all())


def test_fp8_grid_values_round_trip_and_channel_scaling_wins():
    grid = torch.tensor([0.0, 2.0**-9, 0.015625, 0.5, 1.75, 26.0, 240.0, 448.0])
    w = torch.stack([grid * 3.0, -grid * 0.25])  # row amax = 448 * scale, scales 3/448 and 1/1792
    w8, ws = q8.quantize_weight(w, "channel")
    torch.testing.assert_close(q8.dequantize_weight(w8, ws), w, rtol=0, atol=0)
    g = torch.Generator().manual_seed(1)
    row_scale = torch.cat([torch.full((8,), 1e-5), torch.ones(24)])[:, None]
    w = torch.randn(32, 64, generator=g) * row_scale
    small = slice(0, 8)  # 1e-5 rows next to O(1) rows: one tensor scale pushes them into e4m3 subnormals
    err = {s: float((q8.dequantize_weight(*q8.quantize_weight(w, s))[small] - w[small]).norm() / w[small].norm())
           for s in ("channel", "tensor")}
    assert err["channel"] < 0.05 < 0.2 < err["tensor"], err


def test_fp8_linear_cpu_emulation_and_prequantized_checkpoint():
    g = torch.Generator().manual_seed(2)
    lin = torch.nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    x = torch.randn(2, 5, 64, generator=g).to(torch.bfloat16)
    fl = q8.FP8Linear.from_linear(lin)
    reset_counters()
    y = fl(x)
    assert counters() == {"gemm_quant.fallback": 1}
    assert fallback_reasons() == {"gemm_quant": {"FP8 GEMM needs CUDA (input on cpu)": 1}}
    scale = 448 / x.float().abs().amax()
    x8 = (x.float() * scale).to(E4M3)
    manual = ((x8.float() / scale) @ (fl.weight.float() * fl.weight_scale[:, None]).t()).to(torch.bfloat16)
    torch.testing.assert_close(y, manual, rtol=0, atol=0)
    # error vs the bf16 linear: ~2^-4 / sqrt(3) per operand, averaged over K=64 products: well under 5%
    ref = lin(x).detach().float()
    assert float((y.float() - ref).norm() / ref.norm()) < 0.05, "FP8 emulation far from the bf16 linear"
    pre = q8.FP8Linear.from_quantized(fl.weight.clone(), fl.weight_scale.clone()[:, None])  # (N, 1) scale
    torch.testing.assert_close(pre(x), y, rtol=0, atol=0)
    assert set(pre.state_dict()) == {"weight", "weight_scale"}
    with pytest.raises(ValueError, match="weight_scale must have 1 or N=32"):
        q8.FP8Linear.from_quantized(fl.weight, torch.ones(3))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        q8.FP8Linear.from_quantized(lin.weight, torch.ones(32))


@pytest.mark.parametrize("scaling", ["channel", "tensor"])
def test_fp8_scaled_mm_call_matches_emulation(scaling):
    """The GEMM path's torch._scaled_mm call (rowwise / tensorwise scales, column-major weight) run by
    torch's CPU kernel equals the emulation bit for bit here; on the H200 the GPU suite compares them."""
    g = torch.Generator().manual_seed(4)
    fl = q8.FP8Linear.from_linear(torch.nn.Linear(64, 48, bias=True).to(torch.bfloat16), scaling=scaling)
    x = torch.randn(7, 64, generator=g).to(torch.bfloat16)
    torch.testing.assert_close(fl._gemm(x), fl._emulate(x), rtol=0, atol=0)


def test_activation_codes_kernel_and_cache():
    """The Triton cast (interpreter here) gives the torch reference's codes bit for bit; inside
    shared_activation(x) the codes of that tensor are computed once (to_q / to_k / to_v)."""
    from h3plan.runtime.kernels import fp8 as cast

    g = torch.Generator().manual_seed(6)
    x = (torch.randn(3, 40, 96, generator=g) * 5).to(torch.bfloat16)
    x.view(-1)[:4] = torch.tensor([0.0, 1e-6, -2e-3, 448.0 * 5]).to(torch.bfloat16)
    a, da = cast.quantize(x.reshape(-1, 96))
    b, db = cast.quantize_ref(x.reshape(-1, 96))
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)) and torch.equal(da, db)
    assert cast.quantize_check(x.transpose(1, 2)).startswith("x is not contiguous")
    first = q8.quantize_activation(x, kernel=True)
    assert q8.quantize_activation(x) is not first  # outside shared_activation nothing is reused
    with q8.shared_activation(x):
        once = q8.quantize_activation(x, kernel=True)
        assert q8.quantize_activation(x) is once and q8.quantize_activation(x.clone()) is not once
    assert q8.quantize_activation(x) is not once


def test_activation_cast_with_a_given_amax_kernel_and_reference_agree():
    """quantize(x, amax_fn) / quantize_ref(x, amax): the scale covers the given amax, not x's own (a
    sequence split over ranks); the Triton pass 1 alone (`amax`) is exact."""
    from h3plan.runtime.kernels import fp8 as cast

    g = torch.Generator().manual_seed(7)
    x = (torch.randn(40, 96, generator=g) * 3).to(torch.bfloat16)
    assert torch.equal(cast.amax(x), x.abs().amax().float())
    big = torch.tensor(float(x.abs().amax()) * 4)
    a, da = cast.quantize(x, lambda t: big)
    b, db = cast.quantize_ref(x, big)
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)) and torch.equal(da, db)
    assert torch.equal(da, big / 448.0) and not torch.equal(da, cast.quantize_ref(x)[1])
    assert float(a.float().abs().max()) <= 448.0 / 4 + 16  # codes use a quarter of the e4m3 range


def test_sequence_amax_excludes_padding_rows_and_empty_shards():
    """SequenceAmax on a rank: the amax of its valid rows only (S = 5 over 2 ranks: 3 + 2 valid), 0 for a
    rank holding only padding; without a process group the all-reduce is the identity."""
    from types import SimpleNamespace

    shard = SimpleNamespace(group=None, degree=2, seq_len=5)
    fn = q8.SequenceAmax(shard)
    x = torch.zeros(1, 3, 8, dtype=torch.bfloat16)
    x[0, :2] = 1.0
    x[0, 2] = -7.0  # rank 1's third row is padding (a modulated zero row: not data)
    fn.rank = 0
    assert float(fn(x)) == 7.0
    fn.rank = 1
    assert float(fn(x)) == 1.0
    shard.degree, fn.rank = 4, 3  # 5 rows over 4 ranks: 2 + 2 + 1 + 0 valid, the last rank only padding
    assert float(fn(x)) == 0.0
    with pytest.raises(ValueError, match=r"expects \(B, S_loc, K\) activations"):
        fn(x[0])
    lin = q8.FP8Linear.from_linear(torch.nn.Linear(8, 16, bias=False).to(torch.bfloat16))
    lin.amax_fn = lambda t: torch.tensor(70.0)
    ref = q8.FP8Linear.from_linear(torch.nn.Linear(8, 16, bias=False).to(torch.bfloat16))
    ref.load_state_dict(lin.state_dict())
    xin = torch.full((1, 3, 8), 0.5, dtype=torch.bfloat16)
    assert not torch.equal(lin(xin), ref(xin))  # the emulation quantises with the given amax


def test_fp8_gemm_guards():
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    assert q8.fp8_gemm_reason(x, 32) == "FP8 GEMM needs CUDA (input on cpu)"
    fl = q8.FP8Linear.from_linear(torch.nn.Linear(64, 32, bias=False))
    reset_counters()
    fl(torch.zeros(3, 64, requires_grad=True))
    assert fallback_reasons() == {"gemm_quant": {"grad enabled": 1}}


def test_fp8_install_quantizes_block_linears_only_and_uninstall_restores():
    model, fresh = tiny_model(), tiny_model()
    adaln = model.transformer_blocks[0].adaln_proj.linear
    originals = {p: model.transformer_blocks[0].get_submodule(p) for p in BLOCK_LINEARS}
    report = install(model, plan(attention="sdpa", gemm_quant="fp8"), registry=LEVERS)
    assert sum(s.lever == "gemm_quant" for s in report.swaps) == 6 * len(model.transformer_blocks)
    for blk in model.transformer_blocks:
        for p in BLOCK_LINEARS:
            assert isinstance(blk.get_submodule(p), q8.FP8Linear)
        assert type(blk.adaln_proj.linear) is torch.nn.Linear and blk.adaln_proj.linear.weight.dtype == torch.bfloat16
        assert blk.norm1.weight.dtype == torch.bfloat16
    for blk in model.token_refiner.refiner_blocks:
        assert type(blk.attn.to_q) is torch.nn.Linear
    assert model.proj_out.weight.dtype == torch.float32 and type(model.proj_out) is torch.nn.Linear
    sd = model.state_dict()
    assert sd["transformer_blocks.0.attn.to_q.weight"].dtype == E4M3
    assert sd["transformer_blocks.0.attn.to_q.weight_scale"].shape == (128,)
    reset_counters()
    forward(model, tiny_inputs())
    assert counters()["gemm_quant.fallback"] == 6 * len(model.transformer_blocks)
    uninstall(model)
    assert model.transformer_blocks[0].adaln_proj.linear is adaln
    for p, m in originals.items():
        assert model.transformer_blocks[0].get_submodule(p) is m
    fsd = fresh.state_dict()
    assert all(torch.equal(v, fsd[k]) and v.dtype == fsd[k].dtype for k, v in model.state_dict().items())


def test_prequantized_checkpoint_loads_and_install_keeps_it():
    """An FP8 export (state dict of an installed fp8 plan) loads into a fresh model; the fp8 plan then
    installs around it, and the forward equals the installed-quantisation forward bit for bit."""
    from h3plan.runtime.quant import load_fp8_checkpoint

    src = tiny_model()
    install(src, plan(attention="sdpa", gemm_quant="fp8"), registry=LEVERS)
    sd = {k: v.clone() for k, v in src.state_dict().items()}
    inputs = tiny_inputs()
    want = forward(src, inputs)
    dst = tiny_model(seed=1)  # other weights: the checkpoint must overwrite what it covers
    dst.load_state_dict({k: v for k, v in sd.items() if "transformer_blocks" not in k or
                         not any(k.endswith(f"{p}.weight") or k.endswith(f"{p}.weight_scale") for p in BLOCK_LINEARS)},
                        strict=False)
    swapped = load_fp8_checkpoint(dst, sd)
    assert len(swapped) == 6 * len(dst.transformer_blocks)
    report = install(dst, plan(attention="sdpa", gemm_quant="fp8"), registry=LEVERS)
    assert any("already FP8Linear" in r for _, r in report.skipped)
    got = forward(dst, inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_install_time_quantisation_parks_the_replaced_linears(monkeypatch):
    """The replaced bf16 linears leave the device while the plan is installed and come back bit for bit. On a CPU
    there is no device to free, so CPU stands in for one here (parking.STAY): every original weight gets new
    (host) storage, the installed model never reads it, and uninstall restores the same Parameter objects."""
    from h3plan.install import parking

    monkeypatch.setattr(parking, "STAY", ("meta",))
    model, fresh = tiny_model(), tiny_model()
    originals = {p: model.transformer_blocks[0].get_submodule(p) for p in BLOCK_LINEARS}
    params = {p: m.weight for p, m in originals.items()}
    ptrs = {p: w.data_ptr() for p, w in params.items()}
    report = install(model, plan(attention="sdpa", gemm_quant="fp8"), registry=LEVERS)
    note = [n for n in report.notes if "wait on the host" in n]
    assert len(note) == 1 and f"the {6 * len(model.transformer_blocks)} replaced linears" in note[0], report.notes
    assert all(params[p].data_ptr() != ptrs[p] for p in params)  # parked: new storage
    for p, w in params.items():  # poison the parked copies: the installed model must not read them
        w.data.fill_(float("nan"))
    reset_counters()
    out = forward(model, tiny_inputs())
    assert all(torch.isfinite(o).all() for o in out)
    for p, w in params.items():
        w.data.copy_(fresh.transformer_blocks[0].get_submodule(p).weight)  # undo the poison for the round trip
    uninstall(model)
    for p, m in originals.items():
        assert model.transformer_blocks[0].get_submodule(p) is m and m.weight is params[p]
    fsd = fresh.state_dict()
    assert all(torch.equal(v, fsd[k]) and v.device == fsd[k].device for k, v in model.state_dict().items())


def test_park_leaves_cpu_tensors_and_counts_bytes():
    from h3plan.install.parking import park

    lin = torch.nn.Linear(8, 4)
    ptr = lin.weight.data_ptr()
    parked = park([lin])
    assert parked.nbytes == 0 and parked.params == [] and lin.weight.data_ptr() == ptr
