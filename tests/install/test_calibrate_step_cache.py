"""`action=calibrate calibrate.target=step_cache model.path=DIR` on a tiny saved checkpoint (CPU): the candidates run
diffusers' pipe(...) against the uncached frames; the fastest inside recipe.cache is written as a plan that loads and
installs; a budget nothing meets writes nothing and says so in one line."""

import pytest
from install_helpers import tiny_model

from h3plan.actions import calibrate as action
from h3plan.actions import calibrate_step_cache as cal
from h3plan.errors import UsageError
from h3plan.planner import Plan, resolve
from h3plan.planning.config import compose

pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("h3_tiny_ckpt")
    tiny_model(seed=3).save_pretrained(folder / "transformer")
    return folder


def _cfg(folder, out, budget):
    return compose(["model=h3_tiny", "vae=h3_tiny_pipe", f"model.path={folder}", "video.height=32", "video.width=32",
                    "pipeline.num_inference_steps=6", "levers.attention=sdpa", "levers.vae_graphs=off",
                    "levers.vae_ops=eager", "levers.qk_norm_rope=eager", "levers.modulation=eager",
                    "levers.gated_residual=off", "levers.swiglu=off", "action=calibrate", "calibrate.target=step_cache",
                    "calibrate.device=cpu", "calibrate.seeds=[0]", f"calibrate.plan_out={out}",
                    f"recipe.cache={{psnr_db_min:{budget[0]},ssim_min:{budget[1]},warmup:1,final:1}}"])


def test_candidates_skip_something_and_keep_the_order():
    c = cal.candidates(5, 1, 1)
    assert c[:4] == [("fixed", {"computed": 4}), ("taylor", {"computed": 4}), ("fixed", {"computed": 3}),
                     ("taylor", {"computed": 3})]
    assert [s for s, _ in c[4:]] == ["first_block"] * 4
    assert cal.candidates(49, 4, 1)[0] == ("fixed", {"computed": 45})


def test_fastest_inside_the_budget_is_written(checkpoint, tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr("h3plan.actions.calibration.say", lines.append)
    out = tmp_path / "cached.yaml"
    cfg = _cfg(checkpoint, out, (1.0, -1.0))  # every candidate fits: the fewest computed forwards win
    assert action.run(cfg, resolve(cfg)) == 0
    plan = Plan.load(str(out))
    d = plan.decision("step_cache")
    assert (d.setting, d.param("computed")) == ("fixed", 3)
    assert "model.path=" in lines[0] and "(transformer; the VAE seeded" in lines[0]
    assert len([x for x in lines if "inside the budget" in x]) == len(cal.candidates(5, 1, 1))
    assert "plan written to" in lines[-1]


def test_nothing_inside_the_budget_writes_nothing(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr("h3plan.actions.calibration.say", lambda *_: None)
    monkeypatch.setattr(cal, "candidates", lambda n, w, f: [("fixed", {"computed": 3})])
    out = tmp_path / "cached.yaml"
    cfg = _cfg(checkpoint, out, (200.0, 0.999))
    with pytest.raises(UsageError, match="no candidate stays inside PSNR >= 200 dB"):
        action.run(cfg, resolve(cfg))
    assert not out.exists()


def test_no_cache_budget_is_one_line(checkpoint, tmp_path):
    cfg = compose(["model=h3_tiny", "vae=h3_tiny_pipe", "action=calibrate", "calibrate.target=step_cache"])
    with pytest.raises(UsageError, match="recipe.cache="):
        action.run(cfg, resolve(cfg))
