"""What the headline plan says about the NVFP4 levers: where their kernels were checked (hardware.verified
kernels_checked / kernels_checked_on) and that the FP4 GEMM never ran, derived from the hardware YAML."""

import pytest

from h3plan.errors import ConfigError

NVFP4 = ("gemm_quant", "nvfp4_producer_quant", "nvfp4_out_quant")
HEADLINE = ["hardware=sm107", "recipe=nvfp4", "parallel=u8"]
UNCHECKED = ["hardware.verified.kernels_checked_on=null", "hardware.verified.kernels_checked={}"]
CHECKED = ["hardware.verified.kernels_checked_on=sm90",
           "hardware.verified.kernels_checked={gemm_quant: [nvfp4], nvfp4_producer_quant: ['on'], nvfp4_out_quant: "
           "['on']}"]


def reasons(plan, lever):
    return next(d for d in plan.decisions if d.lever == lever).reasons


def test_without_the_gpu_fact_the_plan_claims_the_interpreter_only(plan):
    p = plan(*HEADLINE, *UNCHECKED)
    for lever in NVFP4:
        assert "kernel checked against the reference in the CPU interpreter only, never on a GPU; FP4 GEMM never ran" \
            in reasons(p, lever), lever


def test_the_yaml_fact_names_the_gpu(plan):
    assert "kernel checked on sm90 against the reference; FP4 GEMM never ran" in reasons(plan(*HEADLINE), "gemm_quant")
    p = plan(*HEADLINE, *CHECKED)
    for lever in NVFP4:
        assert "kernel checked on sm90 against the reference; FP4 GEMM never ran" in reasons(p, lever), lever
        assert not next(d for d in p.decisions if d.lever == lever).hardware_verified


def test_forced_settings_carry_it_too(plan):
    p = plan(*HEADLINE, *CHECKED, "levers.nvfp4_out_quant=on")
    assert "kernel checked on sm90 against the reference; FP4 GEMM never ran" in reasons(p, "nvfp4_out_quant")


def test_a_verified_setting_says_nothing_and_the_gemm_clause_follows_the_gemm(plan):
    p = plan(*HEADLINE, *CHECKED, "hardware.verified.settings={gemm_quant: [nvfp4]}")
    assert not any("kernel checked" in r for r in reasons(p, "gemm_quant"))
    assert "kernel checked on sm90 against the reference" in reasons(p, "nvfp4_out_quant")


def test_kernels_checked_is_validated(plan):
    with pytest.raises(ConfigError, match="kernels_checked.nvfp4_out_quant"):
        plan(*HEADLINE, "hardware.verified.kernels_checked_on=sm90",
             "hardware.verified.kernels_checked={nvfp4_out_quant: [fast]}")
    with pytest.raises(ConfigError, match="needs kernels_checked_on"):
        plan(*HEADLINE, "hardware.verified.kernels_checked_on=null",
             "hardware.verified.kernels_checked={nvfp4_out_quant: ['on']}")


def test_producer_blockers(plan):
    from h3plan.errors import PlanningError

    with pytest.raises(PlanningError, match="modulation is eager"):
        plan(*HEADLINE, "levers.modulation=eager", "levers.nvfp4_producer_quant=on")
    p = plan(*HEADLINE, "levers.swiglu=off")
    d = next(d for d in p.decisions if d.lever == "nvfp4_producer_quant")
    assert d.setting == "off" and "swiglu is off" in d.reasons[0]
