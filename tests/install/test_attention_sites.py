"""The attention processor's sites (runtime/attention_sites.py): composed at install from the runtime modules of the
attention levers (runtime/levers/<lever>.py `wrap`) in the one order levers/rules.py `ATTENTION_SITES` declares, with
the kernels each installs and the options each passes to the Ulysses exchange, and install/attention.py and
install/processor.py naming no lever. Their outputs, counters and fallback reasons are the plan's as before:
tests/install/test_install_attention.py, test_install_guards.py, test_install_ulysses.py and test_install_ring.py."""

import importlib
import sys
from pathlib import Path

import pytest

from h3plan.install.attention import attention_sites
from h3plan.install.options import AttentionOptions
from h3plan.levers import SPECS, rules
from h3plan.runtime import attention_sites as sites_module
from h3plan.runtime.levers import ulysses_exchange
from h3plan.runtime.parallel.ulysses import UlyssesAttention

ROOT = Path(__file__).resolve().parents[2]


def origin(fn) -> str:
    return fn.__module__.rpartition(".")[2]


def compose(**opts):
    kernels: dict = {}
    return attention_sites(AttentionOptions(**opts), kernels), kernels


def test_every_attention_site_lever_has_attention_options_and_wraps():
    for lever in rules.ATTENTION_SITES:
        assert any(o.scope == "attention" for o in SPECS[lever].options), lever
        assert callable(importlib.import_module(f"h3plan.runtime.levers.{lever}").wrap), lever


@pytest.mark.parametrize("path", ["h3plan/install/attention.py", "h3plan/install/processor.py"])
def test_the_attention_install_and_processor_name_no_site_lever(path):
    sys.path.insert(0, str(ROOT / "tests" / "docs"))
    from test_lever_census import names_in

    assert not names_in((ROOT / path).read_text()) & set(rules.ATTENTION_SITES)


def test_no_attention_lever_is_diffusers_ops():
    s, kernels = compose()
    assert s == sites_module.AttentionSites() and kernels == {}
    assert s.norm_rope is sites_module.eager_norm_rope and s.sequence_amax


def test_fused_norm_rope_wraps_the_bf16_sites():
    s, kernels = compose(qk_norm_rope="fused")
    assert set(kernels) == {"qk_norm_rope"}
    assert {origin(f) for f in (s.norm_rope, s.packed, s.project_check, s.project, s.projected)} == {"qk_norm_rope"}
    assert s.codes is None and s.wire_codes is None and s.world_call is None


@pytest.mark.parametrize("degree, a2a, ops, packed, wire", [
    (1, False, {"qk_norm_rope_fp8"}, False, False),
    (2, False, {"qk_norm_rope_fp8", "qk_norm_rope"}, True, False),  # bf16 on the wire, cudnn_fp8 casts after it
    (2, True, {"qk_norm_rope_fp8"}, False, True),
])
def test_fp8_codes_and_what_travels_the_wire(degree, a2a, ops, packed, wire):
    s, kernels = compose(backend="cudnn_fp8", qk_norm_rope="fused_fp8", ulysses_degree=degree, a2a_fp8_codes=a2a)
    assert set(kernels) == ops and origin(s.codes) == "qk_norm_rope"
    assert (s.packed is not None, s.wire_codes is not None) == (packed, wire)
    assert s.norm_rope is sites_module.eager_norm_rope


@pytest.mark.parametrize("setting, amax, table", [("dynamic", True, False), ("static", False, True),
                                                  ("off", False, False)])
def test_fp8_scales_sites(setting, amax, table):
    s, _ = compose(backend="cudnn_fp8", fp8_scales=setting, scale_table="t.json" if table else None)
    assert s.sequence_amax == amax and (s.layer_descales is not None) == table


def test_the_ring_replaces_the_exchange_and_reads_the_packing():
    s, _ = compose(ring_degree=2, qk_norm_rope="fused")
    assert origin(s.world_exchange) == origin(s.world_call) == "ring"
    assert origin(s.packed) == "qk_norm_rope"


@pytest.mark.parametrize("opts, built", [
    (dict(ulysses_degree=2), dict(padding="none")),  # the exchange's own default pads: the plan's none is passed
    (dict(ulysses_degree=2, ulysses_padding="fixed_valid", ulysses_chunks=2, prefix_inplace=True),
     dict(padding="fixed_valid", chunks=2, prefix_inplace=True)),
    (dict(ulysses_degree=2, backend="cudnn_fp8", qk_norm_rope="fused_fp8", a2a_fp8_codes=True),
     dict(padding="none", fp8_codes=True)),
])
def test_the_ulysses_levers_pass_their_options_to_the_exchange(opts, built):
    s, _ = compose(**opts)
    ua = UlyssesAttention(None, **s.exchange_options(None))  # no process group: one process, the options as built
    want = dict(padding="padded", chunks=1, fp8_codes=False, prefix_inplace=False, split_output=False) | built
    assert {k: getattr(ua, k) for k in want} == want and s.projection_exchange is None


@pytest.mark.parametrize("opts, wrapped", [
    (dict(prefix_inplace=True), True), (dict(a2a_fp8_codes=True), True), (dict(ulysses_chunks=2), True),
    (dict(ulysses_padding="padded"), False), (dict(ulysses_exchange="projection_split"), False),
])
def test_at_degree_1_the_exchange_is_tuned_only_by_the_options_install_notes(opts, wrapped):
    s, _ = compose(**opts)
    assert (s.exchange_options is not sites_module.exchange_defaults) == wrapped and s.projection_exchange is None


def test_the_projection_exchange_reads_the_per_destination_norm_rope(monkeypatch):
    s, _ = compose(ulysses_degree=2, qk_norm_rope="fused", ulysses_exchange="projection")
    assert origin(s.projection_exchange) == "ulysses_exchange" and origin(s.project) == "qk_norm_rope"
    assert s.exchange_options(None) == {"padding": "none"}
    monkeypatch.setattr(ulysses_exchange, "high_priority_group", lambda group: "post")
    s, _ = compose(ulysses_degree=2, qk_norm_rope="fused", ulysses_exchange="projection_split")
    ua = UlyssesAttention(None, **s.exchange_options(None))
    assert ua.split_output and ua.post_group == "post" and ua.padding == "none"
