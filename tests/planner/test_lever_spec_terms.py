"""A lever's SPEC is the one place the planning side learns what it changes: its sweep column (Spec.column), what
each setting does to the estimates, the memory model and the time line (Spec.terms), and the setting memory.fit offers
(Spec.fit). A lever added with those fields reaches sweep.py, derive.py, memory.py and predict.py without an edit
there."""

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
