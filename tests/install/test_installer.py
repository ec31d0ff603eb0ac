"""Installer: recognition, round trip, idempotence, the swap log, counters proving the fused paths ran.

Numeric contract: the lossless plan (sdpa + fused QK-norm/RoPE + exact modulation + gated residual +
SwiGLU) is bitwise equal to diffusers' eager forward on the tiny model (rtol=0, atol=0; the kernels
keep eager's rounding points and the interpreter runs them with explicit rounding).
"""

import logging

import pytest
import torch
from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3AttnProcessor
from install_helpers import LEVERS, LOSSLESS, TINY, forward, plan, tiny_inputs, tiny_model

from h3plan.install import Builder, counters, install, installed_plan, reset_counters, uninstall
from h3plan.install.processor import H3PlanAttnProcessor
from h3plan.levers import OPTIONS, scope_options


@pytest.fixture(scope="module")
def inputs():
    return tiny_inputs()


@pytest.fixture(scope="module")
def eager(inputs):
    return forward(tiny_model(), inputs)


def _sd(model):
    return {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}


@pytest.mark.slow  # five interpreter kernels over the whole tiny model (~10 s)
def test_lossless_plan_bitwise_and_every_fused_path_ran(inputs, eager):
    model = tiny_model()
    install(model, plan(**LOSSLESS), registry=LEVERS)
    reset_counters()
    out = forward(model, inputs)
    for a, b in zip(out, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    n = len(model.transformer_blocks)
    # per block: norm1+norm2 modulation, two gated residuals, one SwiGLU, one QK-norm/RoPE, one attention
    assert counters() == {"attention.fused": n, "gated_residual.fused": 2 * n, "modulation.fused": 2 * n,
                          "qk_norm_rope.fused": n, "swiglu.fused": n}


def test_round_trip_restores_forward_and_state_dict(inputs, eager):
    model, fresh = tiny_model(), tiny_model()
    before = _sd(model)
    report = install(model, plan(**LOSSLESS), registry=LEVERS)
    assert _sd(model) == before  # bf16 plan: keys, shapes, dtypes unchanged while installed
    assert report.swaps and all(isinstance(b.attn.processor, H3PlanAttnProcessor) for b in model.transformer_blocks)
    assert uninstall(model) is True
    assert installed_plan(model) is None and uninstall(model) is False
    for b in model.transformer_blocks:
        assert type(b.attn.processor) is MiniMaxH3AttnProcessor and "forward" not in b.__dict__
    fresh_sd = fresh.state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(v, fresh_sd[k]) and v.dtype == fresh_sd[k].dtype, k
    reset_counters()
    out = forward(model, inputs)
    assert counters() == {}
    for a, b in zip(out, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_idempotent_and_replacing_plans():
    model = tiny_model()
    p1 = plan(attention="sdpa", modulation="exact")
    r1 = install(model, p1, registry=LEVERS)
    procs = [b.attn.processor for b in model.transformer_blocks]
    assert install(model, p1, registry=LEVERS) is r1
    assert [b.attn.processor for b in model.transformer_blocks] == procs
    p2 = plan(attention="sdpa", swiglu="on")
    r2 = install(model, p2, registry=LEVERS)
    assert installed_plan(model) == p2 and r2 is not r1
    for b in model.transformer_blocks:
        assert type(b.attn.processor.original) is MiniMaxH3AttnProcessor  # not wrapped twice
        assert b._h3plan_block[0].modulation == "eager" and b._h3plan_block[0].swiglu
    uninstall(model)


def test_token_refiner_keeps_diffusers_processor():
    model = tiny_model()
    install(model, plan(**LOSSLESS), registry=LEVERS)
    for blk in model.token_refiner.refiner_blocks:
        assert type(blk.attn.processor) is MiniMaxH3AttnProcessor


def test_swap_log_and_report(caplog):
    model = tiny_model()
    with caplog.at_level(logging.INFO, logger="h3plan.install"):
        report = install(model, plan(**LOSSLESS, gemm_quant="bf16"), registry=LEVERS)
    lines = [r.getMessage() for r in caplog.records]
    assert "attention: transformer_blocks.0.attn.processor MiniMaxH3AttnProcessor -> " \
           "H3PlanAttnProcessor[backend=sdpa, qk_norm_rope=fused]" in lines
    assert "modulation: transformer_blocks.1.norm1/norm2+modulate eager -> exact" in lines
    assert [str(s) for s in report.swaps] == lines[: len(report.swaps)]
    assert ("gemm_quant", "test: gemm_quant=bf16") in report.skipped
    assert set(report.swapped_levers()) == {"attention", "qk_norm_rope", "modulation", "gated_residual", "swiglu"}
    assert "skipped gemm_quant" in report.summary()


@pytest.mark.parametrize("bad", ["linear", "autoencoder", "compiled", "missing"])
def test_refuses_unknown_models(bad):
    if bad == "linear":
        model, msg = torch.nn.Linear(4, 4), "supports diffusers' MiniMaxH3Transformer3DModel only; got torch.nn"
    elif bad == "autoencoder":
        from diffusers import AutoencoderKL

        model, msg = AutoencoderKL(block_out_channels=(8,), norm_num_groups=4, latent_channels=2), "got diffusers."
    elif bad == "compiled":
        model, msg = torch.compile(tiny_model()), "torch.compile wrapper"
    else:
        model = tiny_model()
        del model.transformer_blocks[1].adaln_proj
        msg = "transformer_blocks.1.adaln_proj is missing"
    with pytest.raises(ValueError, match=msg.replace(".", r"\.").replace("(", r"\(")):
        install(model, plan(attention="sdpa"), registry=LEVERS)


def test_builder_contract():
    b = Builder()
    b.set("modulation", "modulation", "exact")
    with pytest.raises(ValueError, match="unknown install option 'modulatoin'"):
        b.set("modulation", "modulatoin", "exact")
    with pytest.raises(ValueError, match="allowed: 'eager' | 'exact' | 'fp32'"):
        b.set("modulation", "modulation", "fast")
    b.set("attention", "backend", "fa4")
    with pytest.raises(ValueError, match="lever 'other' set install option 'backend', which lever 'attention' owns"):
        b.set("other", "backend", "sdpa")
    with pytest.raises(ValueError, match="quant=.*allowed: None or dict\\(format: 'fp8' | 'nvfp4'"):
        b.set("gemm_quant", "quant", {"format": "int8"})
    # every block option the registry declares, in registry order: the recorded value, else its default
    # (derived, so a new lever's option adds a key here instead of breaking the test)
    block = scope_options("block")
    opts = b.options("block")
    assert list(opts) == list(block)
    assert opts == {k: "exact" if k == "modulation" else o.default for k, o in block.items()}
    assert all(b.lever_of(k) == OPTIONS[k][0] for k in opts)
    # the block options this test pins: the value set, the defaults, and each one's owner
    pinned = {"modulation": "exact", "gated_residual": False, "swiglu": False, "fp8_act_quant": "tensor",
              "nvfp4_producer_quant": False, "compile": "off"}
    assert {k: opts[k] for k in pinned} == pinned
    assert {k: b.lever_of(k) for k in pinned} == {k: k for k in pinned}


def test_inconsistent_options_and_unknown_lever_raise_and_leave_model_untouched():
    model = tiny_model()
    with pytest.raises(ValueError,
                       match="qk_norm_rope=fused_fp8 needs attention cudnn_fp8, the plan's backend is sdpa"):
        install(model, plan(attention="sdpa", qk_norm_rope="fused_fp8"), registry=LEVERS)
    with pytest.raises(ValueError, match="no installer"):
        install(model, plan(attention="sdpa"), registry={})
    assert installed_plan(model) is None
    assert all(type(b.attn.processor) is MiniMaxH3AttnProcessor for b in model.transformer_blocks)


def test_ulysses_degree_above_one_needs_a_matching_group():
    model = tiny_model()
    levers = dict(LEVERS, ulysses_padding=lambda b, d: (b.set("ulysses_padding", "ulysses_degree", 2),
                                                        b.set("ulysses_padding", "ulysses_padding", d.setting)))
    p = plan(attention="sdpa")
    from h3plan.planner import make_plan
    from h3plan.facts.decision import make_decision

    p = make_plan({}, {}, list(p.decisions) + [make_decision("ulysses_padding", "padded", True, ["test"])])
    with pytest.raises(ValueError, match="ulysses_degree=2 but the process group has 1 ranks"):
        install(model, p, registry=levers)
    assert installed_plan(model) is None


def test_tiny_config_is_the_planner_model():
    assert TINY["hidden_size"] == 96 and TINY["num_attention_heads"] * TINY["attention_head_dim"] == 128


def test_package_is_callable():
    import h3plan
    import h3plan.install

    model = tiny_model()
    report = h3plan.install(model, plan(attention="sdpa"), registry=LEVERS)
    assert report.swapped_levers() == ["attention"] and h3plan.install.uninstall(model)
