"""step_cache's decision table: off without a cache budget or policy; with a budget, auto picks only a setting whose
evidence (published, or calibrated on the user's checkpoint) meets it, at the evidence's knobs, and says which; a
budget no evidence meets is one line naming the best evidenced setting; a forced setting whose evidence misses is
refused citing it; one without evidence runs only with recipe.cache.unmeasured=true. The request's step count (its own,
else the pipeline's) drives every schedule; values the request rules out are ConfigErrors under auto and forced
alike."""

import pytest

import h3plan
from h3plan.errors import ConfigError, PlanningError
from h3plan.facts import evidence as ev
from h3plan.levers.step_cache import (HIGH, POINTS, computed_mask, fewest_computed, longest_skip, scaled)

BUDGET = {"psnr_db_min": 28.0, "ssim_min": 0.93}


def _plan(steps=None, cache=None, **kw):
    over = dict(kw)
    if steps is not None:
        over["video.num_inference_steps"] = steps
    if cache is not None:
        over["recipe.cache"] = cache
    return h3plan.resolve_config(**over)


@pytest.mark.parametrize("recipe,cache,setting,reason", [
    ("bf16", None, "off", "no cache budget"),
    ("fp8", None, "off", "kernel levers' budget does not cover"),
    ("bf16", BUDGET, "first_block", "SSIM 0.931 / PSNR 28.16 dB at 1.40x"),  # the published high policy meets it
    ("fp8", {"psnr_db_min": 25.0, "ssim_min": 0.84}, "first_block", "2.84x"),  # the fastest point that meets it
])
def test_auto_picks_the_fastest_evidenced_setting(recipe, cache, setting, reason):
    d = _plan(cache=cache, recipe=recipe).decision("step_cache")
    assert (d.setting, d.forced, d.lossless) == (setting, False, setting == "off")
    assert any(reason in r for r in d.reasons), d.reasons
    if setting != "off":
        assert d.param("evidence").startswith("published: docs/sources.md#sglang-")
        assert any(r.startswith("evidence (published on released weights)") and "meets recipe.cache" in r
                   for r in d.reasons)


def test_auto_plans_at_the_evidence_knobs():
    d = _plan(cache=BUDGET).decision("step_cache")
    assert {k: d.param(k) for k in HIGH} == HIGH and d.param("forwards") == 49
    assert d.param("fewest_computed") == fewest_computed(49, 4, 0, 1) == 26  # 23 can skip, one in a row
    loose = _plan(cache={"psnr_db_min": 25.0, "ssim_min": 0.84}).decision("step_cache")
    assert (loose.param("threshold"), loose.param("max_skip")) == (0.24, 3)
    narrowed = _plan(cache={"psnr_db_min": 25.0, "ssim_min": 0.84, "threshold": 0.08}).decision("step_cache")
    assert (narrowed.param("threshold"), narrowed.param("max_skip")) == (0.08, 3)  # the knobs the user set narrow it


@pytest.mark.parametrize("cache,best", [
    ({"psnr_db_min": 28.0, "ssim_min": 0.95}, "SSIM 0.931 / PSNR 28.16 dB"),
    ({**BUDGET, "audio_snr_db_min": 15.0}, "which misses audio SNR not measured"),
    ({**BUDGET, "computed": 40}, "the best evidenced is first_block"),  # knobs no evidence has
])
def test_a_budget_no_evidence_meets_is_one_line_naming_the_best(cache, best):
    with pytest.raises(PlanningError, match="no evidenced step-cache setting meets it") as e:
        _plan(cache=cache)
    assert best in str(e.value) and "\n" not in str(e.value)


def test_no_evidence_for_the_workflow_or_step_count_is_one_line():
    with pytest.raises(PlanningError, match="no step-cache setting has published or calibrated quality for fl2va at 7"):
        _plan(8, BUDGET, video="fl2va_turbo_768x1344")
    with pytest.raises(PlanningError, match="for t2va at 8 forwards"):
        _plan(9, BUDGET)


