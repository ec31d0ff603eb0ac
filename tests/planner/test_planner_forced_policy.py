"""Forced levers: validated, flagged, and an error listing the reasons when they cannot apply.
Lossless policy: no lossy setting, forced or auto; hardware_verified on hardware never run here."""

import itertools

import pytest

from h3plan.errors import H3PlanError
from h3plan.planner import PlanningError

ERRORS = [
    (["hardware=sm90", "levers.fa4_2cta=on"], ["sm90 has no FA4 2-CTA kernel"]),
    (["hardware=sm103", "levers.attention=cudnn_fp8"], ["policy lossless"]),
    (["levers.modulation=fp32"], ["policy lossless"]),
    (["hardware=sm90", "recipe=nvfp4"], ["sm90 has no NVFP4 GEMMs", "levers.gemm_quant=dequant_bf16"]),
    (["hardware=sm90", "recipe=nvfp4", "levers.gemm_quant=nvfp4"], ["sm90 has no NVFP4 GEMMs"]),
    (["recipe=bf16", "levers.gemm_quant=dequant_bf16"], ["nothing to dequantise"]),
    (["hardware=sm107", "recipe=nvfp4", "levers.fp8_scales=static"], ["recipe.fp8_static_table"]),
    (["hardware=sm107", "recipe=bf16", "levers.qk_norm_rope=fused_fp8"], ["policy lossless", "attention is fa4"]),
    (["parallel=u1", "levers.ulysses_padding=valid_only"], ["Ulysses degree 1"]),
    (["hardware=sm107", "recipe=nvfp4", "parallel=u8", "levers.ulysses_padding=none"], ["4 padding rows need a mode"]),
    (["hardware=sm107", "levers.vae_ops=fused"], ["no registered VAE decoder op set"]),
    (["levers.vae_tiles=custom", "recipe.policy=budget", "recipe.budget.psnr_db_min=34", "recipe.budget.ssim_min=0.97"],
     ["vae.custom_tile"]),
    (["parallel.ulysses=3"], ["must divide the 56 attention heads"]),
    (["model=h3_tiny", "parallel=u8"], ["must divide the 4 attention heads"]),
    (["parallel.seq_len=-5"], ["parallel.seq_len=-5: must be a positive integer"]),
    (["parallel=u8", "parallel.attention_chunks=8", "levers.ulysses_overlap=on"], ["exceeds the 7 heads per rank"]),
    (["parallel.attention_chunks=0"], ["must be >= 1"]),
    (["vae.custom_tile.height=100"], ["multiple of the spatial compression 16"]),
]


@pytest.mark.parametrize("overrides,fragments", ERRORS, ids=[" ".join(o) for o, _ in ERRORS])
def test_impossible_requests_fail_with_every_reason(plan, overrides, fragments):
    with pytest.raises(H3PlanError) as e:  # PlanningError, or ConfigError for values the schema rules out
        plan(*overrides)
    msg = str(e.value)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg


def test_forced_settings_are_flagged_and_explained(plan):
    p = plan("hardware=sm100", "levers.fa4_2cta=on")
    d = p.decision("fa4_2cta")
    assert (d.setting, d.forced) == ("on", True) and d.reasons[0] == "forced by levers.fa4_2cta=on"
    m = plan("recipe=fp8", "levers.modulation=fp32").decision("modulation")
    assert (m.setting, m.forced, m.lossless) == ("fp32", True, False)
    assert any("39.55" in r for r in m.reasons)
    assert not plan("hardware=sm100").decision("fa4_2cta").forced


def test_custom_tiles(plan):
    d = plan("recipe=fp8", "levers.vae_tiles=custom", "vae.custom_tile.height=320", "vae.custom_tile.width=320",
             "vae.custom_tile.overlap=48").decision("vae_tiles")
    assert d.param("tile") == {"height": 320, "width": 320, "frames": None, "overlap": 48}


HW, RECIPES, PARALLEL = ("sm90", "sm100", "sm103", "sm107"), ("bf16", "fp8", "nvfp4"), ("u1", "u2", "u4", "u8")


@pytest.mark.slow  # every hardware x recipe x degree plan (~4 s)
def test_lossless_policy_and_hardware_verified_over_every_combination(preset):
    """Every valid combination: bf16 plans are lossless; nothing on SM100/103/107 claims a hardware run."""
    invalid = []
    for hw, r, par in itertools.product(HW, RECIPES, PARALLEL):
        try:
            p = preset(hw, r, par)
        except PlanningError:
            invalid.append((hw, r))
            continue
        if r == "bf16":
            assert p.lossless, (hw, r, par)
        if hw != "sm90":
            assert not any(d.hardware_verified for d in p.decisions), (hw, r, par)
            assert all(any(x.startswith("not hardware-verified") for x in d.reasons) for d in p.decisions)
        if hw == "sm90":  # Ulysses ran over NCCL on two and four H200s, never at degree 8
            assert p.decision("ulysses_padding").hardware_verified == (par in ("u1", "u2", "u4")), par
    assert set(invalid) == {("sm90", "nvfp4")}
