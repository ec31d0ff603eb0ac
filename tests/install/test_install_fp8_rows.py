"""fp8_act_quant=row installed on the tiny model (CPU: producers in the Triton interpreter, the FP8 GEMMs in
their counted fp32 emulation).

Contracts, rtol=0 atol=0 throughout:
- the installed block equals the torch reference chain: the bf16 producer (kernels.modulation / kernels.swiglu,
  the same kernels the lossless plan runs), `rows_to_e4m3_ref` (per-row scales), the fp32-emulated rowwise GEMM
  (`emulate_rows`), diffusers' attention pieces. Exact because each producer's codes are bit-identical to its
  reference cast of the bf16 output (tests/kernels/test_fp8_producers.py) and the GEMM path is the same function;
- a refused producer (its check forced to answer) runs the bf16 producer and the linear's own per-row cast:
  the same bits, counted as fp8_act_quant fallbacks with the reason;
- with a static linear-input table, row (producers in static mode) equals tensor (FP8Linear's static cast);
- row with no FP8 linears installs nothing and says why.
"""

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb
from install_helpers import LEVERS, TINY, forward, plan, tiny_inputs, tiny_model

from h3plan.actions.bench.measure import capture_block_inputs
from h3plan.install import counters, fallback_reasons, install, reset_counters, uninstall
from h3plan.runtime.kernels.fp8_producers import rows_to_e4m3_ref
from h3plan.runtime.kernels.modulation import rmsnorm_modulate
from h3plan.runtime.kernels.swiglu import swiglu
from h3plan.runtime.quant.fp8 import FP8Linear
from h3plan.runtime.quant.fp8_rowwise import FP8RowLinear, emulate_rows

ROW = dict(attention="sdpa", gemm_quant="fp8", modulation="exact", swiglu="on", fp8_act_quant="row")


