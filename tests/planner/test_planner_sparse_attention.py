"""sparse_attention's decision table: off on every packaged recipe and without a sparse budget (recipe.sparse); with
one, auto and a forced block_sparse alike run only where the evidence meets it, by step_cache's rules (SubBlock
publishes SSIM, no PSNR: a budget with a PSNR bound is refused, citing it; knobs no point covers run only with
recipe.sparse.unmeasured=true); refusals are one line: no budget (lossless or not), ring attention, cuDNN FP8
attention, the split output exchange, every forward dense; the blocks are the hardware's FA4 facts; sm100+ rows are
planned and marked never run; the estimates count the sparse forwards' attention."""

import pytest

import h3plan
from h3plan.errors import ConfigError, PlanningError
from h3plan.levers.sparse_attention import PUBLISHED, verdict, work

BUDGET = {"ssim_min": 0.8}  # the published SubBlock point (SSIM 0.80) meets it
ON = {"levers.sparse_attention": "block_sparse"}


def _plan(sparse=None, **kw):
    if sparse is not None:
        kw["recipe.sparse"] = sparse
        kw.setdefault("levers.sparse_attention", "block_sparse")
    return h3plan.resolve_config(**kw)


@pytest.mark.parametrize("recipe,hardware", [("bf16", "sm90"), ("fp8", "sm90"), ("bf16", "sm107"), ("nvfp4", "sm107")])
def test_off_on_every_packaged_recipe(recipe, hardware):
    d = _plan(recipe=recipe, hardware=hardware).decision("sparse_attention")
    assert (d.setting, d.forced, d.lossless) == ("off", False, True)
    assert "no sparse attention budget" in d.reasons[0]


def test_budget_plans_block_sparse_with_the_published_point():
    p = _plan(BUDGET)
    d = p.decision("sparse_attention")
    assert (d.setting, d.lossless) == ("block_sparse", False)
    assert (d.param("keep"), d.param("dense_forwards"), d.param("sparse_forwards"), d.param("forwards")) == (
        0.25, 10, 39, 49)
    assert (d.param("block_q"), d.param("block_k")) == (128, 128)  # hardware.fa4.block_sparse on sm90
    assert d.param("video_rows") == 37296 and d.param("routed_query_blocks") == 291
    assert any(r.startswith("evidence (published on released weights): SSIM 0.8 at 1.28x")
               and "docs/sources.md#sglang-subblock" in r and r.endswith("meets recipe.sparse (SSIM >= 0.8)")
               for r in d.reasons), d.reasons
    assert any("h3plan has not measured" in r for r in d.reasons)
    assert not any("never run on sm90" in r for r in d.reasons)  # block_sparse passed the GPU suite (hardware.verified)


def test_estimates_count_the_sparse_forwards():
    dense, sparse = dict(_plan().derived), dict(_plan(BUDGET).derived)
    frac = _plan(BUDGET).decision("sparse_attention").param("work_fraction")
    point = _plan().get("hardware")["fa4"]["block_sparse_router"][0]  # sm90's measured router at 20.1 GFLOP
    assert point["gflop"] == 20.1
    router = point["ms"]
    assert sparse["attention_ms_per_block_sparse_est"] == pytest.approx(
        dense["attention_ms_per_block_est"] * frac + router, abs=0.05)
    assert "router (20.1 GFLOP" in dict(sparse["basis"])["attention_ms_per_block_sparse_est"]
    assert sparse["forward_sparse_s_est"] < sparse["forward_s_est"] == dense["forward_s_est"]
    want = 10 * sparse["forward_s_est"] + 39 * sparse["forward_sparse_s_est"]
    assert sparse["denoise_s_est"] == pytest.approx(want, abs=0.05)
    assert "10 dense, 39 with sparse attention" in dict(sparse["basis"])["denoise_s_est"]


