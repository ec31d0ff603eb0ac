"""fp8_act_quant decision table: per-tensor (tensor) or per-row codes from the producers (row) for the FP8
block linears. auto follows `hardware.measured.fp8_act_quant` (row only if faster at every measured length),
keeps tensor where nothing was measured, needs gemm_quant=fp8 and the fused modulation / SwiGLU settings."""

import pytest

from h3plan.errors import H3PlanError
from h3plan.levers import LeverError
from h3plan.planner import resolve
from test_scale_table_v2 import table, write

PROBE = "benchmarks/results/probes/fp8-producers-h200.json"


@pytest.mark.parametrize("overrides, setting", [
    (["hardware=sm90", "recipe=fp8"], "row"),
    (["hardware=sm90", "recipe=fp8", "parallel=u4"], "row"),
    (["hardware=sm90", "recipe=fp8", "parallel.seq_len=104076"], "row"),
    (["hardware=sm90", "recipe=bf16"], "off"),
    (["hardware=sm90", "recipe=nvfp4", "levers.gemm_quant=dequant_bf16"], "off"),
    (["hardware=sm100", "recipe=fp8"], "tensor"),
    (["hardware=sm103", "recipe=fp8"], "tensor"),
    (["hardware=sm107", "recipe=fp8"], "tensor"),
    (["hardware=sm107", "recipe=nvfp4"], "off"),
    (["hardware=sm90", "recipe=fp8", "levers.modulation=eager"], "tensor"),
    (["hardware=sm90", "recipe=fp8", "levers.swiglu=off"], "tensor"),
    (["hardware=sm90", "recipe=fp8", "levers.fp8_act_quant=tensor"], "tensor"),
    (["hardware=sm90", "recipe=fp8", "levers.modulation=fp32", "levers.fp8_act_quant=row"], "row"),
])
def test_decision_table(plan, overrides, setting):
    d = plan(*overrides).decision("fp8_act_quant")
    assert d.setting == setting
    assert d.lossless == (setting == "off")


def test_sm90_row_cites_the_probe_and_the_ulysses_argument(plan):
    d = plan("hardware=sm90", "recipe=fp8").decision("fp8_act_quant")
    assert not d.forced and d.hardware_verified  # tests/gpu/test_fp8_act_quant_gpu.py passed on the H200
    assert "at 19,000 tokens" in d.reasons[0] and "1.027x" in d.reasons[0] and PROBE in d.reasons[0]
    assert any("same at every Ulysses degree with no amax all-reduce" in r for r in d.reasons)
    assert d.param("scales") == "per row, dynamic" and d.param("producers")["ff.net.2"] == "swiglu_fp8"
    u4 = plan("hardware=sm90", "recipe=fp8", "parallel=u4").decision("fp8_act_quant")
    assert any("saves tensor's 4 amax all-reduces per block at Ulysses degree 4" in r for r in u4.reasons)


def test_unmeasured_hardware_keeps_tensor_and_says_row_never_ran(plan):
    d = plan("hardware=sm100", "recipe=fp8").decision("fp8_act_quant")
    assert "row never ran on sm100" in d.reasons[0] and d.param("scales").startswith("per tensor, dynamic")
    assert plan("hardware=sm90", "recipe=fp8",
                "levers.fp8_act_quant=tensor").decision("fp8_act_quant").hardware_verified


def _hydra(*overrides):
    from hydra import compose, initialize_config_dir

    from h3plan.planning import schema
    from h3plan.cli import CONFIG_PATH

    schema.register()
    with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_auto_keeps_tensor_when_row_lost_at_one_measured_length():
    cfg = _hydra("hardware=sm90", "recipe=fp8",
                 "hardware.measured.fp8_act_quant.block=[{seq_len:19000,speedups:[1.04]},{seq_len:37820,speedups:[1.02,0.99]}]")
    d = resolve(cfg).decision("fp8_act_quant")
    assert d.setting == "tensor" and "not faster than tensor at every measured length: 1.040x at 19,000" in d.reasons[0]


def test_auto_names_the_blocker_when_row_measured_faster_but_cannot_apply(plan):
    d = plan("hardware=sm90", "recipe=fp8", "levers.modulation=eager").decision("fp8_act_quant")
    assert "measured faster" in d.reasons[0] and "modulation is eager" in d.reasons[0]


@pytest.mark.parametrize("overrides, fault", [
    (["recipe=bf16"], "gemm_quant is bf16: row scales quantise the inputs of FP8 GEMMs (gemm_quant=fp8 only)"),
    (["recipe=fp8", "levers.gemm_quant=bf16", "recipe.checkpoint=bf16"], "gemm_quant is bf16"),
    (["recipe=fp8", "levers.swiglu=off"], "swiglu is off: row writes the ff.net.2 codes from the fused SwiGLU kernel"),
    (["recipe=fp8", "levers.modulation=eager"], "modulation is eager: row writes the to_q/k/v and ff.net.0.proj codes"),
])
def test_forced_row_that_cannot_apply_is_one_line(plan, overrides, fault):
    with pytest.raises((LeverError, H3PlanError)) as e:
        plan("hardware=sm90", *overrides, "levers.fp8_act_quant=row")
    msg = str(e.value)
    assert "levers.fp8_act_quant=row cannot apply" in msg and fault in msg and "\n" not in msg


def test_forced_off_with_fp8_gemms_is_refused(plan):
    with pytest.raises((LeverError, H3PlanError), match="gemm_quant is fp8: its linears quantise their inputs"):
        plan("hardware=sm90", "recipe=fp8", "levers.fp8_act_quant=off")


def test_static_linear_table_row_uses_the_producers_static_mode(plan, tmp_path):
    path = write(tmp_path, table())
    p = plan("hardware=sm90", "recipe=fp8", "model=h3_tiny", "recipe.fp8_scale_mode=static",
             f"recipe.fp8_static_table={path}")
    assert p.decision("gemm_quant").param("input_scales") == "static"
    d = p.decision("fp8_act_quant")
    assert d.setting == "row" and d.param("scales") == "static, from recipe.fp8_static_table"
    assert any("the producers write e4m3 with the table's scales" in r for r in d.reasons)
