"""`action=calibrate calibrate.target=step_cache / sparse_attention` from the command line plans the call it measures
against with that lever off, even where the budget's evidence would refuse the lever's auto (a budget nothing
published meets is exactly what calibrate is for): the GPU check and the action both see the plan without it."""

import pytest

from h3plan import cli
from h3plan.actions import calibrate

CASES = {
    "step_cache": ("run_step_cache", ["video.num_inference_steps=6",
                                      "recipe.cache={psnr_db_min:28,ssim_min:0.93,warmup:1,final:1}"]),
    "sparse_attention": ("run_sparse_attention", ["recipe.sparse={psnr_db_min:28,ssim_min:0.8}"]),
}


@pytest.mark.parametrize("target", sorted(CASES))
def test_calibrate_plans_the_reference_without_the_lever(target, monkeypatch, capsys):
    runner, budget = CASES[target]
    seen = []
    monkeypatch.setattr(calibrate, runner, lambda cfg, plan, c: seen.append(plan) or 0)
    assert cli.run(budget) == 2  # the same budget outside calibrate: the lever's auto refuses it
    assert f"levers.{target}=auto cannot apply" in capsys.readouterr().err
    rc = cli.run(["action=calibrate", f"calibrate.target={target}", "calibrate.device=cpu", "model=h3_tiny",
                  "vae=h3_tiny_pipe", *budget])
    assert rc == 0, capsys.readouterr().err
    assert len(seen) == 1 and seen[0].decision(target).setting == "off"
