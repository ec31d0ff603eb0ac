"""install/site.py: what a lever's own install steps (Spec.model_step, Spec.input_step) get, and when they run."""

import types

import pytest
import torch

from h3plan.errors import InstallError
from h3plan.facts.decision import make_decision
from h3plan.install.hooks import installed, remove_all
from h3plan.install.report import InstallReport
from h3plan.install.site import Site, run_input_steps, run_steps
from h3plan.levers import SPECS
from h3plan.levers.base import Spec
from h3plan.runtime.counters import counters, reset_counters


def _state():
    return types.SimpleNamespace(hooks=[], report=InstallReport())


def _spec(step=None, model="transformer"):
    return Spec(name="toy_site", settings={"off": True, "on": True}, summary="t", counter="toy_site",
                kernels=("swiglu",), model_step=step, model=model, verify="decode" if model == "vae" else "alone")


def test_a_site_hands_only_the_lever_s_own_kernels():
    site = Site(_spec(), _state())
    assert site.kernel("swiglu")[0].__name__ == "swiglu"
    with pytest.raises(InstallError, match="toy_site: kernel op 'gated_residual' is not one of its SPEC.kernels"):
        site.kernel("gated_residual")


def test_its_hooks_are_named_for_the_lever_and_removed_with_the_install():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    state = _state()
    site = Site(_spec(), state)
    site.attach(model[0], "0", lambda previous, x: previous(x) * 2, replaces=False)
    site.effect(model, lambda: model.__dict__.pop("marked"), apply=lambda: setattr(model, "marked", 1), part="mark")
    site.swap("0.forward", "Linear", "Linear x2")
    site.hold(model[0], "_toy_state", [1, 2])
    assert installed(model) == [("", "h3plan.toy_site.mark"), ("0", "h3plan.toy_site"), ("0", "h3plan.toy_site.state")]
    assert model[0].__dict__["_toy_state"] == [1, 2]
    x = torch.ones(1, 4)
    with torch.no_grad():
        assert torch.equal(model(x), model[0].__class__.forward(model[0], x) * 2) and model.marked == 1
    assert [str(s) for s in state.report.swaps] == ["toy_site: 0.forward Linear -> Linear x2"]
    remove_all(state)
    assert installed(model) == [] and not hasattr(model, "marked") and "_toy_state" not in model[0].__dict__


def test_a_guarded_call_counts_under_the_lever_s_counter():
    site = Site(_spec(), _state())
    reset_counters()
    assert site.guarded(lambda: None, lambda: "fused", lambda: "eager") == "fused"
    assert site.guarded(lambda: "refused here", lambda: "fused", lambda: "eager") == "eager"
    assert counters()["toy_site.fused"] == 1 and counters()["toy_site.fallback"] == 1
    assert counters().reasons["toy_site"] == {"refused here": 1}


def test_steps_run_for_enabled_decisions_of_their_model_only(monkeypatch):
    ran = []
    step = lambda model, d, site: ran.append((d.setting, site.lever))  # noqa: E731
    monkeypatch.setitem(SPECS, "toy_site", _spec(step))
    monkeypatch.setitem(SPECS, "toy_vae", Spec(name="toy_vae", settings={"off": True, "on": True}, summary="t",
                                                model="vae", verify="decode", model_step=step))
    plan = types.SimpleNamespace(decisions=[make_decision("toy_site", "off", True, ["r"]),
                                            make_decision("toy_vae", "on", True, ["r"]),
                                            make_decision("toy_site", "on", True, ["r"])])
    assert run_steps(None, plan, _state(), "transformer") == {"toy_site"}
    assert ran == [("on", "toy_site")]
    assert run_steps(None, plan, _state(), "vae") == {"toy_vae"} and ran[-1] == ("on", "toy_vae")


def test_a_step_that_raises_leaves_the_model_as_it_was(monkeypatch):
    """A lever's own step runs inside the install: what it registered before it raised, and every step of the
    installer before it, are taken back (the hooks, the last first); the error reaches the caller as raised."""
    import dataclasses

    from h3plan.install import install
    from install_helpers import LEVERS, forward, plan, tiny_inputs, tiny_model

    def step(model, decision, site):
        site.attach(model.proj_out, "proj_out", lambda previous, x: previous(x), replaces=False)
        raise InstallError("toy: refused after its first hook")

    monkeypatch.setitem(SPECS, "gated_residual", dataclasses.replace(SPECS["gated_residual"], model_step=step))
    model, inputs = tiny_model(), tiny_inputs()
    want = forward(model, inputs)
    dicts = {n: set(m.__dict__) for n, m in model.named_modules()}
    with pytest.raises(InstallError, match="toy: refused after its first hook"):
        install(model, plan(attention="sdpa", gated_residual="on"), registry=LEVERS)
    assert installed(model) == [] and {n: set(m.__dict__) for n, m in model.named_modules()} == dicts
    got = forward(model, inputs)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_runtime_is_the_lever_s_own_module_or_one_line():
    assert Site(SPECS["step_cache"], _state()).runtime().__name__ == "h3plan.runtime.levers.step_cache"
    with pytest.raises(InstallError, match=r"toy_site: no runtime module of its own \(h3plan/runtime/levers/toy_site"):
        Site(_spec(), _state()).runtime()


def test_input_steps_read_their_own_option_and_their_set_backs_merge(monkeypatch):
    """Spec.input_step: run for enabled transformer decisions in plan order, each reading its own option's value
    through the Site (the builder's view) and returning the block options to set back; merged for the block forward."""
    import dataclasses

    from h3plan.install.builder import Builder

    seen = []

    def step(model, d, site):
        seen.append((site.lever, d.setting, site.option()))
        site.skip("nothing to feed here")
        return {"toy_back": False}

    lever = "swiglu"
    key = SPECS[lever].options[0].key
    monkeypatch.setitem(SPECS, lever, dataclasses.replace(SPECS[lever], input_step=step))
    builder = Builder()
    builder.set(lever, key, True)
    state = _state()
    plan = types.SimpleNamespace(decisions=[make_decision(lever, "off", True, ["r"]),
                                            make_decision(lever, "on", True, ["r"])])
    assert run_input_steps(None, plan, state, builder) == {"toy_back": False}
    assert seen == [(lever, "on", True)] and state.report.skipped == [(lever, "nothing to feed here")]


def test_a_site_without_options_or_with_several_says_so_in_one_line():
    from h3plan.install.builder import Builder

    with pytest.raises(InstallError, match="toy_site: no install options at this step"):
        Site(_spec(), _state()).options("block")
    several = next(s for s in SPECS.values() if len(s.options) > 1)
    with pytest.raises(InstallError, match=f"{several.name}: {len(several.options)} options, not one"):
        Site(several, _state(), builder=Builder()).option()