def test_the_request_drives_the_schedule():
    # the preset's own num_inference_steps (5: 4 forwards) reaches the lever: too short to skip anything
    d = _plan(cache=BUDGET, video="fl2va_turbo_768x1344").decision("step_cache")
    assert d.setting == "off" and any("too short to skip anything: 4 forwards (num_inference_steps=5)" in r
                                      for r in d.reasons)
    over = {**BUDGET, "unmeasured": True, "computed": 5, "warmup": 1, "final": 1}
    f = _plan(7, over, **{"levers.step_cache": "fixed", "pipeline.num_inference_steps": 50}).decision("step_cache")
    assert (f.param("steps"), f.param("forwards"), f.param("computed")) == (7, 6, 5)  # video's 7, not pipeline's 50
    p = _plan(None, over, **{"levers.step_cache": "fixed", "pipeline.num_inference_steps": 7}).decision("step_cache")
    assert (p.param("steps"), p.param("forwards")) == (7, 6)  # no request steps: the pipeline's default


def test_every_count_of_forwards_reads_the_request():
    plan = _plan(7, {**BUDGET, "unmeasured": True, "computed": 4, "warmup": 1, "final": 1},
                 **{"levers.step_cache": "fixed"})
    assert plan.decision("adaln_table").param("steps") == [7]
    assert plan.derived_value("sequence")["transformer_forwards"] == 6
    assert plan.derived_value("computed_forwards") == 4
    assert "4 computed of 6" in plan.derived_value("basis")["denoise_s_est"]


def test_policy_high_is_one_override():
    d = _plan(**{"recipe.cache.policy": "high"}).decision("step_cache")
    assert d.setting == "first_block" and {k: d.param(k) for k in HIGH} == HIGH
    assert any("the quality this policy promises" in r and "SSIM 0.931" in r for r in d.reasons)
    with pytest.raises(ConfigError, match="recipe.cache.policy=high fixes its own knobs"):
        _plan(**{"recipe.cache.policy": "high", "recipe.cache.threshold": 0.08})
    with pytest.raises(ConfigError, match="recipe.cache.policy=fast: allowed: high"):
        _plan(**{"recipe.cache.policy": "fast"})
    with pytest.raises(PlanningError, match="recipe.cache.policy=high is a first_block policy"):
        _plan(**{"recipe.cache.policy": "high", "levers.step_cache": "fixed"})
    with pytest.raises(PlanningError, match="misses recipe.cache"):  # a budget above its evidence
        _plan(cache={"policy": "high", "psnr_db_min": 30.0, "ssim_min": 0.95})


@pytest.mark.parametrize("cache,setting,match", [
    ({**BUDGET, "threshold": 0.08, "max_skip": 3}, "first_block",
     r"its evidence misses recipe.cache \(SSIM 0.865 < 0.93; PSNR 26.56 dB < 28 dB\).*sglang-dbcache-sweep"),
    (BUDGET, "fixed", "unmeasured: no published or calibrated quality for fixed at computed 34.*unmeasured=true"),
    ({**BUDGET, "threshold": 0.08}, "first_block", "unmeasured: .* threshold 0.08"),  # 1 in a row: no point has it
    (None, "fixed", r"recipe bf16 \(lossless\) sets no cache budget"),
    (None, "taylor", "recipe.cache.policy=high"),
])
def test_forced_refusals_are_one_line(cache, setting, match):
    with pytest.raises(PlanningError, match=match) as e:
        _plan(cache=cache, **{"levers.step_cache": setting})
    assert "\n" not in str(e.value)


def test_forced_unmeasured_runs_only_when_said_and_the_plan_says_so():
    d = _plan(cache={**BUDGET, "unmeasured": True}, **{"levers.step_cache": "taylor"}).decision("step_cache")
    assert d.setting == "taylor" and d.param("evidence") == "unmeasured"
    assert any(r.startswith("unmeasured:") and "recipe.cache.unmeasured=true" in r for r in d.reasons)
    from h3plan.cli import render_summary

    text = " ".join(render_summary(_plan(cache={**BUDGET, "unmeasured": True},
                                         **{"levers.step_cache": "taylor"})).split())
    assert "fewer step_cache=taylor: computes 34 of 49 forwards" in text and "unmeasured: no published" in text


def test_forced_evidenced_setting_cites_its_evidence():
    d = _plan(cache={"psnr_db_min": 26.0, "ssim_min": 0.86, "threshold": 0.08, "max_skip": 3},
              **{"levers.step_cache": "first_block"}).decision("step_cache")
    assert d.forced and any("SSIM 0.865 / PSNR 26.56 dB / audio SNR 16.67 dB" in r for r in d.reasons)


