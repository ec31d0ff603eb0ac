"""The install steps read options through one typed view per scope (install/options.py, Builder.view): fields and
defaults from the levers' SPEC.options, so no call site copies a default, and a name no lever declares fails."""

import pytest

from h3plan.install.builder import Builder
from h3plan.install.options import VIEWS
from h3plan.levers import OPTIONS, scope_options
from h3plan.levers.base import SCOPES


def test_every_scope_has_a_view_with_the_spec_defaults():
    assert set(VIEWS) == set(SCOPES)
    b = Builder()
    for scope in SCOPES:
        view = b.view(scope)
        assert {k: getattr(view, k) for k in scope_options(scope)} == {k: o.default
                                                                       for k, o in scope_options(scope).items()}


def test_a_view_holds_what_the_levers_recorded_and_nothing_undeclared():
    b = Builder()
    b.set(OPTIONS["swiglu"][0], "swiglu", True)
    blk = b.view("block")
    assert blk.swiglu is True and blk.modulation == OPTIONS["modulation"][1].default
    with pytest.raises(AttributeError):
        _ = blk.swiglu_typo  # a misspelt option is an error, not a silent default
