"""A lever's SPEC is the one place the planning side learns what it changes: its sweep column (Spec.column), what
each setting does to the estimates, the memory model and the time line (Spec.terms), and the setting memory.fit offers
(Spec.fit), and the hardware YAML sections it owns (Spec.hardware). A lever added with those fields reaches sweep.py,
derive.py, memory.py, predict.py and the hardware schema without an edit there."""

import typing
from dataclasses import dataclass, field
from typing import List

import pytest

from h3plan import levers, sweep
from h3plan.levers import SPECS, Spec, Terms
from test_memory import estimate

FAKE = "zz_fake_lever"


def _add(monkeypatch, **spec):
    monkeypatch.setitem(SPECS, FAKE, Spec(name=FAKE, settings={"off": True, "on": True},
                                          summary="a test lever", **spec))


def test_sweep_columns_are_the_specs_columns():
    assert sweep.KEY_LEVERS == tuple(n for n, s in SPECS.items() if s.column)
    head = sweep.render([], width=10_000).splitlines()[0].split()  # one band
    assert head[3:3 + len(sweep.KEY_LEVERS)] == [SPECS[n].column for n in sweep.KEY_LEVERS]


def test_memory_reads_a_new_levers_terms_not_its_name(monkeypatch):
    plain = estimate("t2v_768x1344_14s")["breakdown"]["block_activations"]
    fused = estimate("t2v_768x1344_14s", settings={"swiglu": "on"})["breakdown"]["block_activations"]
    _add(monkeypatch, terms={"on": Terms(swiglu_fused=True)})
    assert estimate("t2v_768x1344_14s", settings={FAKE: "on"})["breakdown"]["block_activations"] == fused < plain
    assert estimate("t2v_768x1344_14s", settings={FAKE: "off"})["breakdown"]["block_activations"] == plain


def test_terms_merge_the_settings_and_ignore_unknown_names():
    t = levers.terms({"gemm_quant": "fp8", "qk_norm_rope": "fused_fp8", "vae_tiles": "custom", "no_such_lever": "on"})
    assert (t.gemm_dtype, t.qk_fused, t.qkv_fp8, t.vae_tile, t.vae_fp8_gemms) == (
        "fp8", True, True, "custom_tile", False)
    assert levers.terms({"gemm_quant": "dequant_bf16"}) == Terms()


def test_a_terms_field_has_one_owner(monkeypatch):
    _add(monkeypatch, terms={"on": Terms(gemm_dtype="fp8")})
    with pytest.raises(ImportError, match="Terms.gemm_dtype"):
        levers._term_owners()


def test_spec_refuses_terms_of_unknown_settings():
    with pytest.raises(ValueError, match="unknown settings"):
        Spec(name=FAKE, settings={"off": True}, summary="x", terms={"on": Terms(swiglu_fused=True)})
    with pytest.raises(ValueError, match="unknown settings"):
        Spec(name=FAKE, settings={"off": True}, summary="x", fit="on")


def test_spec_refuses_a_verify_strategy_or_state_that_does_not_fit():
    from h3plan.levers.base import StateKeys

    with pytest.raises(ValueError, match="verify must be one of"):
        Spec(name=FAKE, settings={"off": True}, summary="x", verify="bitwise")
    with pytest.raises(ValueError, match="a VAE lever, and only one"):
        Spec(name=FAKE, settings={"off": True}, summary="x", model="vae")
    with pytest.raises(ValueError, match="judged by its own budget"):
        Spec(name=FAKE, settings={"off": True}, summary="x", recipe_section="cache")
    with pytest.raises(ValueError, match="unknown settings"):
        Spec(name=FAKE, settings={"off": True}, summary="x", state={"on": (StateKeys("parks", ("x.*",)),)})


def test_fit_offers_the_setting_a_spec_names(monkeypatch):
    from h3plan.planning import memory as M

    e = estimate("t2v_768x1344_14s", settings={"adaln_table": "off"})
    assert "nearest fit: levers.adaln_table=on" in M.fit(e, 80, 0.05)
    _add(monkeypatch, terms={"on": Terms(adaln_tables=True)}, fit="on")  # a lever that tables as adaln_table does
    e = estimate("t2v_768x1344_14s", settings={FAKE: "off"})
    assert "nearest fit: levers.zz_fake_lever=on" in M.fit(e, 80, 0.05)


def test_the_time_line_reads_the_encode_geometry_from_terms_not_a_levers_name(monkeypatch):
    from h3plan.planning import predict

    assert predict.encode_tiles({"vae_tiles": "fp8_tiles", "vae_encode_tiles": "decode"}) == "fp8_tiles"
    assert predict.encode_tiles({"vae_tiles": "fp8_tiles", "vae_encode_tiles": "default"}) == "default"
    _add(monkeypatch, terms={"on": Terms(vae_encode_shares_tile=True)})  # shares it as vae_encode_tiles=decode does
    assert predict.encode_tiles({"vae_tiles": "custom", FAKE: "on"}) == "custom"
    assert predict.encode_tiles({"vae_tiles": "custom", FAKE: "off"}) == "default"


@dataclass
class ToyEvidence:
    speedups: List[float] = field(default_factory=list)


def test_the_hardware_schema_takes_a_levers_sections_from_its_spec(monkeypatch):
    from h3plan.planning import hardware_config

    _add(monkeypatch, hardware={"measured.zz_toy": List[ToyEvidence], "zz_toy_caps": ToyEvidence})
    measured = {key: kind for key, kind, _ in hardware_config._lever_sections("measured")}
    top = {key: kind for key, kind, _ in hardware_config._lever_sections("")}
    assert measured["zz_toy"] == List[ToyEvidence] and top["zz_toy_caps"] is ToyEvidence
    assert "zz_toy" not in top and "zz_toy_caps" not in measured
    assert list(measured) == sorted(measured) and list(top) == sorted(top)


def test_every_declared_hardware_section_is_typed_in_the_schema():
    from h3plan.planning.hardware_config import HardwareConfig, MeasuredFacts

    nodes = {"": typing.get_type_hints(HardwareConfig), "measured": typing.get_type_hints(MeasuredFacts)}
    declared = [(path, kind) for s in SPECS.values() for path, kind in s.hardware.items()]
    assert declared
    for path, kind in declared:
        where, _, key = path.rpartition(".")
        assert nodes[where][key] == kind, path


def test_spec_refuses_a_hardware_section_it_cannot_type():
    for bad in ({"measured.a.b": ToyEvidence}, {"a.b": ToyEvidence}, {"measured.a": int}, {"a": List[int]}):
        with pytest.raises(ValueError, match="hardware section"):
            Spec(name=FAKE, settings={"off": True}, summary="x", hardware=bad)


def test_no_levers_section_shadows_a_section_the_schema_types_itself():
    from dataclasses import fields

    from h3plan.planning import hardware_config as hc

    for node, common, scope in ((hc.HardwareConfig, hc._HardwareCommon, ""),
                                (hc.MeasuredFacts, hc._MeasuredCommon, "measured")):
        keys = {key for key, _, _ in hc._lever_sections(scope)}
        assert keys and not keys & ({f.name for f in fields(common)} | set(node.__dict__["__annotations__"]))