@pytest.mark.parametrize("computed,forced", [(60, None), (3, None), (60, "fixed"), (3, "taylor")])
def test_computed_the_request_rules_out_is_a_config_error(computed, forced):
    """A computed count the request rules out is one ConfigError line, under auto and under a forced mode alike."""
    kw = {"levers.step_cache": forced} if forced else {}
    with pytest.raises(ConfigError, match=f"recipe.cache.computed={computed}: is (longer|fewer)") as e:
        _plan(cache={**BUDGET, "computed": computed}, **kw)
    assert e.value.fix == {"recipe.cache.computed": "49" if computed == 60 else "5"}


def test_computed_against_the_limit_in_a_row():
    with pytest.raises(ConfigError, match="skips 2 forwards in a row of 49, more than recipe.cache.max_skip=1: "
                                          "compute at least 27"):
        _plan(cache={**BUDGET, "computed": 20, "max_skip": 1, "unmeasured": True}, **{"levers.step_cache": "fixed"})
    d = _plan(cache={**BUDGET, "computed": 27, "warmup": 4, "final": 0, "max_skip": 1, "unmeasured": True},
              **{"levers.step_cache": "fixed"}).decision("step_cache")
    assert longest_skip(computed_mask(49, d.param("computed"), 4, 0)) == 1


@pytest.mark.parametrize("cache,key", [({"psnr_db_min": 28.0}, "recipe.cache"),
                                       ({**BUDGET, "warmup": -1}, "recipe.cache.warmup"),
                                       ({**BUDGET, "max_skip": 0}, "recipe.cache.max_skip"),
                                       ({"audio_snr_db_min": 15.0}, "recipe.cache.audio_snr_db_min")])
def test_bad_cache_values(cache, key):
    with pytest.raises(ConfigError, match=key.replace(".", "\\.")):
        _plan(cache=cache)


def test_a_calibrated_points_file_reaches_the_plan(tmp_path):
    path = str(tmp_path / "points.yaml")
    knobs = {"computed": 40, "warmup": 4, "final": 1, "max_skip": 2, "forwards": 49}
    ev.write_points(path, "step_cache", [ev.QualityPoint.make("step_cache", "fixed", knobs, ["t2va"], psnr_db=31.0,
                                                              ssim=0.95, audio_snr_db=22.0, speedup=49 / 40,
                                                              kind="calibrated", where="2 prompts")],
                    checkpoint=None, date="today")
    d = _plan(cache={"psnr_db_min": 30.0, "ssim_min": 0.94, "evidence": path}).decision("step_cache")
    assert (d.setting, d.param("computed"), d.param("max_skip")) == ("fixed", 40, 2)
    assert d.param("evidence") == f"calibrated: {path}"
    assert any(r.startswith("evidence (calibrated on your checkpoint): SSIM 0.95 / PSNR 31 dB") for r in d.reasons)
    with pytest.raises(PlanningError, match="misses recipe.cache"):  # calibrated points take precedence over published
        _plan(cache={"psnr_db_min": 32.0, "ssim_min": 0.9, "evidence": path, **{k: knobs[k] for k in
                                                                                    ("computed", "max_skip")}},
              **{"levers.step_cache": "fixed"})
    (tmp_path / "bad.yaml").write_text("format: other\n")
    with pytest.raises(h3plan.H3PlanError, match="not an h3plan quality points file"):
        _plan(cache={**BUDGET, "evidence": str(tmp_path / "bad.yaml")})
    with pytest.raises(h3plan.H3PlanError, match="No such file"):
        _plan(cache={**BUDGET, "evidence": str(tmp_path / "missing.yaml")})


def test_published_points_are_cited_facts():
    assert {p.source for p in POINTS} == {"docs/sources.md#sglang-cache-dit", "docs/sources.md#sglang-dbcache-sweep"}
    high = [p for p in POINTS if p.applies("step_cache", "first_block", {**HIGH, "forwards": 49}, "t2va")]
    assert [(p.ssim, p.psnr_db, p.speedup) for p in high] == [(0.931, 28.16, 1.40)]
    b = ev.Budget.of(BUDGET)
    assert high[0].meets(b) and not [p for p in POINTS if p is not high[0] and p.meets(b)]


