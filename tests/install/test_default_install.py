"""A lever that owns one option whose values are its settings installs through levers.base.default_install: its
default value skips with the decision's first reason, any other setting sets the option; a setting that is no value
of the option is refused when the lever module is imported."""

import pytest

from h3plan.facts.decision import Decision
from h3plan.install.builder import Builder
from h3plan.levers import REGISTRY, SPECS
from h3plan.levers.base import Option, Spec, default_install, is_bool, one_of


def _decision(lever, setting):
    return Decision(lever=lever, setting=setting, reasons=(f"why {setting}",), lossless=True)


@pytest.mark.parametrize("lever, on, value", [("swiglu", "on", True), ("vae_graphs", "on", True),
                                               ("modulation", "exact", "exact"), ("compile", "regional", "regional"),
                                               ("ulysses_exchange", "projection", "projection")])
def test_sets_the_option_or_skips_with_the_reason(lever, on, value):
    (opt,) = SPECS[lever].options
    b = Builder()
    REGISTRY[lever].install(b, _decision(lever, on))
    assert b.values == {opt.key: value} and b.source == {opt.key: lever} and b.skipped == []
    off = next(s for s in SPECS[lever].settings if (s == "off" if opt.allowed == "bool" else s == opt.default))
    b = Builder()
    REGISTRY[lever].install(b, _decision(lever, off))
    assert b.values == {} and b.skipped == [(lever, f"why {off}")]


def test_a_setting_the_option_cannot_take_is_refused_at_import():
    bool_spec = Spec(name="probe_bool", settings={"off": True, "on": True, "maybe": True}, summary="probe",
                     options=(Option("block", "probe_bool", is_bool, "bool", False),))
    with pytest.raises(ImportError, match=r"probe_bool: settings \['maybe'\]"):
        default_install(bool_spec)
    enum_spec = Spec(name="probe_enum", settings={"a": True, "b": True, "c": True}, summary="probe",
                     options=(Option("block", "probe_enum", *one_of("a", "b"), default="a"),))
    with pytest.raises(ImportError, match=r"probe_enum: settings \['c'\]"):
        default_install(enum_spec)
