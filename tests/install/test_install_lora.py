"""LoRAs and an installed plan (install/lora.py), on the tiny pipeline with a seeded LoRA loaded through diffusers'
own path (`MiniMaxH3LoraLoaderMixin.load_lora_weights`, PEFT): fused before install it is a checkpoint like any
other (bitwise against diffusers' eager forward of the same fused weights, AdaLN tables built from the merged
weights); PEFT layers at install and a LoRA loaded after install are refused in one line; never wrong bits.
"""

import pytest
import torch

pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
pytest.importorskip("peft", reason="diffusers' LoRA loading needs peft (the test extra)")

import h3plan  # noqa: E402
from h3plan.errors import InstallError  # noqa: E402
from h3plan.install import counters, install, installed_plan, reset_counters, uninstall  # noqa: E402
from test_install_pipeline import _cfg  # noqa: E402

RANK = 4
STEPS = 3  # 2 transformer forwards
TARGETS = ("attn.to_q", "attn.to_v", "ff.net.2", "adaln_proj.linear")  # published H3 LoRAs reach the AdaLN projections too


def _pipe():
    from h3plan.actions.pipeline_build import build_pipeline

    return build_pipeline(_cfg("conf/model/h3_tiny.yaml"), _cfg("conf/vae/h3_tiny_pipe.yaml"), vae_name="h3_tiny_pipe",
                          layers=1)


def _lora(pipe, seed=5):
    """A seeded diffusers-format LoRA state dict (`transformer.`-prefixed lora_A / lora_B) for TARGETS."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for path in TARGETS:
        lin = pipe.transformer.transformer_blocks[0].get_submodule(path)
        key = f"transformer.transformer_blocks.0.{path}"
        sd[f"{key}.lora_A.weight"] = torch.randn(RANK, lin.in_features, generator=g).to(torch.bfloat16) * 0.5
        sd[f"{key}.lora_B.weight"] = torch.randn(lin.out_features, RANK, generator=g).to(torch.bfloat16) * 0.5
    return sd


def _fused(pipe):
    pipe.load_lora_weights(_lora(pipe))
    pipe.fuse_lora()
    pipe.unload_lora_weights()
    return pipe


def _plan():
    return h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe",
                                 **{"levers.attention": "sdpa", "levers.adaln_table": "on", "levers.vae_ops": "eager",
                                    "levers.vae_graphs": "off", "levers.qk_norm_rope": "eager", "levers.modulation": "eager",
                                    "levers.gated_residual": "off", "levers.swiglu": "off"})


def _latents(pipe):
    from h3plan.actions.pipeline_build import prompt_inputs, run_block

    st = run_block(pipe, "denoise", **prompt_inputs(pipe, 4, seed=0), height=32, width=32, num_frames=124,
                   num_inference_steps=STEPS, generator=torch.Generator().manual_seed(0))
    return st.get("latents"), st.get("audio_latents")


def _same(a, b):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.slow  # runs the denoise loop
def test_fused_lora_installs_like_any_checkpoint():
    pipe, ref, plain = _fused(_pipe()), _fused(_pipe()), _pipe()
    want = _latents(ref)
    assert not torch.equal(want[0], _latents(plain)[0])  # the LoRA changes the output (the test can fail)
    install(pipe, _plan(), num_inference_steps=STEPS)
    reset_counters()
    _same(_latents(pipe), want)
    c = counters()
    assert c.get("adaln_table.fused", 0) == 2 * (STEPS - 1) and not c.get("adaln_table.fallback"), dict(c)
    uninstall(pipe)


@pytest.mark.parametrize("fuse", [False, True], ids=["unfused", "fused-layers-kept"])
def test_peft_layers_at_install_are_refused(fuse):
    pipe = _pipe()
    pipe.load_lora_weights(_lora(pipe))
    if fuse:
        pipe.fuse_lora()
    with pytest.raises(InstallError) as e:
        install(pipe, _plan())
    msg = str(e.value)
    assert "\n" not in msg and "PEFT layers" in msg and "pipe.unload_lora_weights()" in msg
    assert ("fused, layers kept" if fuse else "not fused") in msg
    assert installed_plan(pipe.transformer) is None and installed_plan(pipe.vae) is None  # all or nothing


@pytest.mark.slow  # runs the denoise loop
def test_lora_loaded_after_install_is_refused_then_loads_after_uninstall():
    from h3plan.install.lora import peft_layers

    pipe, ref = _pipe(), _pipe()
    install(pipe, _plan(), num_inference_steps=STEPS)
    with pytest.raises(InstallError) as e:
        pipe.load_lora_weights(_lora(pipe))
    msg = str(e.value)
    assert "\n" not in msg and "after h3plan.install" in msg and "h3plan.uninstall(pipe)" in msg
    assert not peft_layers(pipe.transformer)  # refused before any layer was touched
    _same(_latents(pipe), _latents(ref))  # and the plan still runs the model as it was
    uninstall(pipe)
    pipe.load_lora_weights(_lora(pipe))  # diffusers' own path again
    assert peft_layers(pipe.transformer)


@pytest.mark.slow  # runs the denoise loop
def test_peft_layers_injected_after_install_refuse_at_the_call():
    from peft import LoraConfig, inject_adapter_in_model

    pipe = _pipe()
    install(pipe, _plan(), num_inference_steps=STEPS)
    inject_adapter_in_model(LoraConfig(r=RANK, target_modules=["adaln_proj.linear"]), pipe.transformer)
    with pytest.raises(InstallError) as e:
        _latents(pipe)
    assert "\n" not in str(e.value) and "the tabled AdaLN linear is now peft." in str(e.value)
