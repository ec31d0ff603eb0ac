"""The attention backend registry (h3plan.facts.attention): every backend declares its facts once, the hardware YAML
holds the capability facts they need, the selector gives each backend's reasons, and every place that names a
backend reads the registry."""

import dataclasses
import os
import subprocess
import sys

import pytest

from h3plan.facts import attention
from h3plan.facts import hardware
from h3plan.facts.attention.spec import BackendSpec, Fact, supports
from h3plan.errors import H3PlanError
from h3plan.levers import LEVER_SETTINGS, OPTIONS, SPECS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _without(facts, path):
    """A deep copy of the facts with `path` (dotted) removed."""
    import copy

    out = copy.deepcopy(dict(facts))
    node = out
    *parents, last = path.split(".")
    for p in parents:
        node = node[p]
    del node[last]
    return out


def _with(facts, path, value):
    import copy

    out = copy.deepcopy(dict(facts))
    node = out
    *parents, last = path.split(".")
    for p in parents:
        node = node[p]
    node[last] = value
    return out


@pytest.mark.parametrize("name", list(attention.BACKENDS))
def test_every_backend_declares_its_facts(name):
    b = attention.BACKENDS[name]
    assert isinstance(b, BackendSpec) and b.name == name and b.label
    assert isinstance(b.lossless, bool) and b.precision in ("bf16", "fp8")
    assert b.dtypes and set(b.dtypes) <= {"bf16", "fp16", "fp32", "e4m3"}
    for hw in hardware.names():  # every capability fact it needs is a boolean of every packaged YAML
        facts = hardware.load(hw)
        for f in b.needs:
            assert isinstance(f.value(facts), bool), (hw, f.path)
            assert f.source(facts), (hw, f.path)
        assert isinstance(supports(b, facts), list)
    from h3plan.levers import backend_options

    for o in backend_options(name):  # the options it reads are attention install options the levers declare
        lever, opt = OPTIONS[o.key]
        assert opt.scope == "attention", o.key
    for u in (*b.untested, *(o.untested for o in backend_options(name) if o.untested)):
        assert u.setting in LEVER_SETTINGS[u.lever], (u.lever, u.setting)
        assert u.option is None or u.option in OPTIONS


@pytest.mark.parametrize("name", list(attention.BACKENDS))
def test_every_backend_loads_its_implementation(name):
    b = attention.BACKENDS[name]
    from h3plan.runtime.attention import backend_class, load

    cls = backend_class(name)
    assert cls.name == name
    from h3plan.levers import backend_options

    for o in backend_options(name):
        assert o.reason is None or callable(getattr(cls, o.reason)), o.reason
    if b.lse:
        assert callable(load(b.lse_impl)) and callable(load(b.lse_impl + "_reason"))


def test_consumers_read_the_registry():
    from h3plan.runtime.levers.ring import LSE_OF
    from h3plan.runtime.parallel.lse import LSE_BACKENDS

    spec = SPECS["attention"]
    assert spec.settings == {n: b.lossless for n, b in attention.BACKENDS.items()}
    assert OPTIONS["backend"][1].default == attention.DEFAULT
    assert LSE_OF == {n: b.lse for n, b in attention.BACKENDS.items() if b.lse}
    assert list(LSE_BACKENDS) == ["reference", *LSE_OF.values()]
    needs = {b for s in SPECS.values() for need in s.backends.values() for b in need}
    assert needs <= set(attention.BACKENDS)


