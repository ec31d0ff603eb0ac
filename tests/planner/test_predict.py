"""The plan's time prediction (h3plan/planning/predict.py) against the committed H200 pipe(...) rows, in sample.

In sample: sm90's decode points are some of these rows' own rest times and its forward rates were profiled at their
token counts, so a check here shows the model reproduces its facts, not that it predicts (marked `in_sample`). The
out-of-sample checks (rows no fact was fitted to; every row from other shapes only) are test_predict_holdout.py.

Each installed-plan row of benchmarks/results/pipeline-h200.json (read here, not copied) is planned again (its
h3plan.actions.bench.pipeline_records.replan) with the packaged sm90 facts, and with every tuned
file committed under docs/tuned/ (`benchmarks/predict.py` prints the same comparison as a table): the predicted forward
within 5% of the measured one, and the whole call within 5% at the row's 49 forwards and at a 4-forward request
(num_inference_steps 5: the row's forward x 4 + its measured rest of the call, the rest being independent of the step
count). A first_block step cache's call is taken at the forwards its row computed (pipeline_records.predicted_call); the
plan's own figure, every forward computed, must bound it from above.
"""

import json
from pathlib import Path

import pytest

from h3plan.planner import resolve_config
from h3plan.actions.bench.pipeline_records import (corrections_of, load_corrections, predicted_call, predicted_forward,
                                                   prompted, replan)

IN_SAMPLE = pytest.mark.in_sample

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results/pipeline-h200.json"
ROWS = json.loads(RESULTS.read_text())["records"]
FIXES = load_corrections(str(RESULTS))
# a row another supersedes (pipeline-h200-corrections.json) ran what the facts no longer describe
PLANS = [r for r in ROWS if r["setting"] == "plan" and r["gpus"] == 1
         and not any(c.get("superseded_by") for c in corrections_of(r, FIXES))]
# a 4-forward request of every row but the step cache's (its budget computes 34 forwards: a 4-forward request is
# refused, tests/planner/test_step_cache*.py)
FOUR = [r for r in PLANS if "+step_cache=" not in r["label"] and not r.get("call_computed")
        and r["steps_e2e"] > 4]  # a 4-forward row: above (a cached call's forwards are not a 4-forward call's)
TOL = 0.05  # the prediction's target: within 5% of the measured
# rows whose conditioner moved through pageable host memory (run without install/text_encoder.py's pinned masters):
# module.to("cpu") at 1.7 GB/s and a pageable upload at 7.7 GB/s against the 55 GB/s pinned rate the plan's
# memory.host_link_gbps stands for: ~48 s of the Turbo call's 58.7 s rest (benchmarks/results/
# pipeline-h200-corrections.json). Their forward is held to the 5%; the call is a strict xfail until a run with the
# pinned masters replaces them.
PAGEABLE = {"2026-12-02 13:29:02"}


def _call_rows(rows):
    return [pytest.param(r, marks=pytest.mark.xfail(strict=True, reason="the conditioner's moves ran pageable"))
            if r["run"] in PAGEABLE and r.get("request", {}).get("memory.text_encoder") == "offload_after" else r
            for r in rows]


def _plan(row, steps=None, hardware=(("hardware", "sm90"),)):
    plan = replan(row, steps, FIXES, **dict(hardware))
    assert plan.decision("vae_precision").setting == row["vae"]
    return plan


def test_rows_cover_the_issue():
    assert {(r["recipe"], r["vae"]) for r in PLANS} >= {("bf16", "fp32"), ("bf16", "fp16"), ("fp8", "fp16")}
    assert any("+step_cache=" in r["label"] for r in PLANS) and any("+attention=sdpa" in r["label"] for r in PLANS)


@IN_SAMPLE
@pytest.mark.parametrize("row", PLANS, ids=lambda r: f"{r['run'][5:16]}-{r['label']}".replace(" ", ""))
def test_forward_within_5pct(row):
    plan = _plan(row)
    assert plan.derived_value("sequence")["transformer_forwards"] == row["steps_e2e"]
    fwd = predicted_forward(plan, row)
    assert abs(fwd / row["forward_s"] - 1) <= TOL, (fwd, row["forward_s"])


@IN_SAMPLE
@pytest.mark.parametrize("row", _call_rows(PLANS), ids=lambda r: f"{r['run'][5:16]}-{r['label']}".replace(" ", ""))
def test_forward_and_call_within_5pct(row):
    plan = _plan(row)
    assert plan.derived_value("sequence")["transformer_forwards"] == row["steps_e2e"]
    fwd = predicted_forward(plan, row)
    assert abs(fwd / row["forward_s"] - 1) <= TOL, (fwd, row["forward_s"])
    call = predicted_call(plan, row)
    assert abs(call / row["e2e_s"] - 1) <= TOL, (call, row["e2e_s"])
    # the plan's own figure counts every forward: an upper bound
    if plan.decision("step_cache").setting == "first_block":
        assert plan.derived_value("call_s_est") > row["e2e_s"]


@IN_SAMPLE
@pytest.mark.parametrize("row", FOUR, ids=lambda r: f"{r['run'][5:16]}-{r['label']}".replace(" ", ""))
def test_four_step_call_within_5pct(row):
    plan = _plan(row, steps=5)
    n = plan.derived_value("sequence")["transformer_forwards"]
    assert n == 4
    measured = n * row["forward_s"] + row["rest_s"]
    call = predicted_call(plan, row, steps=5)  # a prompted row's call also encodes its prompt
    assert abs(call / measured - 1) <= TOL, (call, measured)


