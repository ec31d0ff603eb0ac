"""The transformer block forward's sites (runtime/block_sites.py): composed at install from the runtime modules of the
block levers (runtime/levers/<lever>.py `wrap`) in the one order levers/rules.py `BLOCK_SITES` declares, every choice
between them made there, and install/block.py naming no lever."""

import importlib
import sys
from pathlib import Path

import pytest

from h3plan.install.block import block_sites
from h3plan.install.options import BlockOptions
from h3plan.levers import SPECS, owner, rules, scope_options
from h3plan.runtime import block_sites as bs

ROOT = Path(__file__).resolve().parents[2]
KERNELS: dict = {}  # looked up per call only: composing reads none


def origin(fn) -> str:
    """The module whose code a site runs (a lever's runtime module, or block_sites for diffusers' op)."""
    return fn.__module__.rpartition(".")[2]


def test_every_block_lever_wraps_sites_or_installs_its_own_step():
    """A block option whose lever neither wraps a site (BLOCK_SITES) nor installs a step of its own would be dropped."""
    for key in scope_options("block"):
        lever = owner(key)
        assert lever in rules.BLOCK_SITES or SPECS[lever].model_step is not None, key
    for lever in rules.BLOCK_SITES:
        assert any(o.scope == "block" for o in SPECS[lever].options), lever
        assert callable(importlib.import_module(f"h3plan.runtime.levers.{lever}").wrap), lever
    assert set(rules.PRODUCERS) <= set(rules.BLOCK_SITES)


def test_the_block_forward_names_no_lever():
    sys.path.insert(0, str(ROOT / "tests" / "docs"))
    from test_lever_census import NAMES, names_in

    assert not names_in((ROOT / "h3plan/install/block.py").read_text()) & set(NAMES)


def test_no_block_lever_is_diffusers_ops():
    s = block_sites(BlockOptions(), KERNELS)
    assert s.modulate is bs.modulate and s.attn_residual is bs.gate and s.ff_residual is bs.gate
    assert s.feed_forward is bs.whole_feed_forward and s.activate is None and s.norm_mode is None
    assert {origin(f) for f in (s.qkv_input, s.ffn_input, s.fold)} == {"block_sites"}


@pytest.mark.parametrize("mode", ["exact", "fp32"])
def test_the_producers_wrap_their_sites(mode):
    s = block_sites(BlockOptions(modulation=mode, gated_residual=True, swiglu=True), KERNELS)
    assert s.norm_mode == mode
    assert [origin(f) for f in (s.modulate, s.attn_residual, s.ff_residual, s.activate)] == [
        "modulation", "gated_residual", "gated_residual", "swiglu"]
    assert {origin(f) for f in (s.qkv_input, s.ffn_input, s.fold, s.ff_out, s.feed_forward)} == {"block_sites"}


@pytest.mark.parametrize("codes", [dict(fp8_act_quant="row"), dict(nvfp4_producer_quant=True)],
                         ids=["fp8_row", "nvfp4"])
def test_a_codes_writer_needs_the_fused_producers(codes):
    writer = next(iter(codes))
    full = block_sites(BlockOptions(modulation="exact", swiglu=True, **codes), KERNELS)
    assert {origin(full.qkv_input), origin(full.ffn_input), origin(full.ff_out)} == {writer}
    assert origin(full.fold) == (writer if writer == "nvfp4_producer_quant" else "block_sites")  # the fold: NVFP4
    eager_norm = block_sites(BlockOptions(swiglu=True, **codes), KERNELS)  # modulation eager: no codes from it
    assert origin(eager_norm.qkv_input) == origin(eager_norm.ffn_input) == "block_sites"
    assert origin(eager_norm.ff_out) == writer
    no_ff = block_sites(BlockOptions(modulation="exact", **codes), KERNELS)  # diffusers' FeedForward: bf16 only
    assert origin(no_ff.qkv_input) == writer and origin(no_ff.ffn_input) == "block_sites"
    assert no_ff.feed_forward is bs.whole_feed_forward and no_ff.ff_out is None


def test_the_later_codes_writer_writes_where_both_are_on():
    s = block_sites(BlockOptions(modulation="exact", swiglu=True, fp8_act_quant="row", nvfp4_producer_quant=True),
                    KERNELS)
    assert {origin(f) for f in (s.qkv_input, s.ffn_input, s.fold, s.ff_out)} == {rules.BLOCK_SITES[-1]}


def test_the_unfused_producers_note_names_their_options():
    assert BlockOptions(modulation="exact", swiglu=True).unfused_producers() is None
    assert BlockOptions(swiglu=True).unfused_producers() == "modulation=eager, swiglu=True"
    assert BlockOptions(modulation="fp32").unfused_producers() == "modulation=fp32, swiglu=False"
