"""vae_encode_precision installed into diffusers' AutoencoderKLMiniMaxH3 (tiny config, CPU): the encode path
(encoder, quant_conv) cast, the decoder untouched, uninstall bit for bit, the default plan's encode bitwise.

Numeric contract: the fp32 / off plans: rtol=0, atol=0 against diffusers' encode; a forced fp16 / bf16 encode: the
latent mean within ENCODE_TOL of the fp32 encode's (relative to the mean's largest magnitude) on seeded inputs in
[-1, 1], as the pipeline hands keyframes over (a lossy lever's tolerance, stated here; its effect on the frames is
never measured on the CPU).
"""

import pytest
import torch

import h3plan
from h3plan.install import install, uninstall
from test_install_vae import tiny_vae

FL2VA = {"video.task": "fl2va", "video.keyframes": ["first", "last"]}
ENCODE_TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}  # measured on the CPU: 8.1e-4, 7.0e-3


def _plan(**over):
    return h3plan.resolve_config(hardware="sm90", recipe="bf16", model="h3_tiny", vae="h3_tiny_pipe",
                                 **{"levers.vae_graphs": "off", **over})


def _encode(vae, x):
    with torch.no_grad():
        return vae.encode(x).latent_dist.mean


def _x(seed=3, frames=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, 3, frames, 64, 64, generator=g) * 2 - 1


def _state(vae):
    return {k: v.clone() for k, v in vae.state_dict().items()}


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("over", [{}, FL2VA], ids=["t2va-off", "fl2va-fp32"])
def test_default_plans_leave_the_encode_bitwise_and_install_nothing_into_it(over):
    vae, ref = tiny_vae(), tiny_vae()
    plan = _plan(**over)
    want = "fp32" if over else "off"
    assert plan.decision("vae_encode_precision").setting == want
    report = install(vae, plan)
    assert any(lv == "vae_encode_precision" for lv, _ in report.skipped), report.skipped
    assert {p.dtype for p in vae.encoder.parameters()} == {torch.float32}
    x = _x()
    torch.testing.assert_close(_encode(vae, x), _encode(ref, x), rtol=0, atol=0)
    uninstall(vae)


@pytest.mark.parametrize("dtype,name", [(torch.float16, "fp16"), (torch.bfloat16, "bf16")])
def test_forced_lossy_encode_casts_only_the_encode_path_within_tolerance_and_uninstall_restores_it(dtype, name):
    vae, ref = tiny_vae(), tiny_vae()
    before = _state(vae)
    plan = _plan(**FL2VA, **{"recipe.vae": "fp16", "levers.vae_precision": "fp32", "levers.vae_encode_precision": name})
    d = plan.decision("vae_encode_precision")
    assert (d.setting, d.lossless, d.forced) == (name, False, True)
    assert any("outside the measured budget" in r for r in d.reasons)
    report = install(vae, plan)
    assert "vae_encode_precision" in " ".join(report.notes)
    assert {p.dtype for p in vae.encoder.parameters()} == {dtype}
    assert {p.dtype for p in vae.quant_conv.parameters()} == {dtype}
    assert {p.dtype for p in vae.decoder.parameters()} == {torch.float32}  # the decode levers' business only
    assert {p.dtype for p in vae.post_quant_conv.parameters()} == {torch.float32}
    x = _x()
    got, want = _encode(vae, x), _encode(ref, x)
    assert got.dtype == dtype
    err = (got.float() - want).abs().max() / want.abs().max()
    assert 0 < err <= ENCODE_TOL[dtype], float(err)  # lossy (not bitwise), and within the stated tolerance
    z = torch.randn(1, TINY_LATENT, 2, 4, 4, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():  # the decoder is untouched: its output bit for bit
        torch.testing.assert_close(vae.decode(z).sample, ref.decode(z).sample, rtol=0, atol=0)
    uninstall(vae)
    _same(_state(vae), before)
    torch.testing.assert_close(_encode(vae, x), want, rtol=0, atol=0)


def test_the_encode_cast_and_the_decode_cast_stack_and_uninstall_restores_both():
    vae = tiny_vae()
    before = _state(vae)
    plan = _plan(**FL2VA, **{"recipe.vae": "fp16", "levers.vae_encode_precision": "fp16"})
    assert plan.decision("vae_precision").setting == "fp16"
    install(vae, plan)
    assert {p.dtype for p in vae.encoder.parameters()} == {torch.float16}
    assert vae.decoder.transformer_blocks[0].attn.to_q.weight.dtype == torch.float16
    uninstall(vae)
    _same(_state(vae), before)


def test_an_encoder_loaded_in_another_dtype_is_left_with_the_reason():
    vae = tiny_vae()
    vae.encoder.to(torch.bfloat16)
    report = install(vae, _plan(**FL2VA, **{"recipe.vae": "fp16", "levers.vae_precision": "fp32",
                                            "levers.vae_encode_precision": "fp16"}))
    why = dict(report.skipped)["vae_encode_precision"]
    assert "not float32" in why and {p.dtype for p in vae.encoder.parameters()} == {torch.bfloat16}
    uninstall(vae)


TINY_LATENT = tiny_vae().config.latent_channels


FP8 = {**FL2VA, "recipe": "fp8", "levers.vae_ops": "eager"}  # vae_tiles=fp8_tiles: the decode re-tiled (288x272/32)


def _fp8_plan(**over):
    return h3plan.resolve_config(hardware="sm90", model="h3_tiny", vae="h3_tiny_pipe",
                                 **{"levers.vae_graphs": "off", **FP8, **over})


def test_encode_tiles_default_keeps_the_encode_at_the_vaes_own_tiles_while_the_decode_retiles():
    vae, ref = tiny_vae(), tiny_vae()
    plan = _fp8_plan()
    assert (plan.decision("vae_tiles").setting, plan.decision("vae_encode_tiles").setting) == ("fp8_tiles", "default")
    before = (vae.tile_sample_min_height, vae.tile_sample_min_width, vae.tile_sample_min_overlap_height)
    report = install(vae, plan)
    assert vae.tile_sample_min_height != before[0]  # the decode's geometry changed
    assert "its own tiles" in " ".join(report.notes)
    x = torch.rand(1, 3, 1, 416, 416, generator=torch.Generator().manual_seed(2)) * 2 - 1  # two tiles a side either way
    torch.testing.assert_close(_encode(vae, x), _encode(ref, x), rtol=0, atol=0)  # the encode's bits kept
    after = (vae.tile_sample_min_height, vae.tile_sample_min_width, vae.tile_sample_min_overlap_height)
    assert after != before  # restored to the decode's geometry after the call
    uninstall(vae)
    assert "_encode" not in vae.__dict__
    assert (vae.tile_sample_min_height, vae.tile_sample_min_width, vae.tile_sample_min_overlap_height) == before


def test_encode_tiles_decode_shares_the_decode_geometry_and_changes_the_latents():
    vae, ref = tiny_vae(), tiny_vae()
    install(vae, _fp8_plan(**{"levers.vae_encode_tiles": "decode"}))
    assert "_encode" not in vae.__dict__
    x = torch.rand(1, 3, 1, 416, 416, generator=torch.Generator().manual_seed(2)) * 2 - 1
    assert not torch.equal(_encode(vae, x), _encode(ref, x))
    uninstall(vae)
