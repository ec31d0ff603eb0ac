"""`action=calibrate calibrate.target=step_cache model.path=DIR` on a tiny saved checkpoint (CPU): the candidates run
diffusers' pipe(...) against the uncached video and soundtrack; every candidate is written as a calibrated quality
point with its audio SNR beside PSNR / SSIM, and the fastest inside recipe.cache as a plan that loads, installs and
cites those points; a checkpoint with a text encoder encodes the prompts of calibrate.prompts through diffusers' own
text encoder step; a prompts file that is missing, empty or not text is one line before any model loads; a budget
nothing meets writes no plan and says so in one line."""

import pytest
from install_helpers import tiny_checkpoint

from h3plan.actions import calibrate as action
from h3plan.actions import calibrate_step_cache as cal
from h3plan.errors import UsageError
from h3plan.facts import evidence as ev
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
    # levers.step_cache=off: the CLI plans calibrate.target=step_cache from the uncached plan (cli._plan_and_act)
    return compose(["model=h3_tiny", "vae=h3_tiny_pipe", f"model.path={folder}", "video.height=32", "video.width=32",
                    "video.num_inference_steps=6", "levers.attention=sdpa", "levers.vae_graphs=off",
                    "levers.vae_ops=eager", "levers.qk_norm_rope=eager", "levers.modulation=eager",
                    "levers.gated_residual=off", "levers.swiglu=off", "levers.step_cache=off", "action=calibrate",
                    "calibrate.target=step_cache", "calibrate.device=cpu", "calibrate.seeds=[0]",
                    f"calibrate.plan_out={out}", f"calibrate.evidence_out={out.parent / 'points.yaml'}",
                    f"recipe.cache={{psnr_db_min:{budget[0]},ssim_min:{budget[1]},warmup:1,final:1}}", *more])


def test_candidates_skip_something_and_keep_the_order():
    c = cal.candidates(5, 1, 1)
    assert c[:4] == [("fixed", {"computed": 4}), ("taylor", {"computed": 4}), ("fixed", {"computed": 3}),
                     ("taylor", {"computed": 3})]
    assert [s for s, _ in c[4:]] == ["first_block"] * 4
    assert cal.candidates(49, 4, 1)[0] == ("fixed", {"computed": 45})


