"""tier=quality (conf/tier/quality.yaml): one override plans fp8 block linears, BF16 FA4 attention, the fp16 decode,
the published quality-preserving step-cache policy and block-sparse attention at the published keep with the first 10
forwards dense; nothing forced; the plan states each part's evidence against its own budget and what is known of the
stack as a whole; a request no published point covers runs marked unmeasured, a schedule too short runs dense."""

import pytest

import h3plan
from h3plan.errors import PlanningError

HARDWARE = ("sm90", "sm100", "sm103", "sm107")


def _tier(**kw):
    return h3plan.resolve_config(tier="quality", **kw)


def _settings(p):
    return {d.lever: d.setting for d in p.decisions}


def test_one_override_plans_every_part():
    p = _tier()
    s = _settings(p)
    assert (s["gemm_quant"], s["attention"], s["vae_precision"], s["step_cache"], s["sparse_attention"]) == (
        "fp8", "fa4", "fp16", "first_block", "block_sparse")
    assert not [d.lever for d in p.decisions if d.forced]  # the tier sets the recipe and budgets; the levers decide
    c, sp = p.decision("step_cache"), p.decision("sparse_attention")
    assert (c.param("warmup"), c.param("threshold"), c.param("max_skip"), c.param("policy")) == (4, 0.04, 1, "high")
    assert (sp.param("keep"), sp.param("dense_forwards"), sp.param("video_only")) == (0.25, 10, True)
    r = p.get("recipe")
    assert (r["name"], r["tier"]["name"]) == ("fp8", "quality")


def test_the_plan_says_what_each_part_costs_by_its_evidence():
    text = str(_tier())
    head = text.splitlines()[0]
    assert "recipe=fp8 tier=quality (budget PSNR>=34.0 dB SSIM>=0.97)" in head
    flat = " ".join(text.split())
    assert "evidence (published on released weights): SSIM 0.931 / PSNR 28.16 dB at 1.40x" in flat  # the cache
    assert "meets recipe.cache (SSIM >= 0.93, PSNR >= 28 dB)" in flat
    assert "evidence (published on released weights): SSIM 0.8 at 1.28x" in flat  # the sparse attention
    assert "meets recipe.sparse (SSIM >= 0.8)" in flat
    assert ("gemm_quant, fp8_act_quant, vae_precision: the output may differ from diffusers' eager output within "
            "PSNR >= 34.0 dB, SSIM >= 0.97 (action=verify checks one forward against it, seeded or model.path's "
            "weights; no published measurement of these levers' video quality on H3)") in flat  # the kernels' budget
    assert ("tier quality: each lossy part is judged by its own evidence and budget (the fewer, sparse and lossy "
            "lines); the stack as a whole: no measurement of this stack's quality is published or made by h3plan; "
            "SGLang's quality-first tier") in flat
    assert "unmeasured" not in flat  # t2va at 49 forwards: every part has published evidence
    assert "tier=" not in str(h3plan.resolve_config()).splitlines()[0]


def test_it_is_faster_than_its_parts_by_the_plans_own_estimate():
    est = {k: dict(v.derived)["call_s_est"] for k, v in {
        "tier": _tier(), "fp8": h3plan.resolve_config(recipe="fp8"), "bf16": h3plan.resolve_config()}.items()}
    assert est["tier"] < est["fp8"] < est["bf16"], est


@pytest.mark.parametrize("hardware", HARDWARE)
def test_every_hardware_plans_it(hardware):
    p = _tier(hardware=hardware)
    assert _settings(p)["sparse_attention"] == "block_sparse" and _settings(p)["attention"] == "fa4"
    if hardware != "sm90":
        assert not p.decision("sparse_attention").hardware_verified
        assert "never run on " + hardware in str(p)


