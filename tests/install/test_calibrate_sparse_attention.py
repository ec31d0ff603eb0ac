"""`action=calibrate calibrate.target=sparse_attention model.path=DIR` on a tiny saved checkpoint (CPU): each keep
fraction runs diffusers' pipe(...) against the dense frames and soundtrack; the sparsest inside recipe.sparse is
written as a plan that loads; a budget nothing meets writes nothing and says so in one line."""

import pytest
from install_helpers import tiny_checkpoint

from h3plan.actions import calibrate as action
from h3plan.actions import calibrate_sparse_attention as cal
from h3plan.errors import PlanningError, UsageError
from h3plan.facts.evidence import read_points
from h3plan.planner import Plan, resolve
from h3plan.planning.config import compose

pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("h3_tiny_ckpt"))


@pytest.fixture(scope="module")
def with_text_encoder(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("h3_tiny_te_ckpt"), text_encoder=True)


def _cfg(folder, out, budget, *more):
    # levers.sparse_attention=off: the CLI plans calibrate.target=sparse_attention from the dense plan (cli.py)
    # 32 x 32 px: 37 target-video rows after 4 text and 414 audio rows (455): 32-row blocks route the last one
    return compose(["model=h3_tiny", "vae=h3_tiny_pipe", f"model.path={folder}", "video.height=32", "video.width=32",
                    "pipeline.num_inference_steps=4", "levers.vae_graphs=off", "hardware.fa4.block_sparse=[32,32]",
                    "levers.vae_ops=eager", "levers.qk_norm_rope=eager", "levers.modulation=eager",
                    "levers.gated_residual=off", "levers.swiglu=off", "levers.sparse_attention=off",
                    "action=calibrate", "calibrate.target=sparse_attention", "calibrate.device=cpu",
                    "calibrate.seeds=[0]", f"calibrate.plan_out={out}",
                    f"calibrate.evidence_out={out.parent / 'points.yaml'}",
                    f"recipe.sparse={{psnr_db_min:{budget[0]},ssim_min:{budget[1]},dense_forwards:1}}", *more])


def test_sparsest_inside_the_budget_is_written(checkpoint, tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr("h3plan.actions.calibration.say", lines.append)
    monkeypatch.setattr(cal, "KEEPS", (0.5, 0.15))
    out = tmp_path / "sparse.yaml"
    cfg = _cfg(checkpoint, out, (1.0, 1e-6))  # every keep fits: the smallest wins
    assert action.run(cfg, resolve(cfg)) == 0
    d = Plan.load(str(out)).decision("sparse_attention")
    assert (d.setting, d.param("keep"), d.param("dense_forwards")) == ("block_sparse", 0.15, 1)
    # the plan cites the points this run measured, not "unmeasured"
    assert any(r.startswith("evidence (calibrated on your checkpoint)") for r in d.reasons), d.reasons
    assert not any(r.startswith("unmeasured") for r in d.reasons)
    pts, ckpt = read_points(str(tmp_path / "points.yaml"), "sparse_attention")
    assert ckpt == str(checkpoint) and sorted(p.knob("keep") for p in pts) == [0.15, 0.5]
    assert all(p.kind == "calibrated" and p.knob("forwards") == 3 and p.ssim is not None and p.ssim < 1.0
               and p.audio_snr_db is not None for p in pts)  # a sparse call differs from the dense one
    assert "model.path=" in lines[0]
    judged = [x for x in lines if "inside the budget" in x]
    assert len(judged) == 2 and all("audio SNR" in x for x in judged)
    assert "plan written to" in lines[-1]


def test_a_forced_keep_is_refused_until_calibrated_then_cites_the_points(checkpoint, tmp_path, monkeypatch):
    """The rule step_cache follows: no evidence at these knobs, refused; the calibrated points make it plannable."""
    monkeypatch.setattr("h3plan.actions.calibration.say", lambda *_: None)
    monkeypatch.setattr(cal, "KEEPS", (0.5,))
    out = tmp_path / "sparse.yaml"
    cfg = _cfg(checkpoint, out, (1.0, 1e-6))
    forced = cfg.copy()
    forced.levers.sparse_attention = "block_sparse"
    forced.recipe.sparse.keep = 0.5
    with pytest.raises(PlanningError, match="unmeasured: no published or calibrated quality for keep 0.5"):
        resolve(forced)
    assert action.run(cfg, resolve(cfg)) == 0
    forced.recipe.sparse.evidence = str(tmp_path / "points.yaml")
    d = resolve(forced).decision("sparse_attention")
    assert d.setting == "block_sparse" and any("calibrated on your checkpoint" in r for r in d.reasons)


def test_nothing_inside_the_budget_writes_nothing(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr("h3plan.actions.calibration.say", lambda *_: None)
    monkeypatch.setattr(cal, "KEEPS", (0.15,))
    out = tmp_path / "sparse.yaml"
    cfg = _cfg(checkpoint, out, (100.0, 0.999))
    with pytest.raises(UsageError, match="no keep fraction stays inside") as e:
        action.run(cfg, resolve(cfg))
    assert "\n" not in str(e.value) and not out.exists()


def test_the_checkpoints_text_encoder_encodes_the_prompts(with_text_encoder, tmp_path, monkeypatch):
    """calibrate.prompts reaches the sparse calibration as it reaches the step cache's: each prompt through the
    checkpoint's text encoder, the count in the output and in the points' where."""
    from h3plan.actions import calibrate_step_cache

    lines, encoded = [], []
    monkeypatch.setattr("h3plan.actions.calibration.say", lines.append)
    monkeypatch.setattr(cal, "KEEPS", (0.5,))
    real = calibrate_step_cache._encode
    monkeypatch.setattr(calibrate_step_cache, "_encode", lambda *a: encoded.append(real(*a)) or encoded[-1])
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a fox in the snow\n\nwaves at dusk\n")
    cfg = _cfg(with_text_encoder, tmp_path / "sparse.yaml", (1.0, 1e-6), f"calibrate.prompts={prompts}")
    assert action.run(cfg, resolve(cfg)) == 0
    (embeds,) = encoded
    assert len(embeds) == 2
    assert "2 prompts of calibrate.prompts=" in lines[0] and "through the checkpoint's text encoder" in lines[0]
    (point,), _ = read_points(str(tmp_path / "points.yaml"), "sparse_attention")
    assert "2 prompts" in point.where


def test_prompts_without_a_text_encoder_are_one_line_before_any_model_loads(checkpoint, tmp_path, monkeypatch):
    def loads(*a, **k):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(cal, "_pipe", loads)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a fox\n")
    cfg = _cfg(checkpoint, tmp_path / "sparse.yaml", (1.0, 1e-6), f"calibrate.prompts={prompts}")
    with pytest.raises(UsageError, match="needs a checkpoint with a text encoder") as e:
        action.run(cfg, resolve(cfg))
    assert "\n" not in str(e.value)


def test_the_request_steps_drive_the_calls(checkpoint, tmp_path, monkeypatch):
    """video.num_inference_steps (the request's) is the calls' step count, not pipeline.num_inference_steps."""
    monkeypatch.setattr("h3plan.actions.calibration.say", lambda *a: None)
    monkeypatch.setattr(cal, "KEEPS", (0.5,))
    cfg = _cfg(checkpoint, tmp_path / "sparse.yaml", (1.0, 1e-6), "video.num_inference_steps=3")
    assert action.run(cfg, resolve(cfg)) == 0
    (point,), _ = read_points(str(tmp_path / "points.yaml"), "sparse_attention")
    assert point.knob("forwards") == 2
