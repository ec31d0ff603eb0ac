"""Plans for what the user holds: a VAE alone or a transformer alone, at diffusers' own small
test configs (diffusers' tests/models/autoencoders/test_models_autoencoder_kl_minimax_h3.py and
tests/models/transformers/test_models_transformer_minimax_h3.py, get_init_dict), through h3plan.plan_for and
h3plan.install: the plan sizes and checks the memory of the component it will install only (memory.holds), not a
pipeline's transformer at the default request, and installs and uninstalls."""

import pytest
import torch

import h3plan

# diffusers' own small configs (the files above): only the values, as the models take them
DIFFUSERS_TEST_VAE = dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16),
                          layers_per_block=1, spatial_downsample_factors=(2, 2), temporal_downsample_factors=(2, 2),
                          norm_num_groups=8, decoder_num_layers=2, decoder_num_attention_heads=2,
                          decoder_attention_head_dim=8, decoder_num_register_tokens=2, decoder_ffn_mult=2,
                          clip_length=17, token_drop=3, latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4)
DIFFUSERS_TEST_TRANSFORMER = dict(num_attention_heads=2, attention_head_dim=16, hidden_size=24, num_layers=2,
                                  num_refiner_layers=2, ffn_dim=32, in_channels=4, audio_in_channels=6,
                                  patch_size=(1, 2, 2), text_dim=8, freq_dim=8, time_embed_hidden_dim=24,
                                  time_embed_dim=16, rope_freq_dim=2)


def _vae():
    from diffusers import AutoencoderKLMiniMaxH3

    torch.manual_seed(0)
    return AutoencoderKLMiniMaxH3(**DIFFUSERS_TEST_VAE).eval()


def _transformer():
    from diffusers import MiniMaxH3Transformer3DModel

    torch.manual_seed(0)
    return MiniMaxH3Transformer3DModel(**DIFFUSERS_TEST_TRANSFORMER).eval()


def test_a_lone_vae_plans_the_vae_only():
    plan = h3plan.plan_for(_vae(), recipe="bf16", hardware="sm90")
    assert plan.get("memory")["holds"] == "vae" and plan.derived_value("memory_peak_phase") == "decode"
    items = plan.derived_value("memory_breakdown_gib")
    assert "vae_weights" in items and not {"transformer_weights", "block_activations", "audio_vae_weights"} & set(items)
    assert plan.derived_value("memory_peak_gib_per_gpu") < 10  # the 768x1344x124 decode of this VAE, nothing else


def test_a_lone_transformer_plans_the_transformer_only():
    plan = h3plan.plan_for(_transformer(), recipe="bf16", hardware="sm90")
    assert plan.get("memory")["holds"] == "transformer" and plan.derived_value("memory_peak_phase") == "denoise"
    assert not ({"vae_weights", "vae_decode", "video_postprocess", "audio_vae_weights"}
                & set(plan.derived_value("memory_breakdown_gib")))
    assert plan.derived_value("memory_peak_gib_per_gpu") < 1


def test_a_pipeline_still_plans_every_model():
    plan = h3plan.resolve_config(hardware="sm90", recipe="bf16")
    assert plan.get("memory")["holds"] == "pipeline"
    assert ({"transformer_weights", "vae_weights", "audio_vae_weights"}
            <= set(plan.derived_value("memory_breakdown_gib")))


def test_memory_holds_is_checked():
    with pytest.raises(h3plan.H3PlanError, match=r"memory.holds=everything: allowed: pipeline, transformer, vae"):
        h3plan.resolve_config(hardware="sm90", **{"memory.holds": "everything"})


def test_install_a_lone_vae_and_decode():
    vae = _vae()
    z = torch.randn(1, 4, 7, 2, 2, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = vae.decode(z).sample
    report = h3plan.install(vae, recipe="bf16", hardware="sm90", overrides={"levers.vae_graphs": "off"})
    assert "vae_ops" in report.swapped_levers() or any(lv.startswith("vae_ops") for lv, _ in report.skipped)
    with torch.no_grad():
        out = vae.decode(z).sample
    assert out.shape == ref.shape == (1, 3, 22, 8, 8) and torch.isfinite(out).all()
    assert h3plan.uninstall(vae) and h3plan.installed_plan(vae) is None


def test_install_a_lone_transformer():
    model = _transformer()
    report = h3plan.install(model, recipe="bf16", hardware="sm90", overrides={"levers.attention": "sdpa"})
    assert "attention" in report.swapped_levers()
    assert h3plan.uninstall(model) and h3plan.installed_plan(model) is None