def test_auto_needs_evidence_that_meets_the_budget():
    d = _plan(BUDGET, **{"levers.sparse_attention": "auto"}).decision("sparse_attention")
    assert d.setting == "block_sparse" and not d.forced
    with pytest.raises(PlanningError, match=r"levers.sparse_attention=auto cannot apply: recipe.sparse \(SSIM >= 0.8, "
                       r"PSNR >= 28 dB\): block_sparse at keep 0.25: its evidence misses recipe.sparse \(PSNR not "
                       r"measured\): SSIM 0.8 at 1.28x .*lower the budget, or levers.sparse_attention=off") as e:
        _plan({**BUDGET, "psnr_db_min": 28.0}, **{"levers.sparse_attention": "auto"})
    assert "\n" not in str(e.value)


def test_forced_needs_evidence_too():
    with pytest.raises(PlanningError, match=r"levers.sparse_attention=block_sparse cannot apply: its evidence misses "
                       r"recipe.sparse \(SSIM 0.8 < 0.9\): SSIM 0.8 at 1.28x"):
        _plan({"ssim_min": 0.9})
    with pytest.raises(PlanningError, match="unmeasured: no published or calibrated quality for keep 0.5 with 10 of 49 "
                       "forwards dense .* or run it without evidence with recipe.sparse.unmeasured=true"):
        _plan({**BUDGET, "keep": 0.5})
    d = _plan({**BUDGET, "keep": 0.5, "unmeasured": True}).decision("sparse_attention")
    assert d.setting == "block_sparse" and d.param("keep") == 0.5
    assert any(r.startswith("unmeasured: no published or calibrated quality for keep 0.5") and
               r.endswith("it runs because recipe.sparse.unmeasured=true, so no measurement backs the budget")
               for r in d.reasons), d.reasons


def test_calibrated_points_take_precedence(tmp_path):
    from h3plan.facts import evidence as ev

    f = tmp_path / "points.yaml"
    mine = ev.QualityPoint.make("sparse_attention", "block_sparse", {"keep": 0.25, "dense_forwards": 10,
                                "video_only": True, "forwards": 49}, ["t2va"], psnr_db=31.0, ssim=0.91,
                                kind="calibrated", where="2 prompts")
    ev.write_points(str(f), "sparse_attention", [mine], checkpoint=str(tmp_path / "ckpt"), date="today")
    d = _plan({"psnr_db_min": 30.0, "ssim_min": 0.9, "evidence": str(f)}).decision("sparse_attention")
    assert any(r.startswith("evidence (calibrated on your checkpoint): SSIM 0.91 / PSNR 31 dB") and
               r.endswith("meets recipe.sparse (SSIM >= 0.9, PSNR >= 30 dB)") for r in d.reasons), d.reasons
    assert not any("h3plan has not measured" in r for r in d.reasons)  # its own measurement is cited instead
    with pytest.raises(ConfigError, match="recipe.sparse.evidence=.* was calibrated on .*ckpt, not this plan's"):
        ev.with_calibrated((), str(f), "sparse_attention", "recipe.sparse.evidence", str(tmp_path / "other"))
    assert ev.with_calibrated((), str(f), "sparse_attention", "k", str(tmp_path / "ckpt")) == (
        ev.read_points(str(f), "sparse_attention")[0])
    with pytest.raises(h3plan.errors.H3PlanError, match="quality points file .*missing.yaml"):
        _plan({**BUDGET, "evidence": str(tmp_path / "missing.yaml")})


def test_evidence_rule():
    p = {"keep": 0.25, "dense_forwards": 10, "video_only": True, "forwards": 49, "psnr_db_min": None, "ssim_min": 0.8}
    v = verdict(p)
    assert v.status == "meets" and v.point is PUBLISHED[0]
    assert verdict({**p, "ssim_min": 0.85}).status == "misses"
    assert verdict({**p, "psnr_db_min": 28.0}).misses == ("PSNR not measured",)
    assert verdict({**p, "keep": 0.3}).status == "unmeasured"
    assert verdict({**p, "forwards": 48}).status == "unmeasured"  # another step count: not the published point
    assert verdict(p, "ref2va").status == "unmeasured"


def test_work_counts_blocks():
    w = work(1024, 512, 0.25, 128, 128)
    # 4 routed query blocks keep max(2, 4 leading + diagonal) = 5 of 8; the other 4 keep 8
    assert w == {"query_blocks": 8, "key_blocks": 8, "routed_query_blocks": 4, "kept_key_blocks": 2,
                 "work_fraction": round((4 * 8 + 4 * 5) / 64, 4)}


