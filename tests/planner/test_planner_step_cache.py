"""step_cache's decision table: off without a cache budget (recipe.cache), the fixed schedule with one; a schedule too
short to skip anything says so; refusals name the recipe key: a cache on a recipe without a cache budget (lossless
or not), a schedule longer than the request, fewer computed forwards than the ones that never skip."""

import pytest

import h3plan
from h3plan.errors import ConfigError, PlanningError
from h3plan.levers.step_cache import computed_mask, scaled

BUDGET = {"psnr_db_min": 28.0, "ssim_min": 0.93}


def _plan(steps=50, cache=None, **kw):
    over = {"pipeline.num_inference_steps": steps, **kw}
    if cache is not None:
        over["recipe.cache"] = cache
    return h3plan.resolve_config(**over)


@pytest.mark.parametrize("recipe,steps,cache,setting,computed,reason", [
    ("bf16", 50, None, "off", None, "no cache budget"),
    ("fp8", 50, None, "off", None, "kernel levers' budget does not cover"),
    ("bf16", 50, BUDGET, "fixed", 34, "computes 34 of 49 forwards"),
    ("fp8", 50, {**BUDGET, "computed": 40}, "fixed", 40, "computes 40 of 49 forwards"),
    ("bf16", 9, BUDGET, "fixed", 6, "computes 6 of 8 forwards"),   # the 8-forward Turbo schedule
    ("bf16", 5, BUDGET, "off", None, "too short to skip anything: 4 forwards"),  # the 4-forward one
    ("bf16", 5, {**BUDGET, "warmup": 1}, "fixed", 3, "computes 3 of 4 forwards"),
])
def test_decision_table(recipe, steps, cache, setting, computed, reason):
    d = _plan(steps, cache, recipe=recipe).decision("step_cache")
    assert (d.setting, d.forced, d.lossless) == (setting, False, setting == "off")
    assert d.param("computed") == computed
    assert any(reason in r for r in d.reasons), d.reasons
    if setting != "off":
        assert any("h3plan has not measured" in r for r in d.reasons)
        assert any("docs/sources.md#telefuser-velocity-cache" in r for r in d.reasons)


def test_first_block_cites_sglang_and_keeps_its_knobs():
    d = _plan(cache={**BUDGET, "threshold": 0.08}, **{"levers.step_cache": "first_block"}).decision("step_cache")
    assert (d.param("threshold"), d.param("max_skip"), d.param("warmup"), d.param("final")) == (0.08, 2, 4, 1)
    assert any("SSIM 0.931 / PSNR 28.16 dB" in r and "docs/sources.md#sglang-cache-dit" in r for r in d.reasons)


def test_forced_short_schedule_plans_and_says_it_skips_nothing():
    d = _plan(5, BUDGET, **{"levers.step_cache": "fixed"}).decision("step_cache")
    assert d.param("computed") == 4 and d.param("skipped") == []
    assert any("too short to skip anything" in r for r in d.reasons)


@pytest.mark.parametrize("recipe,cache,setting,match", [
    ("bf16", None, "fixed", "recipe bf16 \\(lossless\\) sets no cache budget"),
    ("fp8", None, "taylor", "recipe fp8 \\(budget 34.0 dB \\(kernel levers only\\)\\) sets no cache budget"),
    ("bf16", {**BUDGET, "computed": 60}, "fixed", "recipe.cache.computed=60 is longer than the request's 49 forwards"),
    ("bf16", {**BUDGET, "computed": 3}, "fixed", "fewer than the forwards that never skip"),
])
def test_refusals_are_one_line(recipe, cache, setting, match):
    with pytest.raises(PlanningError, match=match) as e:
        _plan(50, cache, recipe=recipe, **{"levers.step_cache": setting})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("cache,key", [({"psnr_db_min": 28.0}, "recipe.cache"), ({**BUDGET, "warmup": -1}, "recipe.cache.warmup"),
                                       ({**BUDGET, "max_skip": 0}, "recipe.cache.max_skip")])
def test_bad_cache_values(cache, key):
    with pytest.raises(ConfigError, match=key.replace(".", "\\.")):
        _plan(50, cache)


@pytest.mark.parametrize("n,c,w,f,mask", [
    (5, 5, 1, 1, "11111"), (5, 3, 1, 1, "11001"), (8, 6, 4, 1, "11111001"), (4, 4, 4, 1, "1111"),
    (10, 4, 1, 1, "1100010001"), (10, 10, 0, 0, "1111111111"), (3, 1, 0, 0, "100"),
])
def test_schedule_mask(n, c, w, f, mask):
    assert "".join("1" if m else "0" for m in computed_mask(n, c, w, f)) == mask


def test_scaled_keeps_the_fraction():
    assert scaled(34, 49, 49) == 34 and scaled(34, 49, 8) == 6 and scaled(49, 49, 4) == 4


def test_summary_counts_the_computed_forwards():
    from h3plan.cli import render_summary

    text = " ".join(render_summary(_plan(50, BUDGET)).split())
    assert "= 34 computed forwards of 49 " in text  # the time line's denoise counts the forwards that run
    assert "fewer step_cache=fixed: computes 34 of 49 forwards" in text and "never measured by h3plan" in text
    assert "= 49 forwards " in " ".join(render_summary(_plan(50)).split())
