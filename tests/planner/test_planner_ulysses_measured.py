"""Multi-GPU measurements in the hardware config (`measured.ulysses`): the overlap A/B and the all-to-all
rate at a Ulysses degree drive that degree's plans; a degree never measured keeps the borrowed rule and
the NVLink estimate, and says so."""

import pytest

from h3plan.planner import resolve


def _hydra(*overrides):
    from hydra import compose, initialize_config_dir

    from h3plan.planning import schema
    from h3plan.cli import CONFIG_PATH

    schema.register()
    with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("u, S, runs", [(2, 37820, "0.995x"), (2, 19000, "0.962x"), (2, 104076, "0.995x"),
                                        (4, 37820, "0.948x"), (4, 19000, "0.940x")])
def test_sm90_measured_degrees_turn_the_overlap_off(plan, u, S, runs):
    d = plan("hardware=sm90", "recipe=bf16", f"parallel=u{u}", f"parallel.seq_len={S}").decision("ulysses_overlap")
    assert d.setting == "off" and not d.forced
    assert f"overlap on vs off {runs}" in d.reasons[0] and "not faster in every run" in d.reasons[0]
    assert f"degree {u}, " in d.reasons[0] and "ulysses-h200x2.json, ulysses-h200x4.json" in d.reasons[0]


def test_a_degree_never_measured_keeps_the_borrowed_rule(plan):
    d = plan("hardware=sm90", "recipe=bf16", "parallel=u8").decision("ulysses_overlap")
    assert d.setting == "on" and "never measured at degree 8 on sm90" in d.reasons[0]


def test_forcing_the_overlap_on_still_works_where_measured_slower(plan):
    d = plan("hardware=sm90", "recipe=bf16", "parallel=u2", "levers.ulysses_overlap=on").decision("ulysses_overlap")
    assert d.setting == "on" and d.forced and d.param("chunks") == 2 and d.param("chunk_heads") == [14, 14]


def test_a_measured_faster_overlap_turns_it_on():
    over = ("hardware.measured.ulysses.overlap=[{degree:2,seq_len:37820,speedups:[1.02,1.01]}]")
    d = resolve(_hydra("hardware=sm90", "parallel=u2", over)).decision("ulysses_overlap")
    assert d.setting == "on"
    assert "overlap on vs off 1.020x, 1.010x" in d.reasons[0]
    assert "faster in every run" in d.reasons[0]


def test_the_all_to_all_estimate_uses_the_measured_rate_at_that_degree_only(plan):
    p2 = plan("hardware=sm90", "recipe=bf16", "parallel=u2")
    leaving = p2.derived_value("a2a_bytes_leaving_rank_per_block")
    assert p2.derived_value("a2a_ms_per_block_est") == pytest.approx(leaving / 238.1e9 * 1e3, abs=1e-3)
    assert ("238.1 GB/s, all_to_all_single measured on sm90 at degree 2"
            in p2.derived_value("basis")["a2a_ms_per_block_est"])
    p4 = plan("hardware=sm90", "recipe=bf16", "parallel=u4")
    assert p4.derived_value("a2a_ms_per_block_est") == pytest.approx(
        p4.derived_value("a2a_bytes_leaving_rank_per_block") / 235.0e9 * 1e3, abs=1e-3)
    p8 = plan("hardware=sm90", "recipe=bf16", "parallel=u8")
    leaving8 = p8.derived_value("a2a_bytes_leaving_rank_per_block")
    assert p8.derived_value("a2a_ms_per_block_est") == pytest.approx(leaving8 / 450e9 * 1e3, abs=1e-3)
    assert "never measured at degree 8 on sm90" in p8.derived_value("basis")["a2a_ms_per_block_est"]


def test_other_hardware_has_no_ulysses_measurements(plan):
    d = plan("hardware=sm107", "recipe=bf16", "parallel=u2").decision("ulysses_overlap")
    assert "never measured at degree 2 on sm107" in d.reasons[0]


# ---- ulysses_exchange: packed or per-destination projections ----------------------------------------------

@pytest.mark.parametrize("S, pick", [(37820, "projection_split"), (104076, "projection_split"),
                                     (19000, "projection_split")])
