"""The fa4_tile lever: tuned where the hardware lists a measured tile for the model's head dim, attention
is fa4 and every measured run (attention alone, whole block) timed it faster; default everywhere else; a
forced `tuned` that cannot apply is a one-line error."""

import pytest

from h3plan.planner import PlanningError, resolve


def _hydra_compose(*overrides):
    """Hydra's own compose: a list of structured tiles is an override the shared fixture cannot merge."""
    from hydra import compose, initialize_config_dir

    from h3plan.planning import schema
    from h3plan.cli import CONFIG_PATH

    schema.register()
    with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))

TILE = {"tile_m": 192, "tile_n": 128, "mma_pv_is_rs": False, "intra_wg_overlap": True}


def _tile_yaml(measured: str, bitwise: str = "true") -> str:
    return ("hardware.fa4.tuned_tiles=[{head_dim:128,tile_m:192,tile_n:128,mma_pv_is_rs:false,intra_wg_overlap:true,"
            f"bitwise_vs_default:{bitwise},measured:[{measured}],source:probe-x}}]")


def test_tuned_where_attention_and_block_runs_all_timed_it_faster():
    cfg = _hydra_compose("hardware=sm90",
                         _tile_yaml("{seq_len:19000,heads:56,speedups:[1.05,1.04],block_speedups:[1.01]}"))
    d = resolve(cfg).decision("fa4_tile")
    assert (d.setting, d.lossless, d.forced) == ("tuned", True, False)
    assert d.param("tile") == TILE and d.param("attention") == "fa4"
    assert ("bit-identical to FA4's default tile and faster in every run at 19,000 x 56 (nearest measured shape): "
            "1.050x, 1.040x attention alone; 1.010x whole block (probe-x)") in d.reasons[0]


def test_tuned_on_attention_runs_alone_when_no_block_run_exists():
    d = resolve(_hydra_compose("hardware=sm90",
                               _tile_yaml("{seq_len:19000,heads:56,speedups:[1.05]}"))).decision("fa4_tile")
    assert d.setting == "tuned" and "1.050x (probe-x)" in d.reasons[0]


def test_a_slower_block_run_keeps_the_default():
    cfg = _hydra_compose("hardware=sm90",
                         _tile_yaml("{seq_len:19000,heads:56,speedups:[1.05,1.04],block_speedups:[0.99]}"))
    d = resolve(cfg).decision("fa4_tile")
    assert d.setting == "default" and "0.990x whole block over the runs, not faster in every run" in d.reasons[0]


def test_sm90_keeps_the_default_at_both_measured_lengths(plan):
    """The H200 record: faster alone at 19,000 but not in the whole block; the runs disagree at 37,820."""
    d = plan("hardware=sm90", "recipe=bf16", "parallel.seq_len=19000").decision("fa4_tile")
    assert d.setting == "default" and d.param("tile") is None
    assert "1.054x, 1.042x attention alone; 0.991x whole block over the runs, not faster in every run" in d.reasons[0]
    assert "attention-tuning-h200.json" in d.reasons[0] and "block-ab-h200.json" in d.reasons[0]
    d = plan("hardware=sm90", "parallel.seq_len=37820").decision("fa4_tile")
    assert d.setting == "default" and "1.031x, 0.972x attention alone; 1.008x whole block" in d.reasons[0]
    forced = plan("hardware=sm90", "parallel.seq_len=37820", "levers.fa4_tile=tuned").decision("fa4_tile")
    assert forced.setting == "tuned" and forced.forced and forced.param("tile") == TILE
    assert forced.hardware_verified  # the H200 GPU suite and the block A/B ran it


@pytest.mark.parametrize("overrides, why", [
    (["hardware=sm100"], "sm100: no measured FA4 tile"),
    (["hardware=sm107", "recipe=bf16"], "sm107: no measured FA4 tile"),
    (["hardware=sm90", "recipe=fp8"], "attention is cudnn_fp8, not fa4"),
    (["hardware=sm90", "levers.attention=sdpa"], "attention is sdpa, not fa4"),
    (["hardware=sm90", "model.diffusers_config.attention_head_dim=64",
      "model.diffusers_config.rope_freq_dim=8"], "no measured FA4 tile for this head dim"),
])
def test_default_elsewhere(plan, overrides, why):
    d = plan(*overrides).decision("fa4_tile")
    assert d.setting == "default" and why in d.reasons[0] and d.param("tile") is None


@pytest.mark.parametrize("overrides, why", [
    (["hardware=sm90", "levers.attention=cudnn_bf16"], "attention is cudnn_bf16: fa4_tile=tuned needs fa4"),
    (["hardware=sm103"], "sm103 lists no measured FA4 tile for head_dim 128"),
])
def test_forced_tuned_that_cannot_apply(plan, overrides, why):
    with pytest.raises(PlanningError, match="levers.fa4_tile=tuned cannot apply: " + why):
        plan(*overrides, "levers.fa4_tile=tuned")


LOSSY_TILE = ("hardware.fa4.tuned_tiles=[{head_dim:128,tile_m:128,tile_n:176,mma_pv_is_rs:true,intra_wg_overlap:true,"
              "bitwise_vs_default:false,measured:[{seq_len:19000,heads:56,speedups:[1.01,1.02]}],source:test}]")


def test_a_tile_that_changes_the_bits_stays_off_under_a_lossless_recipe():
    d = resolve(_hydra_compose("hardware=sm90", LOSSY_TILE)).decision("fa4_tile")
    assert d.setting == "default" and "changes FA4's bits and the recipe is lossless" in d.reasons[0]
    with pytest.raises(PlanningError, match="policy lossless and the sm90 tile \\(128, 176\\), P in registers changes"):
        resolve(_hydra_compose("hardware=sm90", LOSSY_TILE, "levers.fa4_tile=tuned"))
    budget = resolve(_hydra_compose("hardware=sm90", LOSSY_TILE, "recipe=fp8",
                                    "levers.attention=fa4")).decision("fa4_tile")
    assert budget.setting == "tuned" and "not bit-identical" in budget.reasons[0]


def test_forced_default_and_unverified_hardware(plan):
    d = plan("hardware=sm90", "levers.fa4_tile=default").decision("fa4_tile")
    assert d.setting == "default" and d.forced and d.hardware_verified
    assert not plan("hardware=sm100").decision("fa4_tile").hardware_verified