def test_ten_second_request_and_sm100_blocks():
    d = _plan(BUDGET, video="t2v_768x1344_10s").decision("sparse_attention")
    assert d.param("key_blocks") == -(-d.param("video_rows") // 128) + 1 or d.param("key_blocks") > 500
    d = _plan(BUDGET, hardware="sm100").decision("sparse_attention")
    assert (d.setting, d.param("block_q"), d.param("block_k"), d.hardware_verified) == ("block_sparse", 256, 128, False)
    assert any("never run on sm100" in r for r in d.reasons)


@pytest.mark.parametrize("kw,match", [
    ({"recipe": "bf16"}, r"recipe bf16 \(lossless\) sets no sparse attention budget"),
    ({"recipe": "fp8", "levers.attention": "fa4"},
     r"recipe fp8 \(budget 34.0 dB \(kernel levers only\)\) sets no sparse"),
    ({"recipe": "fp8", "recipe.sparse": BUDGET}, "cuDNN's SDPA, which takes no block mask"),
    ({"recipe": "fp8", "parallel": "r2u4", "recipe.sparse": BUDGET, "levers.attention": "fa4"}, "parallel.ring=2"),
    ({"recipe.sparse": BUDGET, "parallel": "u2", "levers.ulysses_exchange": "projection_split"},
     "sparse_attention is on: its router routes whole sequences"),
    ({"recipe.sparse": {**BUDGET, "dense_forwards": 49}}, "covers every one of the request's 49 forwards"),
    ({"recipe.sparse": BUDGET, "hardware.fa4.block_sparse": None}, "no FA4 block-sparse forward"),
])
def test_refusals_are_one_line(kw, match):
    with pytest.raises(PlanningError, match=match) as e:
        h3plan.resolve_config(**ON, **kw)
    assert "\n" not in str(e.value)


def test_fp8_gemms_compose_with_fa4_attention():
    d = _plan(BUDGET, recipe="fp8", **{"levers.attention": "fa4"}).decision("sparse_attention")
    assert d.setting == "block_sparse"
    auto = _plan(BUDGET, recipe="fp8", **{"levers.sparse_attention": "auto"}).decision("sparse_attention")
    assert auto.setting == "off" and "takes no block mask" in auto.reasons[0]  # cudnn_fp8 blocks it


@pytest.mark.parametrize("sparse,key", [
    ({"unmeasured": True}, "recipe.sparse.unmeasured"),
    ({"ssim_min": 0.0}, "recipe.sparse.ssim_min=0.0"),
    ({"ssim_min": 0.8, "psnr_db_min": -1.0}, "recipe.sparse.psnr_db_min=-1.0"),
    ({**BUDGET, "keep": 0.0}, "recipe.sparse.keep=0.0"),
    ({**BUDGET, "dense_forwards": -1}, "recipe.sparse.dense_forwards=-1"),
])
def test_bad_values_are_config_errors(sparse, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _plan(sparse)


def test_ulysses_exchange_leaves_out_the_split_output():
    p = _plan(BUDGET, parallel="u2")
    assert p.decision("sparse_attention").setting == "block_sparse"
    ex = p.decision("ulysses_exchange")
    assert ex.setting == "projection" and any("sparse_attention is on" in r for r in ex.reasons), ex.reasons
    assert _plan(parallel="u2").decision("ulysses_exchange").setting == "projection_split"  # as before without it


def test_summary_names_its_own_budget_not_the_kernel_levers():
    text = str(_plan(BUDGET))
    assert "sparse   sparse_attention=block_sparse: keep 0.25 of the key blocks on 39 of 49 forwards; evidence" in text
    assert "within recipe.sparse" not in text  # the evidence's verdict, never a promise
    assert "(sparse ones at " in text
    assert "PSNR >= None" not in text and "\nlossy " not in text
    assert "sparse_attention" not in str(h3plan.resolve_config())  # off: no row, no line
