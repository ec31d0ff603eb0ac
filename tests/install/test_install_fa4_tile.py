"""The fa4_tile lever on the CPU: the planned tile reaches FA4's `_flash_attn_fwd` (a stand-in
flash_attn.cute records the call), every call is counted, and each reason the tile cannot apply
(not SM90, an FA4 without the tile arguments) routes to FA4's default tile with that reason counted.
Bits and speed of the real tile are GPU facts: tests/gpu and benchmarks/results/probes."""

from __future__ import annotations

import sys
import types

import pytest
import torch
# diffusers probes importlib for flash_attn when first imported: import it before the stand-in exists
from diffusers import MiniMaxH3Transformer3DModel  # noqa: F401
from diffusers.models import attention_dispatch  # noqa: F401

from h3plan.runtime.attention import fa4 as fa4_mod
from h3plan.runtime.attention import get_backend
from h3plan.install import counters, install, reset_counters, uninstall
from h3plan.install.builder import Builder

from h3plan.actions.inputs import packed_inputs
from install_helpers import TINY, S, plan, tiny_model

TILE = {"tile_m": 192, "tile_n": 128, "mma_pv_is_rs": False, "intra_wg_overlap": True}


def _qkv(S_=32, H=2, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, S_, H, D, generator=g) for _ in range(3))


@pytest.fixture
def fake_fa4(monkeypatch):
    """flash_attn.cute with flash_attn_func and interface._flash_attn_fwd (SDPA math); records calls."""
    calls = []

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False):
        calls.append(("default", None))
        return get_backend("sdpa")(q, k, v), None

    def _flash_attn_fwd(q, k, v, softmax_scale=None, causal=False, tile_mn=None, mma_pv_is_rs=None,
                        intra_wg_overlap=None, out=None):
        calls.append(("tile", (tile_mn, mma_pv_is_rs, intra_wg_overlap)))
        return get_backend("sdpa")(q, k, v), None

    utils = types.SimpleNamespace(_fa_disable_2cta_enabled=False, _fa_disable_2cta_cuda12=False)
    interface = types.ModuleType("flash_attn.cute.interface")
    interface._flash_attn_fwd = _flash_attn_fwd
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func, cute.utils, cute.interface = flash_attn_func, utils, interface
    for name, mod in (("flash_attn", types.ModuleType("flash_attn")), ("flash_attn.cute", cute),
                      ("flash_attn.cute.utils", utils), ("flash_attn.cute.interface", interface)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(fa4_mod, "_TILE_FN", [])
    monkeypatch.setattr(fa4_mod, "device_cc", lambda q: (9, 0))
    return calls, interface


def test_tile_reaches_flash_attn_fwd(fake_fa4):
    calls, _ = fake_fa4
    q, k, v = _qkv()
    be = get_backend("fa4", tile=TILE)
    assert be.tile_reason(q) is None and "tile=192x128" in repr(be)
    out = be(q, k, v)
    assert calls == [("tile", ((192, 128), False, True))]
    torch.testing.assert_close(out, get_backend("sdpa")(q, k, v), rtol=0, atol=0)
    get_backend("fa4")(q, k, v)  # no tile planned: FA4's own entry point
    assert calls[-1] == ("default", None)
    assert get_backend("fa4").tile_reason(q) == "no tile planned"


def test_tile_refused_off_sm90(fake_fa4, monkeypatch):
    calls, _ = fake_fa4
    monkeypatch.setattr(fa4_mod, "device_cc", lambda q: (10, 0))
    q, k, v = _qkv()
    be = get_backend("fa4", tile=TILE)
    assert be.tile_reason(q) == "the tile was not measured on this device: sm100 (hardware.fa4.tuned_tiles)"
    be(q, k, v)
    assert calls == [("default", None)]


def test_tile_refused_by_an_fa4_without_tile_arguments(fake_fa4):
    calls, interface = fake_fa4

    def old_fwd(q, k, v, softmax_scale=None, causal=False):
        raise AssertionError("must not be called")

    interface._flash_attn_fwd = old_fwd
    q, k, v = _qkv()
    be = get_backend("fa4", tile=TILE)
    assert be.tile_reason(q) == "this FA4's _flash_attn_fwd lacks ['tile_mn', 'mma_pv_is_rs', 'intra_wg_overlap']"
    be(q, k, v)
    assert calls == [("default", None)]


def test_builder_rejects_a_malformed_tile():
    b = Builder()
    with pytest.raises(ValueError, match="fa4_tile=.*allowed: None or dict"):
        b.set("fa4_tile", "fa4_tile", {"tile_m": 192, "tile_n": "128", "mma_pv_is_rs": False,
                                                        "intra_wg_overlap": True})
    with pytest.raises(ValueError, match="allowed: None or dict"):
        b.set("fa4_tile", "fa4_tile", {"tile_m": 192})
    b.set("fa4_tile", "fa4_tile", dict(TILE))
    assert b.recorded("attention")["fa4_tile"] == TILE


def _install_and_run(monkeypatch, p):
    monkeypatch.setattr(fa4_mod.FA4Backend, "unavailable_reason", lambda self, q, k=None, v=None: None)
    model = tiny_model()
    inputs = packed_inputs(TINY, S, seed=0)
    report = install(model, p)
    reset_counters()
    with torch.no_grad():
        out = model(**inputs)
    seen = counters()
    uninstall(model)
    return report, seen, out


def test_processor_counts_every_tiled_call(fake_fa4, monkeypatch):
    calls, _ = fake_fa4
    p = plan(attention="fa4", fa4_tile="tuned", params={"fa4_tile": {"attention": "fa4", "tile": TILE}})
    report, seen, _ = _install_and_run(monkeypatch, p)
    blocks = TINY["num_layers"]
    assert seen["fa4_tile.fused"] == blocks and seen["attention.fused"] == blocks
    assert "fa4_tile.fallback" not in seen
    assert [c for c in calls if c[0] == "tile"] == [("tile", ((192, 128), False, True))] * blocks
    assert any(s.lever == "fa4_tile" and "tile 192x128" in s.new for s in report.swaps)


def test_processor_counts_the_fallback_with_its_reason(fake_fa4, monkeypatch):
    calls, _ = fake_fa4
    monkeypatch.setattr(fa4_mod, "device_cc", lambda q: (10, 3))
    p = plan(attention="fa4", fa4_tile="tuned", params={"fa4_tile": {"attention": "fa4", "tile": TILE}})
    _, seen, _ = _install_and_run(monkeypatch, p)
    assert seen["fa4_tile.fallback"] == TINY["num_layers"] and "fa4_tile.fused" not in seen
    assert all(c == ("default", None) for c in calls)


def test_tile_without_fa4_is_refused_at_install():
    p = plan(attention="sdpa", fa4_tile="tuned", params={"fa4_tile": {"attention": "fa4", "tile": TILE}})
    with pytest.raises(ValueError, match="fa4_tile=tuned needs attention fa4, the plan.s backend is sdpa"):
        install(tiny_model(), p)
