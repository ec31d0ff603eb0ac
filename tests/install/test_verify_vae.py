"""action=verify's VAE check and its verdict, on the tiny VAE in the Triton interpreter: the plan
installed into a seeded AutoencoderKLMiniMaxH3 and a latent decoded against diffusers' own float32 decode; a lossy
VAE plan judged against the recipe's budget (a budget it misses fails); a VAE verify cannot build (real width on
the CPU) leaves its lossy levers unchecked, and the verdict then says INCOMPLETE (exit 3), never PASS."""

import pytest
import torch
from test_install_vae import interpreter_order  # noqa: F401 (autouse: CPU reference orders)

import h3plan
from h3plan.actions.verify import INCOMPLETE, Report, verify_vae
from h3plan.planner import make_plan


@pytest.fixture(scope="module")
def fp16_plan():
    return h3plan.resolve_config(hardware="sm90", recipe="bf16", vae="h3_tiny",
                                 **{"recipe.vae": "fp16", "levers.vae_ops": "fused", "levers.vae_graphs": "off"})


def _case(seed=0):
    from omegaconf import OmegaConf

    from h3plan.actions.pipeline_build import build_vae
    from install_helpers import ROOT

    vae = build_vae(OmegaConf.load(ROOT / "conf/vae/h3_tiny.yaml").vae.diffusers_config, seed=seed + 1)
    return vae, torch.randn(1, 4, 3, 6, 6, generator=torch.Generator().manual_seed(seed + 2))


def _budget(plan, psnr):
    cfg = plan.to_dict()["config"]
    cfg["recipe"] = {**cfg["recipe"], "budget": {"psnr_db_min": psnr, "ssim_min": 0.97}}
    return make_plan(cfg, plan.to_dict()["derived"], plan.decisions)


def test_lossy_vae_plan_is_decoded_and_judged_in_its_budget(fp16_plan, capsys):
    rep = Report()
    verify_vae(_case(), _budget(fp16_plan, 34.0), rep)
    out = capsys.readouterr().out
    assert rep.ok and rep.unchecked == {}, out
    assert "PASS  VAE plan vs diffusers decode       lossy (vae_precision=fp16), budget psnr >= 34.0 dB" in out
    assert "vae_ops.swiglu.fused" in out and rep.verdict() == ("verify: PASS", 0)


def test_a_missed_budget_fails(fp16_plan, capsys):
    rep = Report()
    verify_vae(_case(), _budget(fp16_plan, 150.0), rep)  # fp16 against fp32 frames: far below 150 dB
    assert not rep.ok and rep.verdict() == ("verify: FAIL", 1)
    assert "FAIL  VAE plan vs diffusers decode" in capsys.readouterr().out


def test_a_vae_verify_could_not_build_leaves_lossy_levers_unchecked(fp16_plan, capsys):
    rep = Report()
    verify_vae("vae=h3 is real width (decoder 2048): on the CPU pass vae=h3_tiny", fp16_plan, rep)
    line, rc = rep.verdict()
    assert rc == INCOMPLETE and line.startswith("verify: INCOMPLETE: every check that ran passed, but not checked "
                                                "here: vae_precision=fp16 (vae=h3 is real width")
    assert "vae_ops=fused" not in rep.unchecked and "vae_ops=fused" in rep.not_run  # lossless: named on a PASS line