def test_fastest_inside_the_budget_is_written_and_cites_the_points(checkpoint, tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr("h3plan.actions.calibration.say", lines.append)
    out = tmp_path / "cached.yaml"
    cfg = _cfg(checkpoint, out, (1.0, 1e-6))  # every candidate fits: the fewest computed forwards win
    assert action.run(cfg, resolve(cfg)) == 0
    plan = Plan.load(str(out))
    d = plan.decision("step_cache")
    assert (d.setting, d.param("computed")) == ("fixed", 3)
    assert d.param("evidence") == f"calibrated: {tmp_path / 'points.yaml'}"
    assert any(r.startswith("evidence (calibrated on your checkpoint)") for r in d.reasons)
    points, ckpt = ev.read_points(str(tmp_path / "points.yaml"), "step_cache")
    assert len(points) == len(cal.candidates(5, 1, 1)) and ckpt == str(checkpoint)
    assert all(p.audio_snr_db is not None and p.ssim is not None and p.knob("forwards") == 5 for p in points)
    assert "model.path=" in lines[0] and "seeded: vae, audio_vae" in lines[0] and "seeded prompt embeddings" in lines[0]
    assert len([x for x in lines if "inside the budget" in x]) == len(cal.candidates(5, 1, 1))
    assert all("audio SNR" in x for x in lines if "inside the budget" in x)
    assert "plan written to" in lines[-1]


def test_the_checkpoints_text_encoder_encodes_the_prompts(with_text_encoder, tmp_path, monkeypatch):
    lines, encoded = [], []
    monkeypatch.setattr("h3plan.actions.calibration.say", lines.append)
    monkeypatch.setattr(cal, "candidates", lambda n, w, f: [("fixed", {"computed": 3})])
    real = cal._encode
    monkeypatch.setattr(cal, "_encode", lambda *a: encoded.append(real(*a)) or encoded[-1])
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a fox in the snow\n\nwaves at dusk\n")
    out = tmp_path / "cached.yaml"
    cfg = _cfg(with_text_encoder, out, (1.0, 1e-6), f"calibrate.prompts={prompts}")
    assert action.run(cfg, resolve(cfg)) == 0
    (embeds,) = encoded
    assert [tuple(e["prompt_embeds"].shape) for e in embeds] == [(1, 17, 48), (1, 13, 48)]  # a byte a row
    assert "2 prompts of calibrate.prompts=" in lines[0] and "through the checkpoint's text encoder" in lines[0]
    (point,), _ = ev.read_points(str(tmp_path / "points.yaml"), "step_cache")
    assert point.audio_snr_db is not None and "2 prompts" in point.where
    assert Plan.load(str(out)).decision("step_cache").setting == "fixed"


@pytest.mark.parametrize("content,match", [(None, "No such file"), (b"", "holds no prompt"),
                                           (b"\n  \n", "holds no prompt"),
                                           (b"\xff\xfe\x00\x01", "not UTF-8 text"), (b"a\x00b\n", "not text")])
def test_a_bad_prompts_file_is_one_line_before_any_model_loads(with_text_encoder, tmp_path, monkeypatch, content,
                                                               match):
    def loads(*a, **k):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(cal, "_encode", loads)
    monkeypatch.setattr(cal, "build_pipeline", loads)
    prompts = tmp_path / "prompts.txt"
    if content is not None:
        prompts.write_bytes(content)
    cfg = _cfg(with_text_encoder, tmp_path / "p.yaml", (1.0, 1e-6), f"calibrate.prompts={prompts}")
    with pytest.raises(UsageError, match=match) as e:
        action.run(cfg, resolve(cfg))
    assert "\n" not in str(e.value) and str(prompts) in str(e.value)


def test_prompts_and_text_encoder_go_together(checkpoint, with_text_encoder, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a fox\n")
    cfg = _cfg(with_text_encoder, tmp_path / "p.yaml", (1.0, 1e-6))
    with pytest.raises(UsageError, match="has a text encoder: name the prompts it encodes, calibrate.prompts=FILE"):
        action.run(cfg, resolve(cfg))
    cfg = _cfg(checkpoint, tmp_path / "p.yaml", (1.0, 1e-6), f"calibrate.prompts={prompts}")
    with pytest.raises(UsageError, match="needs a checkpoint with a text encoder"):
        action.run(cfg, resolve(cfg))


def test_nothing_inside_the_budget_writes_no_plan(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr("h3plan.actions.calibration.say", lambda *_: None)
    monkeypatch.setattr(cal, "candidates", lambda n, w, f: [("fixed", {"computed": 3})])
    out = tmp_path / "cached.yaml"
    cfg = _cfg(checkpoint, out, (100.0, 0.999))
    with pytest.raises(UsageError, match="no candidate stays inside SSIM >= 0.999, PSNR >= 100 dB") as e:
        action.run(cfg, resolve(cfg))
    assert not out.exists() and "\n" not in str(e.value)
    (point,), _ = ev.read_points(str(tmp_path / "points.yaml"), "step_cache")  # the measurement is kept
    assert not point.meets(ev.Budget.of({"psnr_db_min": 100.0, "ssim_min": 0.999}))


def test_no_cache_budget_is_one_line(checkpoint, tmp_path):
    cfg = compose(["model=h3_tiny", "vae=h3_tiny_pipe", "action=calibrate", "calibrate.target=step_cache"])
    with pytest.raises(UsageError, match="recipe.cache="):
        action.run(cfg, resolve(cfg))


def test_the_cli_plans_calibrate_from_the_uncached_plan(checkpoint, tmp_path, monkeypatch):
    """At 5 forwards no evidence exists, so auto with a budget refuses; the calibrate command plans uncached."""
    from h3plan import cli

    seen = []
    monkeypatch.setattr(cal, "run", lambda cfg, plan, c: seen.append(plan.decision("step_cache").setting) or 0)
    monkeypatch.setattr("h3plan.actions.calibrate.run_step_cache", cal.run)
    cfg = compose(["model=h3_tiny", "vae=h3_tiny_pipe", "video.num_inference_steps=6", "action=calibrate",
                   "calibrate.target=step_cache", "recipe.cache={psnr_db_min:28,ssim_min:0.93}"])
    assert cli._plan_and_act(cfg, []) == 0 and seen == ["off"]
