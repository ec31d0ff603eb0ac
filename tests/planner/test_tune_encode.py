"""action=tune's encode step on the CPU (h3plan/actions/tune.py measure_encode): each precision an installed plan,
timed by a stand-in timer at the request's encode inputs (a t2va request: one keyframe of its canvas), written to
measured.encode and the markdown, and a plan on the file reads it. The real timings never ran here (GPU only)."""

import pytest
import torch

from h3plan.actions import tune
from h3plan.planner import resolve
from h3plan.planning.config import compose

TINY = ["model=h3_tiny", "vae=h3_tiny_pipe", "hardware=sm90", "video.height=32", "video.width=32"]


def _replan(base):
    return lambda extra: resolve(compose([a for a in base if not a.startswith(("recipe=", "recipe.", "levers."))]
                                         + extra))


def _measure(base, quick=False):
    cfg = compose(base)
    plan = resolve(cfg)
    seen = []

    def timer(fn):  # a stand-in for the GPU clock: runs the call once and records the dtype the encode ran in
        seen.append(fn().latent_dist.mean.dtype)
        return 250.0

    return plan, tune.measure_encode(torch, cfg, plan, quick, _replan(base), device="cpu", timer=timer), seen


def test_each_precision_is_an_installed_plan_at_the_requests_keyframes():
    base = TINY + ["video.task=fl2va", "video.keyframes=[first,last]"]
    plan, points, seen = _measure(base)
    # first and last share a shape: timed once; the last arm encodes at the fp8 recipe's decode tiles (sm90 has
    # FP8 GEMMs)
    assert [(p["precision"], p["tiles"]) for p in points] == [("fp32", "default"), ("fp16", "default"),
                                                              ("bf16", "default"), ("fp32", "fp8_tiles")]
    assert seen == [torch.float32, torch.float16, torch.bfloat16, torch.float32]  # each arm's encode in its precision
    seq = plan.derived_value("sequence")
    assert all(p["input"] == [1, seq["height"], seq["width"]] and p["seconds"] == 0.25 for p in points)
    assert "vae_encode_precision=fp16 and vae_encode_tiles=default installed" in points[1]["source"]
    assert "vae_encode_tiles=decode installed (fp8_tiles geometry)" in points[3]["source"]


def test_a_request_that_encodes_nothing_still_measures_one_keyframe_of_its_canvas_and_quick_only_fp32():
    plan, points, seen = _measure(TINY, quick=True)
    assert plan.decision("vae_encode_precision").setting == "off"
    seq = plan.derived_value("sequence")
    assert [(p["precision"], p["tiles"], p["input"]) for p in points] == [
        ("fp32", "default", [1, seq["height"], seq["width"]])]
    assert "one keyframe of the canvas" in points[0]["source"] and seen == [torch.float32]


def test_the_encode_rows_reach_the_file_the_markdown_and_the_plan(tmp_path):
    from test_tune_file import MEASURED, TUNED

    _, points, _ = _measure(TINY + ["video.task=fl2va", "video.keyframes=[first]"])
    measured = dict(MEASURED, encode=points)
    out = tmp_path / "hardware" / "sm90_enc.yaml"
    record = {"tuned": TUNED, "measured": measured, "backends": ["sdpa"], "steps_s": {"encode": 1.0}, "seconds": 1.0}
    tune.write_outputs(out, "sm90", TUNED, measured, None, record)
    md = (tmp_path / "hardware" / "tune-sm90_enc.md").read_text()
    assert "| encode fp16 / default at 1x32x32 (frames x height x width) | 0.250 s |" in md
    p = resolve(compose([f"hydra.searchpath=[file://{tmp_path}]", "hardware=sm90_enc", "recipe=bf16",
                         "video=fl2va_turbo_768x1344"]))
    assert p.derived_value("encode_s_est") == pytest.approx(2 * 0.25 * 1344 * 768 / (32 * 32))  # scaled by pixels
    assert "action=tune" in p.derived_value("basis")["encode_s_est"]
