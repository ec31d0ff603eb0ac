"""The VAE decoder block forward's sites (runtime/vae_sites.py): composed at install from the runtime modules of the VAE
block levers (runtime/levers/<lever>.py `settle`, `wrap`, `swaps`) in the one order levers/rules.py `VAE_BLOCK_SITES`
declares, with install/vae/*.py naming no lever. Their outputs, counters, fallback reasons and reports are the plan's as
before: tests/install/test_install_vae.py, test_install_vae_fp8.py, test_install_vae_graphs.py and
test_vae_parallel.py."""

import importlib
import sys
from pathlib import Path

import pytest
import torch

from h3plan.install.options import VaeOptions
from h3plan.install.vae.block import vae_block_sites
from h3plan.levers import NAMES, SPECS, counter, rules
from h3plan.runtime import vae_sites
from h3plan.runtime.levers import vae_ops

ROOT = Path(__file__).resolve().parents[2]
OPS = SPECS["vae_ops"].routes


def origin(fn) -> str:
    return fn.__module__.rpartition(".")[2]


def compose(dtype=torch.float16, **opts):
    skipped: list = []
    levers, sites, swaps = vae_block_sites(VaeOptions(**opts), dtype, skipped)
    return levers, sites, swaps, skipped


def test_every_vae_site_lever_has_vae_options_and_its_runtime_steps():
    for lever in rules.VAE_BLOCK_SITES:
        assert any(o.scope == "vae" for o in SPECS[lever].options), lever
        module = importlib.import_module(f"h3plan.runtime.levers.{lever}")
        assert all(callable(getattr(module, f)) for f in ("settle", "wrap", "swaps")), lever


VAE_INSTALL = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "h3plan" / "install" / "vae").glob("*.py"))


@pytest.mark.parametrize("path", VAE_INSTALL)
def test_the_vae_install_names_no_lever(path):
    sys.path.insert(0, str(ROOT / "tests" / "docs"))
    from test_lever_census import names_in

    assert not names_in((ROOT / path).read_text()) & set(NAMES)


def test_the_ops_runtime_covers_the_specs_ops_and_counters():
    assert tuple(vae_ops.WHERE) == OPS and set(vae_ops.dtypes()) == set(OPS)
    assert vae_ops.COUNTERS == {op: counter("ops", op) for op in OPS}


def test_no_vae_lever_is_diffusers_ops():
    levers, sites, swaps, skipped = compose(graphs=True, tile_dtype="fp8")  # options of no site lever
    assert (levers, swaps, skipped) == ([], [], []) and sites == vae_sites.VaeBlockSites()
    assert sites.norm_rope is None and sites.activate is None and sites.residual is vae_sites.scaled_residual


def test_every_op_wraps_its_site_and_logs_its_swap():
    levers, sites, swaps, skipped = compose(ops=OPS)
    assert levers == ["vae_ops"] and skipped == []
    assert {origin(f) for f in (sites.norm_rope, sites.refused, sites.activate, sites.residual)} == {"vae_ops"}
    assert [(lever, where) for lever, where, *_ in swaps] == [("vae_ops", vae_ops.WHERE[op]) for op in OPS]
    assert all((old, new) == ("eager", "fused") for _, _, old, new in swaps)


@pytest.mark.parametrize("ops", [("swiglu",), ("scaled_residual", "qk_norm_rope")])
def test_only_the_planned_ops_wrap_and_the_swaps_keep_the_ops_order(ops):
    _, sites, swaps, _ = compose(ops=ops)
    assert (sites.norm_rope is not None) == ("qk_norm_rope" in ops)
    assert (sites.refused is vae_sites.nothing) == ("qk_norm_rope" not in ops)
    assert (sites.activate is not None) == ("swiglu" in ops)
    assert (sites.residual is vae_sites.scaled_residual) == ("scaled_residual" not in ops)
    assert [where for _, where, *_ in swaps] == [vae_ops.WHERE[op] for op in OPS if op in ops]


def test_an_op_whose_kernel_does_not_take_the_decode_dtype_is_left_to_diffusers_with_the_reason():
    levers, sites, swaps, skipped = compose(torch.float32, ops=OPS)
    assert levers == ["vae_ops"] and sites.norm_rope is None and sites.activate is not None
    assert [k for k, _ in skipped] == ["vae_ops.qk_norm_rope"]
    assert "the decoder computes in torch.float32 and the qk_norm_rope kernel takes float16/bfloat16" in skipped[0][1]
    assert [where for _, where, *_ in swaps] == [vae_ops.WHERE["swiglu"], vae_ops.WHERE["scaled_residual"]]


def test_every_op_left_out_still_hooks_the_blocks():
    """A plan whose ops all refuse the dtype keeps the plan forward with diffusers' ops (the hook still carries it)."""
    levers, sites, swaps, skipped = compose(torch.float64, ops=OPS)
    assert levers == ["vae_ops"] and sites == vae_sites.VaeBlockSites() and swaps == []
    assert [k for k, _ in skipped] == [f"vae_ops.{op}" for op in OPS]


def test_the_eager_sites_are_diffusers_expressions():
    torch.manual_seed(0)
    h, y, scale = torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(8)
    assert torch.equal(vae_sites.scaled_residual(h, y, scale), h + y * scale)
    x, cos, sin = torch.randn(1, 5, 2, 8), torch.randn(1, 5, 1, 4), torch.randn(1, 5, 1, 4)  # (B, S, H, D), rope on 4
    rot = vae_sites.rope(x, cos, sin)
    assert torch.equal(rot[..., 4:], x[..., 4:])
    first, second = x[..., :4].chunk(2, dim=-1)
    assert torch.equal(rot[..., :4], x[..., :4] * cos + torch.cat([-second, first], dim=-1) * sin)