def test_biggest_share_and_cheapest_cut():
    fp32 = next(r for r in PLANS if r["vae"] == "fp32")
    four = _plan(fp32, steps=5).derived_value("call_biggest")
    assert four["part"] == "decode" and four["share"] > 0.5 and four["cut"].startswith("recipe.vae=fp16")
    assert "dB" in four["cut"]  # its quality cost, measured
    full = _plan(fp32).derived_value("call_biggest")
    assert full["part"] == "denoise" and full["cut"].startswith("recipe=fp8")


def test_the_fewer_forwards_cut_names_the_key_that_changes_this_request():
    """The Turbo preset sets video.num_inference_steps, which wins over pipeline.num_inference_steps: the cut names the
    key that changes the request (planning again with it runs fewer forwards), and its value now."""
    import re

    turbo = resolve_config(video="fl2va_turbo_768x1344", recipe="fp8")
    big = turbo.derived_value("call_biggest")
    assert big["part"] == "denoise" and big["cut"].startswith("fewer forwards (video.num_inference_steps, 5 now;")
    key = re.match(r"fewer forwards \(([\w.]+)", big["cut"]).group(1)
    fewer = resolve_config(video="fl2va_turbo_768x1344", recipe="fp8", **{key: 3})
    forwards = [p.derived_value("sequence")["transformer_forwards"] for p in (fewer, turbo)]
    assert forwards[0] == 2 < forwards[1]


def test_elementwise_counted_and_floor_without_a_point():
    plan = _plan(PLANS[0])
    assert plan.derived_value("elementwise_ms_per_block_est") > 0
    assert "measured" in plan.derived_value("basis")["elementwise_ms_per_block_est"]
    # no point for the recipe: the byte floor at copy bandwidth, and the basis says it is a floor
    other = resolve_config(hardware="sm90", recipe="bf16", parallel="u1", **{"hardware.measured.elementwise": []})
    assert 0 < other.derived_value("elementwise_ms_per_block_est") < plan.derived_value("elementwise_ms_per_block_est")
    assert "a floor" in other.derived_value("basis")["elementwise_ms_per_block_est"]


def test_no_decode_point_no_call_time():
    plan = resolve_config(hardware="sm90", recipe="bf16", parallel="u1", **{"hardware.measured.decode": []})
    assert plan.derived_value("call_s_est") is None and plan.derived_value("decode_s_est") is None
    assert plan.derived_value("forward_s_est") is not None


TUNED_FILES = sorted((Path(__file__).resolve().parents[2] / "docs" / "tuned" / "hardware").glob("*.yaml"))


def test_a_tuned_file_is_committed():
    assert TUNED_FILES, "docs/tuned/hardware/ holds the H200's action=tune file"


# the tier row's sparse forward on the tuned file: +6.1% (12-05 03:59; its FA4 rate, measured at 39,836 tokens,
# scaled to keep 0.25 with sm90's block-sparse ratio); its call +4.7%
TUNED_SPARSE = "the tuned file's sparse forward is over 5% of the tier row's (+6.1%, predict-h200.md)"


def _tuned_cases():
    for path in TUNED_FILES:
        for steps in (None, 5):
            for row in PLANS if steps is None else FOUR:
                marks = _call_rows([row])[0].marks if row["run"] in PAGEABLE else ()
                if "tier=quality" in row["label"]:
                    marks = pytest.mark.xfail(strict=True, reason=TUNED_SPARSE)
                yield pytest.param(path, steps, row, marks=marks,
                                   id=f"{path.stem}-{steps or 50}-{row['run'][5:16]}-{row['label']}".replace(" ", ""))


@pytest.mark.parametrize("path, steps, row", list(_tuned_cases()))
def test_within_5pct_on_a_committed_tuned_file(path, steps, row):
    """The same rows planned on a tuned file (action=tune's own measurements on the H200, docs/tuned/): the forward
    and the whole call within 5%, at the row's 49 forwards and at a 4-forward request. Not fitted to these rows: the
    tune measured its forward rates apart from them (at 39,836 tokens) and its decode alone at the rows' latent."""
    hardware = (("hydra.searchpath", [f"file://{path.parent.parent}"]), ("hardware", path.stem))
    plan = _plan(row, steps, hardware)
    fwd, call = predicted_forward(plan, row), predicted_call(plan, row, steps)
    n = plan.derived_value("sequence")["transformer_forwards"]
    measured = row["e2e_s"] if steps is None else n * row["forward_s"] + row["rest_s"]
    assert abs(fwd / row["forward_s"] - 1) <= TOL, (row["label"], fwd, row["forward_s"])
    assert abs(call / measured - 1) <= TOL, (row["label"], steps, call, measured)


# rows whose call took a prompt through the text encoder: their peak is the encode's (the conditioner on the device
# beside the installed plan), a phase the plan estimates and the bench's per-row peak measures (a t2va row's measured
# peak is the bench's install on a pipeline built on the device, not the plan's steady state: benchmarks/memory.py)
PROMPTED = [r for r in PLANS if prompted(r)]
# a conditioner sharing its layers' weights (bench.pipeline.text_encoder_weight_sets) leaves the rest out of the peak
PEAKS = [r for r in PROMPTED if not r.get("text_encoder_weight_sets")]


def test_the_workflows_have_measured_peaks():
    assert {r["workflow"] for r in PEAKS} >= {"fl2va", "ref2va"}


@IN_SAMPLE
@pytest.mark.parametrize("row", PEAKS,
                         ids=lambda r: f"{r['run'][5:16]}-{r['workflow']}-{r['label']}".replace(" ", ""))
def test_peak_within_5pct_with_the_text_encoder(row):
    """The memory estimate within 5% of the measured peak for each workflow, the text encoder included."""
    plan = _plan(row)
    assert plan.derived_value("memory_peak_phase") == "encode"
    est = plan.derived_value("memory_peak_gib_per_gpu")
    assert abs(est / row["peak_gib"] - 1) <= TOL, (est, row["peak_gib"])
