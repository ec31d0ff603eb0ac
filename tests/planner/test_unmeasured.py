"""The `unmeasured` rule both lossy levers share (h3plan/facts/evidence.py), as one decision table on ref2va, which no
published point covers: `unmeasured: true` lets a setting the user named run without evidence (a forced setting, the
cache's policy, recipe.sparse's one setting at its knobs) and the plan says so; auto never picks one by itself (the
step cache's auto, choosing among settings, refuses and names the setting to force); a named setting without it is
refused in one line naming the best evidence; no refusal asks for a value the user has already set."""

import pytest

import h3plan
from h3plan.errors import PlanningError

REF2VA = {"video": "ref2va_768x1344_5s"}
CACHE = {"psnr_db_min": 28.0, "ssim_min": 0.93}
SPARSE = {"ssim_min": 0.8}

# (lever, its recipe section, the section, the forced setting or None for auto, unmeasured) -> the setting planned,
# or the refusal's text
TABLE = [
    ("step_cache", "cache", CACHE, None, False,
     "auto picks only evidenced settings: .* run one without evidence with levers.step_cache=first_block and "
     "recipe.cache.unmeasured=true"),
    ("step_cache", "cache", CACHE, None, True,
     "auto picks only evidenced settings: .* force one, levers.step_cache=first_block, which the "
     "recipe.cache.unmeasured=true you set lets run without evidence"),
    ("step_cache", "cache", CACHE, "first_block", False,
     "unmeasured: no published or calibrated quality for first_block .* on ref2va; no step-cache setting has evidence "
     r"for ref2va at 49 forwards; the best evidenced is first_block \(threshold 0.04, .*\) on t2va; .* or run it "
     "without evidence with recipe.cache.unmeasured=true"),
    ("step_cache", "cache", CACHE, "first_block", True, "first_block"),
    ("step_cache", "cache", {"policy": "high"}, None, False,
     "recipe.cache.policy=high; unmeasured: .* the best evidenced is first_block .* on t2va; .* or run it without "
     "evidence with recipe.cache.unmeasured=true"),
    ("step_cache", "cache", {"policy": "high"}, None, True, "first_block"),
    ("sparse_attention", "sparse", SPARSE, None, False,
     "unmeasured: no published or calibrated quality for keep 0.25 .* on ref2va; the published point is keep 0.25, 10 "
     "of 49 dense, video only, t2va .* or run it without evidence with recipe.sparse.unmeasured=true"),
    ("sparse_attention", "sparse", SPARSE, None, True, "block_sparse"),
    ("sparse_attention", "sparse", SPARSE, "block_sparse", False,
     "unmeasured: no published or calibrated quality for keep 0.25 .* on ref2va; the published point is keep 0.25, 10 "
     "of 49 dense, video only, t2va .* or run it without evidence with recipe.sparse.unmeasured=true"),
    ("sparse_attention", "sparse", SPARSE, "block_sparse", True, "block_sparse"),
]


def _plan(lever, section, budget, forced, unmeasured):
    over = {**REF2VA, f"recipe.{section}": {**budget, "unmeasured": unmeasured}}
    if forced:
        over[f"levers.{lever}"] = forced
    return h3plan.resolve_config(**over)


IDS = [f"{lever}-{'policy' if 'policy' in b else forced or 'auto'}-unmeasured={u}"
       for lever, _, b, forced, u, _ in TABLE]


@pytest.mark.parametrize("lever,section,budget,forced,unmeasured,want", TABLE, ids=IDS)
def test_unmeasured_decision_table(lever, section, budget, forced, unmeasured, want):
    if want in ("first_block", "block_sparse"):
        d = _plan(lever, section, budget, forced, unmeasured).decision(lever)
        assert (d.setting, d.forced) == (want, forced is not None)
        assert any(r.startswith("unmeasured: no published or calibrated quality") and "ref2va" in r
                   and f"it runs because recipe.{section}.unmeasured=true, so no measurement backs the budget" in r
                   for r in d.reasons), d.reasons
        return
    with pytest.raises(PlanningError, match=want) as e:
        _plan(lever, section, budget, forced, unmeasured)
    msg = str(e.value)
    assert "\n" not in msg
    if unmeasured:  # a refusal never asks for what the user set
        assert not any(f"{w} recipe.{section}.unmeasured=true" in msg for w in ("with", "and", "set")), msg


@pytest.mark.parametrize("lever,section,budget", [("step_cache", "cache", CACHE),
                                                  ("sparse_attention", "sparse", {**SPARSE, "psnr_db_min": 28.0})])
def test_the_way_out_a_refusal_names_plans(lever, section, budget):
    """Every refusal of a budget offers turning the lever off; that override plans (recipe.<section>=null, which an
    earlier message offered, is no valid override: the section is a dataclass, not Optional)."""
    over = {**({} if lever == "sparse_attention" else REF2VA), f"recipe.{section}": budget,
            **({"recipe": "fp8", "levers.attention": "fa4"} if lever == "sparse_attention" else {})}
    with pytest.raises(PlanningError) as e:
        h3plan.resolve_config(**over)
    off = f"levers.{lever}=off"
    assert off in str(e.value) and f"recipe.{section}=null" not in str(e.value), str(e.value)
    d = h3plan.resolve_config(**over, **{f"levers.{lever}": "off"}).decision(lever)
    assert d.setting == "off" and d.forced
