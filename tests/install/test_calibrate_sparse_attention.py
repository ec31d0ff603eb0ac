"""`action=calibrate calibrate.target=sparse_attention model.path=DIR` on a tiny saved checkpoint (CPU): each keep
fraction runs diffusers' pipe(...) against the dense frames and soundtrack; the sparsest inside recipe.sparse is
written as a plan that loads; a budget nothing meets writes nothing and says so in one line."""

import pytest
from install_helpers import tiny_model

from h3plan.actions import calibrate as action
from h3plan.actions import calibrate_sparse_attention as cal
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
    # 32 x 32 px: 37 target-video rows after 4 text and 414 audio rows (455): 32-row blocks route the last one
    return compose(["model=h3_tiny", "vae=h3_tiny_pipe", f"model.path={folder}", "video.height=32", "video.width=32",
                    "pipeline.num_inference_steps=4", "levers.vae_graphs=off", "hardware.fa4.block_sparse=[32,32]",
                    "levers.vae_ops=eager", "levers.qk_norm_rope=eager", "levers.modulation=eager",
                    "levers.gated_residual=off", "levers.swiglu=off", "action=calibrate",
                    "calibrate.target=sparse_attention", "calibrate.device=cpu", "calibrate.seeds=[0]",
                    f"calibrate.plan_out={out}",
                    f"recipe.sparse={{psnr_db_min:{budget[0]},ssim_min:{budget[1]},dense_forwards:1}}"])


def test_sparsest_inside_the_budget_is_written(checkpoint, tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr("h3plan.actions.calibration.say", lines.append)
    monkeypatch.setattr(cal, "KEEPS", (0.5, 0.15))
    out = tmp_path / "sparse.yaml"
    cfg = _cfg(checkpoint, out, (1.0, -1.0))  # every keep fits: the smallest wins
    assert action.run(cfg, resolve(cfg)) == 0
    d = Plan.load(str(out)).decision("sparse_attention")
    assert (d.setting, d.param("keep"), d.param("dense_forwards")) == ("block_sparse", 0.15, 1)
    assert "model.path=" in lines[0]
    judged = [x for x in lines if "inside the budget" in x]
    assert len(judged) == 2 and all("audio SNR" in x for x in judged)
    assert "plan written to" in lines[-1]


def test_nothing_inside_the_budget_writes_nothing(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr("h3plan.actions.calibration.say", lambda *_: None)
    monkeypatch.setattr(cal, "KEEPS", (0.15,))
    out = tmp_path / "sparse.yaml"
    cfg = _cfg(checkpoint, out, (200.0, 0.999))
    with pytest.raises(UsageError, match="no keep fraction stays inside") as e:
        action.run(cfg, resolve(cfg))
    assert "\n" not in str(e.value) and not out.exists()


def test_snr():
    import torch

    x = torch.ones(4)
    assert cal.snr_db(x, x) == float("inf") and cal.snr_db(x * 1.1, x) == pytest.approx(20.0, abs=1e-4)
