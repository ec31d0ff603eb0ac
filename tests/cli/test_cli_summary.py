"""The default table is a summary a serving engineer reads in a minute; `detail=full` is the whole table.
The `kernel` lines are derived from the lever registry (a SPEC with no install option), not a list."""

import dataclasses
import types

import pytest

import h3plan
from h3plan import cli
from h3plan.install.builder import Builder
from h3plan.levers import REGISTRY, SPECS, Option, Spec, not_installed
from h3plan.facts.decision import make_decision

HEADLINE = dict(hardware="sm107", recipe="nvfp4", parallel="u8")


def _lines(text: str, label: str) -> list[str]:
    return [x for x in text.splitlines() if x.startswith(f"{label:<8} ")]


@pytest.mark.parametrize("hw,recipe,par", [("sm90", "bf16", "u1"), ("sm90", "fp8", "u8"), ("sm100", "fp8", "u4"),
                                           ("sm107", "nvfp4", "u8"), ("sm103", "bf16", "u2")])
def test_summary_is_short_and_says_what_matters(hw, recipe, par):
    plan = h3plan.resolve_config(hardware=hw, recipe=recipe, parallel=par)
    out = cli.render_summary(plan)
    assert len(out.splitlines()) <= 52  # one table row per lever (29) + a header of plan lines up to 22
    lossy = [d.lever for d in plan.decisions if not d.lossless]
    if lossy:
        (line,) = _lines(out, "lossy")
        assert line.split()[1].rstrip(",:") == lossy[0]
        assert "PSNR >=" in out and "SSIM >=" in out
    else:
        assert _lines(out, "lossless")
    unverified = [d for d in plan.decisions if not d.hardware_verified]
    assert bool(_lines(out, "untested")) == bool(unverified) != bool(_lines(out, "verified"))
    for d in unverified[:1]:
        assert d.lever in out.split("\n\n")[0]
    assert _lines(out, "speed") and _lines(out, "memory")
    rows = [x.split()[0] for x in out.split("\n\n")[1].splitlines()[1:]]
    shown = [d.lever for d in plan.decisions if not (SPECS[d.lever].table_skips_off and d.setting == "off")]
    assert rows == shown  # one line per lever, registry order (an off lever that applies to some requests only: none)
    assert "vae_encode_precision" not in shown  # a t2va request encodes nothing: no row
    assert "docs/sources.md" not in out  # sources: detail=full


def _kernel_levers(out: str) -> list[str]:
    return [x.split()[1].split("=")[0] for x in _lines(out, "kernel")]


def test_no_kernel_lines_come_from_the_registry(monkeypatch):
    plan = h3plan.resolve_config(**HEADLINE)
    out = cli.render_summary(plan)
    expected = [d.lever for d in plan.decisions if d.enabled and not SPECS[d.lever].installs]
    assert _kernel_levers(out) == expected
    for lever in expected:
        row = next(x for x in out.splitlines() if x.startswith(lever + " "))
        assert "no kernel" in row
        assert not_installed(plan.decision(lever)) in " ".join(out.split())  # the lever's own skip reason
    # a lever that declares no install option, on in the plan: its own line, with what install will say
    fake = types.SimpleNamespace(SPEC=Spec("fake_fusion", {"off": True, "on": False}, "a fusion with no kernel"),
                                 install=lambda b, d: b.skip("fake_fusion", "h3plan has no fake-fusion kernel"))
    monkeypatch.setitem(SPECS, "fake_fusion", fake.SPEC)
    monkeypatch.setitem(REGISTRY, "fake_fusion", fake)
    extra = dataclasses.replace(plan, decisions=plan.decisions
                                + (make_decision("fake_fusion", "on", False, ["planned"]),))
    out = cli.render_summary(extra)
    assert _kernel_levers(out) == expected + ["fake_fusion"]
    assert "kernel   fake_fusion=on has no kernel yet: install skips it (h3plan has no fake-fusion kernel)" in out
    # give it an install option (what adding its kernel does) and the line goes
    opt = Option("block", "fake_fusion_test", lambda v: True, "any")
    monkeypatch.setitem(SPECS, "fake_fusion", dataclasses.replace(fake.SPEC, options=(opt,)))
    assert _kernel_levers(cli.render_summary(extra)) == expected


def test_todays_headline_plan_has_a_kernel_for_every_setting():
    # the NVFP4 producers have kernels and install options: no setting of the headline plan is left without one
    plan = h3plan.resolve_config(**HEADLINE)
    assert [d.lever for d in plan.decisions if not_installed(d)] == []
    assert "no NVFP4 producer-quantize fusion kernel" not in " ".join(cli.render_summary(plan).split())


def test_a_lever_with_no_install_option_only_skips():
    # the premise of Spec.installs: such a lever's install can record nothing but a skip
    plan = h3plan.resolve_config(**HEADLINE)
    for d in plan.decisions:
        if not SPECS[d.lever].installs:
            b = Builder()
            REGISTRY[d.lever].install(b, d)
            assert b.values == {} and [lever for lever, _ in b.skipped] == [d.lever]
            assert not_installed(d) == b.skipped[0][1]


def test_off_settings_are_not_no_kernel():
    plan = h3plan.resolve_config(hardware="sm90", recipe="bf16", parallel="u1")
    assert not any(not_installed(d) for d in plan.decisions)
    assert not _lines(cli.render_summary(plan), "kernel")


def test_detail_full_is_the_whole_table(capsys):
    assert cli.run(["hardware=sm90", "detail=full"]) == 0
    full = capsys.readouterr().out
    assert full == cli.render_table(h3plan.resolve_config(hardware="sm90"))
    assert "int64_indexing_required" in full and "docs/sources.md#" in full
    assert cli.run(["hardware=sm90", "detail=everything"]) == 2
    assert "detail=everything: not allowed; allowed: summary, full" in capsys.readouterr().err


def test_forced_levers_are_named():
    plan = h3plan.resolve_config(hardware="sm90", recipe="fp8", **{"levers.attention": "fa4"})
    (line,) = _lines(cli.render_summary(plan), "forced")
    assert "levers.attention=fa4" in line


def test_short_reasons_drop_sources_not_code():
    assert cli._short(["x[..., :F] * silu(x[..., F:]) in one kernel (vllm-omni VAE seed "
                       "(docs/sources.md#vllm-omni-vae-seed))"], 80) \
        == "x[..., :F] * silu(x[..., F:]) in one kernel"
    assert cli._short(["a " * 60], 20).endswith("...") and len(cli._short(["a " * 60], 20)) <= 20
