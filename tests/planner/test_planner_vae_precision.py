"""vae_precision's decision table: the decode precision follows the recipe's `vae` key; a lossless recipe keeps
diffusers' fp32 decode unless the recipe itself asks for a lossy one; a forced lossy precision under a lossless
recipe is refused with the recipe key to use; the FP8 VAE tiles need the fp16 decode."""

import pytest

import h3plan
from h3plan.errors import PlanningError


def _plan(**kw):
    return h3plan.resolve_config(**kw)


@pytest.mark.parametrize("recipe,over,setting,lossless,tiles", [
    ("bf16", {}, "fp32", True, "default"),
    ("bf16", {"recipe.vae": "fp16"}, "fp16", False, "default"),
    ("bf16", {"recipe.vae": "bf16"}, "bf16", False, "default"),
    ("fp8", {}, "fp16", False, "fp8_tiles"),
    ("fp8", {"recipe.vae": "fp32"}, "fp32", True, "default"),
    ("fp8", {"recipe.vae": "fp16"}, "fp16", False, "default"),
    ("nvfp4", {"hardware": "sm107"}, "fp16", False, "fp8_tiles"),
])
def test_decision_table(recipe, over, setting, lossless, tiles):
    p = _plan(recipe=recipe, **over)
    d = p.decision("vae_precision")
    assert (d.setting, d.lossless, d.forced) == (setting, lossless, False)
    assert p.decision("vae_tiles").setting == tiles
    assert any("recipe" in r and "asks for vae=" in r for r in d.reasons)
    if setting == "fp32":
        assert any("bit for bit diffusers' default decode" in r for r in d.reasons)
    else:
        assert any("from_pretrained(torch_dtype=torch." in r for r in d.reasons)
        assert any("lossy against the fp32 decode" in r for r in d.reasons)


def test_a_lossless_recipe_with_its_own_fp16_decode_keeps_every_other_lever_lossless():
    base, fp16 = _plan(recipe="bf16"), _plan(recipe="bf16", **{"recipe.vae": "fp16"})
    assert base.lossless and not fp16.lossless
    assert [d.lever for d in fp16.decisions if not d.lossless] == ["vae_precision"]
    assert {d.lever: d.setting for d in base.decisions if d.lever != "vae_precision"} == \
           {d.lever: d.setting for d in fp16.decisions if d.lever != "vae_precision"}
    assert any(n.startswith("lossy by the recipe's own choice, outside its lossless policy: vae_precision=fp16 "
                            "(measured on sm90") for n in fp16.notes)


def test_forcing_a_lossy_precision_under_a_lossless_recipe_names_the_recipe_key():
    with pytest.raises(PlanningError) as e:
        _plan(recipe="bf16", **{"levers.vae_precision": "fp16"})
    msg = str(e.value)
    assert "policy lossless" in msg and "recipe.vae=fp16" in msg and "\n" not in msg


def test_forced_precisions_under_a_budget_recipe():
    assert _plan(recipe="fp8", **{"levers.vae_precision": "bf16"}).decision("vae_tiles").setting == "default"
    with pytest.raises(PlanningError, match="vae_precision is bf16: the FP8 decoder GEMMs take and give float16"):
        _plan(recipe="fp8", **{"levers.vae_precision": "bf16", "levers.vae_tiles": "fp8_tiles"})
    d = _plan(recipe="fp8", **{"levers.vae_precision": "fp32"}).decision("vae_precision")
    assert d.forced and d.lossless


def test_the_plan_cites_the_measured_error_or_says_it_was_never_measured():
    d = _plan(recipe="bf16", hardware="sm100", **{"recipe.vae": "fp16"}).decision("vae_precision")
    assert any("never measured on sm100" in r for r in d.reasons)
    sm90 = _plan(recipe="bf16", **{"recipe.vae": "fp16"}).decision("vae_precision")
    measured = [r for r in sm90.reasons if r.startswith("measured on sm90")]
    never = [r for r in sm90.reasons if "never measured on sm90" in r]
    assert len(measured) + len(never) == 1
    for r in measured:
        assert "PSNR" in r and "SSIM" in r and "benchmarks/results/" in r