@pytest.mark.parametrize("n,c,w,f,mask", [
    (5, 5, 1, 1, "11111"), (5, 3, 1, 1, "11001"), (8, 6, 4, 1, "11111001"), (4, 4, 4, 1, "1111"),
    (10, 4, 1, 1, "1100010001"), (10, 10, 0, 0, "1111111111"), (3, 1, 0, 0, "100"),
])
def test_schedule_mask(n, c, w, f, mask):
    assert "".join("1" if m else "0" for m in computed_mask(n, c, w, f)) == mask


def test_schedule_mask_keeps_the_limit_in_a_row():
    m = computed_mask(10, 4, 1, 1, max_skip=2)
    assert longest_skip(m) <= 2 and sum(m) == 5
    assert computed_mask(10, 4, 1, 1, max_skip=3) == computed_mask(10, 4, 1, 1)


def test_scaled_keeps_the_fraction():
    assert scaled(34, 49, 49) == 34 and scaled(34, 49, 8) == 6 and scaled(49, 49, 4) == 4


def test_fewest_computed():
    # sglang #33828: 34 of 49 cached at 3
    assert fewest_computed(49, 4, 0, 1) == 26 and fewest_computed(49, 4, 0, 3) == 15
    assert fewest_computed(5, 0, 0, 1) == 3  # the first forward has nothing to reuse
    assert fewest_computed(5, 5, 0, 2) == 5


def test_summary_counts_the_computed_forwards():
    from h3plan.cli import render_summary

    text = " ".join(render_summary(_plan(cache={**BUDGET, "unmeasured": True, "computed": 34},
                                         **{"levers.step_cache": "fixed"})).split())
    assert "= 34 computed forwards of 49 " in text  # the time line's denoise counts the forwards that run
    assert "fewer step_cache=fixed: computes 34 of 49 forwards" in text
    assert "= 49 forwards " in " ".join(render_summary(_plan()).split())
    high = " ".join(render_summary(_plan(cache=BUDGET)).split())
    assert "fewer step_cache=first_block:" in high and "evidence (published on released weights): SSIM 0.931" in high


def test_an_adaptive_plan_gives_its_call_as_a_range():
    plan = _plan(cache=BUDGET)
    low, high = plan.derived_value("call_s_range_est")
    f, layers = plan.derived_value("forward_s_est"), 50
    assert high == plan.derived_value("call_s_est")  # every forward computed
    assert low == pytest.approx(high - (49 - 26) * f * (1 - 1 / layers), abs=0.01)  # 23 skipped, each its first block
    from h3plan.cli import render_summary

    assert f"call {low:,.0f}-{high:,.0f} s = 26..49 of 49 forwards computed" in " ".join(render_summary(plan).split())
    assert _plan(cache={**BUDGET, "unmeasured": True}, **{"levers.step_cache": "fixed"}).derived_value(
        "call_s_range_est") is None  # a fixed schedule's count is the plan's


def test_the_measured_adaptive_call_falls_inside_the_range():
    """benchmarks/results/pipeline-h200.json, every first_block row (fp8, fp16 decode, threshold 0.08, warm-up 4, final
    1, 2 in a row; 20 and 24 of 49 computed on seeded weights): each whole call lies inside the plan's range."""
    import json
    from pathlib import Path

    rows = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/results/pipeline-h200.json").read_text())
    adaptive = [r for r in (rows if isinstance(rows, list) else rows["records"])
                if "+step_cache=first_block" in r["label"]]
    assert len(adaptive) >= 2  # the 12-02 row and the rerun that supersedes it
    plan = _plan(cache={**BUDGET, "threshold": 0.08, "warmup": 4, "final": 1, "max_skip": 2, "unmeasured": True},
                 recipe="fp8", **{"levers.step_cache": "first_block", "recipe.vae": "fp16"})
    low, high = plan.derived_value("call_s_range_est")
    for row in adaptive:
        assert plan.decision("step_cache").param("fewest_computed") <= row["counters"]["step_cache.computed"]
        assert low <= row["e2e_s"] <= high, (row["run"], low, row["e2e_s"], high)


@pytest.mark.parametrize("computed,why", [(60, "is longer than the request's 49 forwards"),
                                          (3, "is fewer than the forwards that never skip")])
def test_the_cli_refuses_computed_in_one_line(capsys, computed, why):
    """The same from the command line: exit 2, one line, no internal error."""
    from h3plan import cli

    assert cli.run([f"recipe.cache={{psnr_db_min:28,ssim_min:0.93,computed:{computed}}}"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"recipe.cache.computed={computed}: {why}" in lines[0] and out == "", err
