"""Per-call guards: refused inputs route to diffusers' eager op, counted with the kernel's reason.

Contract: every fallback output equals diffusers' eager output bitwise (rtol=0, atol=0) -- the fallback
*is* diffusers' code -- and the counters name the reason, so a guard that silently refuses is visible.
"""

import pytest
import torch
from install_helpers import LEVERS, LOSSLESS, forward, plan, tiny_inputs, tiny_model

import h3plan.runtime.kernels._common as kcommon
from h3plan.install import counters, fallback_reasons, install, reset_counters

BLOCK_LEVERS = ("modulation", "gated_residual", "swiglu", "qk_norm_rope")


def _assert_equal(out, ref):
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_fp32_model_falls_back_with_dtype_reasons():
    inputs = tiny_inputs()
    ref = forward(tiny_model(dtype=torch.float32), inputs)
    model = tiny_model(dtype=torch.float32)
    install(model, plan(**LOSSLESS), registry=LEVERS)
    reset_counters()
    _assert_equal(forward(model, inputs), ref)
    c, why = counters(), fallback_reasons()
    for lever in BLOCK_LEVERS:
        assert c.get(f"{lever}.fused", 0) == 0 and c[f"{lever}.fallback"] > 0, lever
        assert any("float32" in r for r in why[lever]), why[lever]
    assert c["attention.fused"] == 2  # sdpa takes fp32 too


@pytest.mark.slow  # the lossless block in the interpreter (~3 s)
def test_non_contiguous_block_input_falls_back():
    model, ref_model = tiny_model(), tiny_model()
    install(model, plan(**LOSSLESS), registry=LEVERS)
    blk, ref_blk = model.transformer_blocks[0], ref_model.transformer_blocks[0]
    S, D = 48, blk.norm1.weight.shape[0]
    g = torch.Generator().manual_seed(1)
    h = torch.randn(1, D, S, generator=g).to(torch.bfloat16).transpose(1, 2)  # (1, S, D), not contiguous
    temb = torch.randn(2, ref_model.config.time_embed_dim, generator=g)
    idx = torch.randint(0, 6, (S,), generator=g)
    rope = ref_model.rope(torch.randint(0, 8, (S, 3), generator=g).float())
    reset_counters()
    with torch.no_grad():
        out, ref = blk(h, temb, idx, rope), ref_blk(h, temb, idx, rope)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    why = fallback_reasons()
    assert any("not contiguous" in r for r in why["modulation"]), why
    assert any("not contiguous" in r for r in why["gated_residual"]), why
    # the residual sums keep the input's layout, so both norms and both residuals refuse; the linears
    # produce contiguous tensors, so SwiGLU and QK-norm/RoPE still run fused
    assert counters() == {"attention.fused": 1, "gated_residual.fallback": 2, "modulation.fallback": 2,
                          "qk_norm_rope.fused": 1, "swiglu.fused": 1}


def test_unsupported_device_falls_back(monkeypatch):
    """Without CUDA and without the interpreter, Triton cannot run: every kernel refuses the CPU tensors."""
    import importlib

    monkeypatch.setattr(kcommon, "INTERPRET", False)
    for name in ("modulation", "gated_residual", "swiglu", "qk_norm_rope"):
        mod = importlib.import_module(f"h3plan.runtime.kernels.{name}")
        if hasattr(mod, "INTERPRET"):
            monkeypatch.setattr(mod, "INTERPRET", False)
    inputs = tiny_inputs()
    ref = forward(tiny_model(), inputs)
    model = tiny_model()
    install(model, plan(**LOSSLESS), registry=LEVERS)
    reset_counters()
    _assert_equal(forward(model, inputs), ref)
    c, why = counters(), fallback_reasons()
    for lever in BLOCK_LEVERS:
        assert c.get(f"{lever}.fused", 0) == 0, lever
        assert any("Triton needs CUDA" in r for r in why[lever]), why[lever]