def test_registry_is_torch_free():
    code = ("import sys, h3plan.facts.attention, h3plan.facts.attention.spec; "
            "assert not [m for m in ('torch', 'triton') if m in sys.modules], 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_missing_capability_fact_fails():
    facts = _without(hardware.load("sm90"), "fa4.bf16")
    with pytest.raises(KeyError, match=r"hardware\.fa4\.bf16 is missing from the hardware facts of sm90"):
        attention.supports("fa4", facts)
    assert attention.missing_facts(facts) == [("hardware.fa4.bf16", "fa4")]
    assert attention.missing_facts(hardware.load("sm90")) == []


def test_a_backend_needing_a_fact_the_yaml_lacks_is_a_config_error(plan, monkeypatch):
    probe = dataclasses.replace(attention.BACKENDS["fa4"], name="probe",
                                needs=(Fact("fa4.max_head_dim", "{hw} has no FA4 head-dim fact ({source})"),))
    monkeypatch.setitem(attention.BACKENDS, "probe", probe)
    with pytest.raises(H3PlanError, match=r"hardware\.fa4\.max_head_dim.*missing: attention backend probe needs"):
        plan("hardware=sm90")


def test_selector_gives_each_backends_reasons():
    sm90 = hardware.load("sm90")
    assert attention.select(["fa4", "cudnn_bf16", "sdpa"], sm90) == ("fa4", {})
    no_fa4 = _with(sm90, "fa4.bf16", False)
    pick, passed = attention.select(["fa4", "cudnn_bf16", "sdpa"], no_fa4)
    assert pick == "cudnn_bf16" and list(passed) == ["fa4"]
    assert passed["fa4"] == [f"sm90 has no FA4 BF16 forward ({sm90['fa4']['source']})"]
    neither = _with(no_fa4, "cudnn.bf16", False)
    pick, passed = attention.select(["fa4", "cudnn_bf16"], neither)
    assert pick == attention.DEFAULT and passed["cudnn_bf16"] == [f"sm90 has no cuDNN BF16 attention "
                                                                  f"({sm90['cudnn']['source']})"]
    assert attention.supports("sdpa", neither) == []  # needs nothing: the fallback everywhere
    # cudnn_fp8: the fact first, then the version gate read from the same facts
    assert attention.supports("cudnn_fp8", _with(sm90, "cudnn.fp8", False)) == [
        f"sm90 has no cuDNN FP8 attention (hardware.cudnn.fp8=false; {sm90['cudnn']['source']})"]
    assert attention.supports("cudnn_fp8", _with(sm90, "cudnn.version", "9.10.0")) == [
        f"cuDNN 9.10.0 is excluded for FP8 SDPA ({sm90['cudnn']['source']})"]


def test_forced_backend_errors_name_the_registry_reasons(plan):
    with pytest.raises(H3PlanError, match="sm90 has no FA4 BF16 forward"):
        plan("hardware=sm90", "hardware.fa4.bf16=false", "levers.attention=fa4")
    p = plan("hardware=sm90", "hardware.fa4.bf16=false")
    assert p.decision("attention").setting == "cudnn_bf16"


def test_untested_notes_come_from_the_hardware_yaml():
    from types import SimpleNamespace

    two_cta = [h for h in hardware.names() if hardware.load(h)["fa4"]["two_cta"]
               and "on" not in hardware.load(h)["verified"]["settings"].get("fa4_2cta", [])]
    from h3plan.levers import backend_options

    fa4 = backend_options("fa4")  # the fa4_2cta lever declares its option's untested path (Spec.backend_reads)
    notes = attention.untested_notes(SimpleNamespace(backend="fa4", fa4_2cta=True), fa4)
    assert two_cta and len(notes) == 1 and f"never ran on {', '.join(two_cta)}" in notes[0]
    assert attention.untested_notes(SimpleNamespace(backend="fa4", fa4_2cta=True)) == []  # without the levers' reads
    assert attention.untested_notes(SimpleNamespace(backend="fa4", fa4_2cta=None), fa4) == []
    assert attention.untested_notes(SimpleNamespace(backend="sdpa"), backend_options("sdpa")) == []
    (fp8,) = attention.untested_notes(SimpleNamespace(backend="cudnn_fp8"), backend_options("cudnn_fp8"))
    ran = [h for h in hardware.names() if "cudnn_fp8" in hardware.load(h)["verified"]["settings"].get("attention", [])]
    assert "BF16 output" in fp8 and f"ran on {', '.join(ran)} without it" in fp8
    never, ran_on = hardware.never_ran("fa4_2cta", "on", lambda f: f["fa4"]["two_cta"])
    assert never == two_cta and ran_on == []


def test_the_backends_read_their_options_as_the_levers_declare_them():
    """The options a backend reads are declared by the levers that own them (Spec.backend_reads), in registry order:
    fa4 the 2-CTA switch and the tile (its constructor's two_cta and tile, each checked per call), cuDNN FP8 the
    scales; a lever cannot declare a read of an option it does not own or for a backend that does not exist."""
    import dataclasses

    from h3plan.facts.attention.spec import BackendOption
    from h3plan.levers import SPECS, backend_options

    assert [(o.key, o.kwarg, o.reason) for o in backend_options("fa4")] == [
        ("fa4_2cta", "two_cta", "two_cta_reason"), ("fa4_tile", "tile", "tile_reason")]
    assert [o.key for o in backend_options("cudnn_fp8")] == ["fp8_scales"]
    assert backend_options("sdpa") == () and backend_options("cudnn_bf16") == ()
    with pytest.raises(ValueError, match="backend_reads"):
        dataclasses.replace(SPECS["fa4_tile"], backend_reads={"fa4": BackendOption("fa4_2cta")})
    with pytest.raises(ValueError, match="backend_reads"):
        dataclasses.replace(SPECS["fa4_tile"], backend_reads={"nope": BackendOption("fa4_tile")})
