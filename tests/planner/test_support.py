"""Support (h3plan/facts/support.py): the planning boundary's one "supported or why not" answer, as the attention
registry (supports / select) and a lever's settings (levers.base.support) give it."""

import pytest

from h3plan.facts import attention, hardware
from h3plan.facts.support import Support
from h3plan.levers import base


def test_truthiness_str_and_equality():
    assert Support.yes() and Support.of(None) and Support.of([]) and str(Support.yes()) == ""
    no = Support.no("no FA4", "cuDNN too old")
    assert not no and str(no) == "no FA4; cuDNN too old" and list(no) == ["no FA4", "cuDNN too old"]
    assert no == ["no FA4", "cuDNN too old"] == Support.of(("no FA4", "cuDNN too old")) and no != Support.yes()
    assert Support.of("one reason").reason == "one reason" and Support.yes().reason is None
    assert (Support.yes() + ["ring"]) == Support.no("ring")
    with pytest.raises(ValueError):
        Support.no()


def test_the_registry_answers_support():
    sm90 = hardware.load("sm90")
    assert isinstance(attention.supports("fa4", sm90), Support) and attention.supports("fa4", sm90)
    no_fa4 = {**sm90, "fa4": {**sm90["fa4"], "bf16": False}}
    pick, passed = attention.select(["fa4", "sdpa"], no_fa4)
    assert pick == "sdpa" and isinstance(passed["fa4"], Support) and not passed["fa4"]


def test_a_lever_setting_answers_support(compose):
    from h3plan import levers, planner
    from h3plan.planning import checkpoint, schema

    sections = schema.validate(checkpoint.with_model_path(compose("hardware=sm90", "recipe=bf16")))
    ctx = planner.context(sections, request=sections.pop("sequence"))
    gemm = levers.REGISTRY["gemm_quant"]
    sup = base.support(ctx, levers.SPECS["gemm_quant"], "fp8", gemm.blockers)
    assert isinstance(sup, Support) and not sup and "policy lossless" in str(sup)
    assert base.support(ctx, levers.SPECS["gemm_quant"], "bf16", gemm.blockers)