def _bitwise(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{(a != b).sum().item()} of {a.numel()} differ"


def _linear_rows(x, lin):
    """per-row quantize -> fp32-emulated GEMM (one rounding to bf16)."""
    c, d = rows_to_e4m3_ref(x)
    out = emulate_rows(c.reshape(-1, c.shape[-1]), d.reshape(-1, 1), lin)
    return out.reshape(*x.shape[:-1], lin.out_features)


def reference_block(blk, hs, temb, idx, rope, linear_rows=_linear_rows):
    """The row plan's block as a plain chain (plan: sdpa, qk_norm_rope eager, gated_residual off);
    `linear_rows(x, lin)`: per-row quantize + GEMM (the GPU suite passes torch._scaled_mm's)."""
    _linear_rows = linear_rows
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = blk.adaln_proj(temb)
    a = blk.attn
    y = rmsnorm_modulate(hs, blk.norm1.weight, scale_msa, shift_msa, idx, blk.norm1.eps, mode="exact")
    q, k, v = (_linear_rows(y, lin).unflatten(-1, (a.heads, -1)) for lin in (a.to_q, a.to_k, a.to_v))
    q, k = _apply_rotary_emb(a.norm_q(q), *rope), _apply_rotary_emb(a.norm_k(k), *rope)
    o = F.scaled_dot_product_attention(*(t.permute(0, 2, 1, 3) for t in (q, k, v))).permute(0, 2, 1, 3).flatten(2, 3)
    h = hs + gate_msa.index_select(0, idx) * _linear_rows(o, a.to_out[0])
    y = rmsnorm_modulate(h, blk.norm2.weight, scale_mlp, shift_mlp, idx, blk.norm2.eps, mode="exact")
    g = swiglu(_linear_rows(y, blk.ff.net[0].proj))
    return h + gate_mlp.index_select(0, idx) * _linear_rows(g, blk.ff.net[2])


@pytest.fixture(scope="module")
def row_model():
    model, inputs = tiny_model(), tiny_inputs()
    block_in = capture_block_inputs(torch, model, inputs)
    report = install(model, plan(**ROW), registry=LEVERS)
    return model, block_in, report


@pytest.mark.slow  # the FP8 row chain in the interpreter (~6 s)
def test_installed_row_block_equals_the_reference_chain(row_model):
    model, block_in, report = row_model
    blk = model.transformer_blocks[0]
    for p in ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2"):
        assert type(blk.get_submodule(p)) is FP8RowLinear and blk.get_submodule(p).act_scale is None
    swaps = [str(s) for s in report.swaps if s.lever == "fp8_act_quant"]
    assert len(swaps) == 7 * len(model.transformer_blocks) and "attn.to_q FP8Linear -> FP8RowLinear" in swaps[0]
    reset_counters()
    with torch.no_grad():
        got = blk(*block_in)
        ref = reference_block(blk, *block_in)
    # norm1, norm2, SwiGLU producers and to_out.0's cast: four fused per block, nothing fell back
    assert counters()["fp8_act_quant.fused"] == 4 and "fp8_act_quant.fallback" not in counters()
    assert "modulation.fused" not in counters() and "swiglu.fused" not in counters()  # the producers replaced them
    _bitwise(got, ref)


@pytest.mark.slow
def test_refused_producers_fall_back_to_the_same_bits(row_model):
    model, block_in, _ = row_model
    blk = model.transformer_blocks[0]
    opts, kernels, shard = blk._h3plan_block
    with torch.no_grad():
        fused = blk(*block_in)
    saved = dict(kernels)
    try:
        for op in ("rmsnorm_modulate_fp8", "swiglu_fp8"):
            kernels[op] = (kernels[op][0], lambda *a, **k: "test: refused")
        reset_counters()
        with torch.no_grad():
            fell = blk(*block_in)
    finally:
        kernels.update(saved)
    c = counters()
    # three producers refused; the linears then cast their bf16 inputs per row (to_q/k/v share one cast)
    assert c["fp8_act_quant.fallback"] == 3 and c["fp8_act_quant.fused"] == 4
    assert fallback_reasons()["fp8_act_quant"] == {"test: refused": 3}
    assert c["modulation.fused"] == 2 and c["swiglu.fused"] == 1  # the bf16 producers ran
    _bitwise(fell, fused)


def test_grad_routes_every_producer_to_the_bf16_path(row_model):
    model, block_in, _ = row_model
    blk = model.transformer_blocks[0]
    hs = block_in[0].clone().requires_grad_(True)
    reset_counters()
    with torch.enable_grad():
        blk(hs, *block_in[1:])
    assert set(fallback_reasons()["fp8_act_quant"]) == {"grad enabled"} and "fp8_act_quant.fused" not in counters()


def _static_table(tmp_path):
    import json

    from h3plan.facts.scale_table import FORMAT, VERSION, config_hash, values_hash

    lin = {f"transformer_blocks.{i}.{p}": a for i in range(2) for p, a in
           (("attn.to_q", 3.0), ("attn.to_k", 3.0), ("attn.to_v", 3.0), ("attn.to_out.0", 0.5 + i),
            ("ff.net.0.proj", 2.5), ("ff.net.2", 0.3))}
    att = {f"transformer_blocks.{i}.attn": {"q": 3.0, "k": 4.0, "v": 2.5} for i in range(2)}
    check = {"passed": True, "summary": "synthetic"}
    prov = {"model": "h3_tiny", "config_hash": config_hash(TINY), "num_layers": 2, "request": {"seq_len": 48},
            "inputs": {"kind": "seeded", "seeds": [0], "steps": [0, 48]},
            "heldout": {"kind": "seeded", "seeds": [1], "check": check}, "date": "2026-01-01T00:00:00Z", "margin": 1.0,
            "statistic": "amax", "h3plan_version": "0.2.0", "values_sha256": values_hash(att, lin)}
    path = tmp_path / "scales.json"
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "provenance": prov, "attention": att,
                                "linears": lin}))
    return str(path)


@pytest.mark.slow
def test_static_table_row_equals_tensor(tmp_path):
    """Static scales: the producers write with the table's scale, FP8Linear casts with it: the same codes, the
    same GEMM rows, so the whole model agrees bit for bit."""
    params = {"gemm_quant": {"input_scales": "static", "scale_table": _static_table(tmp_path), "scale_margin": 1.25}}
    model, inputs = tiny_model(), tiny_inputs()
    install(model, plan(params, **{**ROW, "fp8_act_quant": "tensor"}), registry=LEVERS)
    assert type(model.transformer_blocks[0].attn.to_q) is FP8Linear
    want = forward(model, inputs)
    uninstall(model)
    install(model, plan(params, **ROW), registry=LEVERS)
    to_out = model.transformer_blocks[1].attn.to_out[0]
    assert to_out.act_scale == pytest.approx(448 / (1.5 * 1.25), rel=1e-6)  # the fp32 scale of amax * margin
    reset_counters()
    got = forward(model, inputs)
    assert counters()["fp8_act_quant.fused"] == 8 and "fp8_act_quant.fallback" not in counters()
    for a, b in zip(got, want):
        _bitwise(a, b)


def test_row_without_fp8_linears_installs_nothing_and_says_why():
    model = tiny_model()
    report = install(model, plan(attention="sdpa", modulation="exact", swiglu="on", fp8_act_quant="row"),
                     registry=LEVERS)
    assert not any(s.lever == "fp8_act_quant" for s in report.swaps)
    assert any(lv == "fp8_act_quant" and "not FP8" in why for lv, why in report.skipped)
    assert model.transformer_blocks[0]._h3plan_block[0].fp8_act_quant == "tensor"