def test_grad_enabled_routes_to_eager_and_backpropagates():
    inputs = tiny_inputs()
    ref_model, model = tiny_model().requires_grad_(True), tiny_model().requires_grad_(True)
    install(model, plan(**LOSSLESS), registry=LEVERS)
    reset_counters()
    out = model(**inputs).sample
    ref = ref_model(**inputs).sample
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    c, why = counters(), fallback_reasons()
    assert not any(k.endswith(".fused") for k in c), c
    assert all(set(why[lever]) == {"grad enabled"} for lever in BLOCK_LEVERS + ("attention",)), why
    out.float().square().mean().backward()
    assert model.transformer_blocks[0].attn.to_q.weight.grad is not None


def test_a_guard_that_always_refuses_is_caught(monkeypatch):
    """The counters make a regressed guard visible: the same forward, but the swiglu check refuses."""
    import h3plan.runtime.kernels.swiglu as sw

    monkeypatch.setattr(sw, "swiglu_check", lambda x: "regressed guard")
    model = tiny_model()
    install(model, plan(attention="sdpa", swiglu="on"), registry=LEVERS)
    reset_counters()
    forward(model, tiny_inputs())
    assert counters().get("swiglu.fused", 0) == 0
    assert fallback_reasons()["swiglu"] == {"regressed guard": 2}


def test_attention_backend_unavailable_and_mask_fall_back():
    """FA4 cannot run on the CPU: diffusers' own attention runs instead, counted with FA4's reason."""
    inputs = tiny_inputs()
    ref = forward(tiny_model(), inputs)
    model = tiny_model()
    install(model, plan(attention="fa4"), registry=LEVERS)
    reset_counters()
    _assert_equal(forward(model, inputs), ref)
    assert fallback_reasons()["attention"] == {"FA4 needs a CUDA device (tensors on cpu)": 2}
    attn = model.transformer_blocks[0].attn
    x = torch.randn(1, 8, model.config.hidden_size, dtype=torch.bfloat16)
    mask = torch.ones(1, 8, dtype=torch.bool)
    reset_counters()
    with torch.no_grad():
        torch.testing.assert_close(attn(x, None, mask), attn.processor.original(attn, x, None, mask), rtol=0, atol=0)
    assert fallback_reasons()["attention"] == {"attention mask given (MiniMax-H3 packs no mask)": 1}


@pytest.mark.parametrize("lever", ["modulation", "gated_residual", "swiglu"])
def test_each_block_lever_alone_is_bitwise(lever):
    inputs = tiny_inputs()
    ref = forward(tiny_model(), inputs)
    model = tiny_model()
    setting = {"modulation": "exact"}.get(lever, "on")
    install(model, plan(**{lever: setting}), registry=LEVERS)
    reset_counters()
    _assert_equal(forward(model, inputs), ref)
    assert counters()[f"{lever}.fused"] > 0 and f"{lever}.fallback" not in counters()


@pytest.mark.slow  # the FP8 fused kernel in the interpreter at every block
def test_fused_fp8_codes_fall_back_to_diffusers_attention_when_cudnn_cannot_run():
    """qk_norm_rope=fused_fp8 runs its kernel; cudnn_fp8 cannot run on the CPU, so the codes are
    dequantised (code * descale) and diffusers' attention runs, counted with cuDNN's reason. Tolerance:
    e4m3 q/k/v (2^-4 relative per element) diluted by the residual stream: 2% of the outputs' norm."""
    inputs = tiny_inputs()
    ref = forward(tiny_model(), inputs)
    model = tiny_model()
    install(model, plan({"fp8_scales": {}}, attention="cudnn_fp8", fp8_scales="dynamic", qk_norm_rope="fused_fp8"),
            registry=LEVERS)
    reset_counters()
    out = forward(model, inputs)
    assert counters() == {"attention.fallback": 2, "qk_norm_rope.fused": 2}
    assert fallback_reasons()["attention"] == {"cuDNN FP8 SDPA needs a CUDA device (tensors on cpu)": 2}
    for a, b in zip(out, ref):
        assert float((a.float() - b.float()).norm() / b.float().norm()) < 0.02