def test_sm90_measured_exchanges_pick_the_fastest_for_bf16_at_degree_2(plan, S, pick):
    # the median run decides: at 37,820 projection 1.021x (of 5 runs) against projection_split 1.025x (of 3)
    d = plan("hardware=sm90", "recipe=bf16", "parallel=u2", f"parallel.seq_len={S}").decision("ulysses_exchange")
    assert d.setting == pick and not d.forced and d.lossless and d.hardware_verified
    long = ("1.034x, 1.011x, 1.050x, 1.021x, 1.010x", "1.025x, 1.027x, 1.016x")
    runs = {37820: long, 104076: long, 19000: ("1.070x, 1.030x, 1.064x, 1.016x", "1.086x, 1.039x")}[S]
    assert f"projection vs packed {runs[0]}" in d.reasons[0] and f"projection_split vs packed {runs[1]}" in d.reasons[0]
    assert d.reasons[0].count("faster in every run") == 2 and "parallel-exchange-h200x2.json" in d.reasons[0]
    assert d.reasons[0].endswith(f"; {pick}: " + ("the q/k/v exchange hides behind the projection GEMMs and the "
                                                  "seq-major copies are gone" if pick == "projection" else
                                                  "the q/k/v exchange hides behind the projection GEMMs, the output "
                                                  "exchange behind this rank's own rows' attention"))


def test_the_split_exchange_needs_whole_destination_row_blocks(plan):
    from h3plan.errors import PlanningError

    # 19,001 tokens pad: the bf16 plan's padding is valid_only, so the split exchange is passed over
    d = plan("hardware=sm90", "recipe=bf16", "parallel=u2", "parallel.seq_len=19001").decision("ulysses_exchange")
    assert d.setting == "projection" and "projection_split vs packed 1.086x, 1.039x" in d.reasons[0]
    assert ("but ulysses_padding is valid_only: the split output exchange sends whole destination row blocks"
            in d.reasons[0])
    with pytest.raises(PlanningError, match="ulysses_padding is valid_only: the split output exchange"):
        plan("hardware=sm90", "recipe=bf16", "parallel=u2", "parallel.seq_len=19001",
             "levers.ulysses_exchange=projection_split")
    d = plan("hardware=sm90", "recipe=bf16", "parallel=u2", "parallel.seq_len=19001", "levers.ulysses_padding=padded",
             "levers.ulysses_exchange=projection_split").decision("ulysses_exchange")
    assert d.setting == "projection_split" and d.forced and d.hardware_verified


def test_projection_exchange_is_not_borrowed_by_an_unmeasured_degree_or_hardware(plan):
    d = plan("hardware=sm90", "recipe=bf16", "parallel=u4").decision("ulysses_exchange")
    assert d.setting == "packed" and "never measured at degree 4 on sm90" in d.reasons[0]
    d = plan("hardware=sm100", "recipe=bf16", "parallel=u2").decision("ulysses_exchange")
    assert d.setting == "packed" and "never measured at degree 2 on sm100" in d.reasons[0]
    d = plan("hardware=sm90", "recipe=bf16", "parallel=u1").decision("ulysses_exchange")
    assert d.setting == "packed" and "degree 1" in d.reasons[0]


def test_a_measured_slower_projection_exchange_stays_packed():
    over = "hardware.measured.ulysses.exchange=[{degree:2,seq_len:37820,speedups:[1.02,0.99]}]"
    d = resolve(_hydra("hardware=sm90", "recipe=bf16", "parallel=u2", over)).decision("ulysses_exchange")
    assert d.setting == "packed" and "1.020x, 0.990x" in d.reasons[0] and "not faster in every run" in d.reasons[0]
    assert "projection_split" not in d.reasons[0]  # the override replaced every measured exchange


@pytest.mark.parametrize("overrides, text", [
    (("recipe=fp8",), "qk_norm_rope is fused_fp8"),
    (("levers.qk_norm_rope=eager",), "qk_norm_rope is eager"),
    (("levers.ulysses_overlap=on",), "ulysses_overlap is on"),
    (("recipe=fp8", "levers.qk_norm_rope=fused", "levers.attention=fa4"), "gemm_quant is fp8"),
])
def test_projection_exchange_picks_packed_where_it_cannot_run_and_refuses_when_forced(plan, overrides, text):
    from h3plan.errors import PlanningError

    d = plan("hardware=sm90", "recipe=bf16", "parallel=u2", *overrides).decision("ulysses_exchange")
    assert d.setting == "packed" and text in d.reasons[0]
    with pytest.raises(PlanningError, match="levers.ulysses_exchange=projection cannot apply: .*" + text):
        plan("hardware=sm90", "recipe=bf16", "parallel=u2", *overrides, "levers.ulysses_exchange=projection")
    with pytest.raises(PlanningError, match="Ulysses degree 1: there is no exchange"):
        plan("hardware=sm90", "recipe=bf16", "parallel=u1", "levers.ulysses_exchange=projection")