def test_requests_no_published_point_covers_run_marked_unmeasured():
    for video, task in (("ref2va_768x1344_5s", "ref2va"), ("fl2va_turbo_768x1344", "fl2va")):
        p = _tier(video=video, **{"video.num_inference_steps": 50})
        s = _settings(p)
        assert (s["step_cache"], s["sparse_attention"]) == ("first_block", "block_sparse"), (video, s)
        said = [r for lev in ("step_cache", "sparse_attention") for r in p.decision(lev).reasons
                if r.startswith("unmeasured")]
        assert len(said) == 2 and all(task in r and "unmeasured=true" in r for r in said), said


def test_a_schedule_too_short_runs_dense_and_says_so():
    p = _tier(video="fl2va_turbo_768x1344")  # the Turbo preset: 5 steps, 4 forwards
    assert (_settings(p)["step_cache"], _settings(p)["sparse_attention"]) == ("off", "off")
    assert "too short to skip anything" in p.decision("step_cache").reasons[0]
    assert "covers every one of the request's 4 forwards" in p.decision("sparse_attention").reasons[0]


def test_the_tier_line_names_the_parts_it_lost():
    """A part that plans off (a schedule too short, a forced attention backend that takes no block mask) is named on
    the tier's line with its reason: its own line and table row are absent, the tier's line is what the user reads."""
    flat = " ".join(str(_tier(video="fl2va_turbo_768x1344")).split())
    assert ("; not in this plan: sparse_attention=off (block_sparse cannot apply: recipe.sparse.dense_forwards=10 "
            "covers every one of the request's 4 forwards") in flat
    assert "; not in this plan: step_cache=off (recipe.cache.policy=high: the schedule is too short" in flat
    flat = " ".join(str(_tier(**{"levers.attention": "cudnn_fp8"})).split())
    assert "not in this plan: sparse_attention=off (block_sparse cannot apply: the FP8 attention is cuDNN's" in flat
    assert "not in this plan: step_cache" not in flat
    assert "not in this plan" not in " ".join(str(_tier()).split())  # every part planned


def test_overrides_on_top_keep_the_evidence_rules():
    d = _tier(**{"recipe.sparse.keep": 0.5}).decision("sparse_attention")  # no point at keep 0.5: said, not hidden
    assert d.param("keep") == 0.5 and any(r.startswith("unmeasured: no published or calibrated quality for keep 0.5")
                                          for r in d.reasons)
    with pytest.raises(PlanningError, match=r"its evidence misses recipe.sparse \(SSIM 0.8 < 0.9\)"):
        _tier(**{"recipe.sparse.ssim_min": 0.9})


def test_a_saved_tier_plan_loads_as_planned(tmp_path):
    from h3plan.planner import Plan

    p = _tier()
    p.save(str(tmp_path / "tier.yaml"))
    back = Plan.load(str(tmp_path / "tier.yaml"))
    assert back.get("recipe")["tier"] == p.get("recipe")["tier"] and _settings(back) == _settings(p)


def test_the_call_range_saves_dense_forwards_first_then_sparse_ones():
    """The adaptive cache's range under sparse attention: its most-skipping schedule skips forwards 4, 6, ..., 48, three
    of them dense (before forward 10) and twenty with sparse attention, each still running its first block."""
    p = _tier()
    low, high = p.derived_value("call_s_range_est")
    f, fs = p.derived_value("forward_s_est"), p.derived_value("forward_sparse_s_est")
    assert fs < f
    assert low == pytest.approx(high - (3 * f + 20 * fs) * (1 - 1 / 50), abs=0.01)


def test_the_measured_tier_call_falls_inside_its_range():
    """benchmarks/results/pipeline-h200.json's tier=quality whole call (t2va 768x1344x124, 49 forwards, one H200) lies
    inside the range the same plan prints, and its computed count inside the plan's."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/results/pipeline-h200.json").read_text())
    row = next(r for r in doc["records"] if "tier=quality" in r["label"] and r.get("whole_call"))
    p = _tier()
    low, high = p.derived_value("call_s_range_est")
    assert p.decision("step_cache").param("fewest_computed") <= row["counters"]["step_cache.computed"] <= 49
    assert low <= row["e2e_s"] <= high, (low, row["e2e_s"], high)
