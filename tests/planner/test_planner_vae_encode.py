"""vae_encode_precision's decision table and the encode's time on the plan's speed line: off (and no table row, no
time term) where the request encodes nothing; fp32 wherever it encodes, with the reason (a lossless recipe keeps the
bits; a lossy VAE's budget covers the decode, not the encode); forced fp16 / bf16 only where the recipe allows a lossy
VAE, saying it is outside the measured budget; every refusal one line."""

import pytest

import h3plan
from h3plan.errors import PlanningError
from h3plan.planning.render import render_summary, render_table

LEVER = "vae_encode_precision"
FL2VA = {"video": "fl2va_turbo_768x1344"}  # first + last keyframe on a 1344x768 canvas
REF2VA = {"video": "ref2va_768x1344_5s"}
MEASURED = [{"precision": "fp32", "input": [1, 672, 384], "seconds": 0.1, "source": "a test's measurement"},
            {"precision": "fp16", "input": [1, 672, 384], "seconds": 0.02, "source": "a test's measurement"}]


def _plan(**kw):
    return h3plan.resolve_config(hardware="sm90", **kw)


@pytest.mark.parametrize("over,setting,why", [
    ({"recipe": "bf16"}, "off", "t2va encodes nothing"),
    ({"recipe": "fp8"}, "off", "t2va encodes nothing"),
    ({"recipe": "bf16", **FL2VA}, "fp32", "lossless with vae=fp32: the encode keeps its bits"),
    ({"recipe": "bf16", **REF2VA}, "fp32", "lossless with vae=fp32: the encode keeps its bits"),
    ({"recipe": "bf16", "recipe.vae": "fp16", **FL2VA}, "fp32",
     "its budget covers the decode's frames, not the encode"),
    ({"recipe": "fp8", **REF2VA}, "fp32", "its budget covers the decode's frames, not the encode"),
])
def test_decision_table(over, setting, why):
    d = _plan(**over).decision(LEVER)
    assert (d.setting, d.lossless, d.forced) == (setting, True, False)
    assert why in d.reasons[0]


def test_t2va_has_no_row_no_runs_entry_and_no_encode_time():
    p = _plan(recipe="bf16")
    for text in (render_summary(p), render_table(p)):
        assert LEVER not in text and "VAE encode" not in text
    assert p.derived_value("encode_s_est") is None
    assert "encode" not in (p.derived_value("call_biggest") or {}).get("part", "")


def test_an_encoding_request_prints_its_row_and_its_encode_time_from_the_h200s_tune():
    p = _plan(recipe="bf16", **FL2VA)
    text = render_summary(p)
    assert f"{LEVER}  fp32" in text and f"{LEVER}=fp32" in text  # the table row and the runs line
    # two 1344x768 keyframes at the packaged sm90 point: action=tune's 0.1995 s per 768x1344 frame on the H200
    assert p.derived_value("encode_s_est") == pytest.approx(0.399, abs=0.002)
    assert "VAE encode 0.4 s" in " ".join(text.split()) and "(estimate, not measured)" not in text
    dec, den = p.derived_value("decode_s_est"), p.derived_value("denoise_s_est")
    assert p.derived_value("call_s_est") == pytest.approx(den + dec + 0.399, abs=0.011)
    assert "benchmarks/results/tune-h200.json" in p.derived_value("basis")["encode_s_est"]


def test_an_encode_time_from_an_estimate_says_so():
    estimate = [{"precision": "fp32", "input": [1, 1344, 768], "seconds": 0.61,
                 "source": "estimate, not measured: 18.2 TFLOP at an assumed 30 TFLOP/s"}]
    p = _plan(recipe="bf16", **FL2VA, **{"hardware.measured.encode": estimate})
    assert p.derived_value("encode_s_est") == pytest.approx(1.22)
    assert "VAE encode 1.2 s (estimate, not measured)" in " ".join(render_summary(p).split())
    assert "estimate, not measured" in p.derived_value("basis")["encode_s_est"]


def test_a_measured_encode_scales_by_pixel_volume_and_is_not_called_an_estimate():
    p = _plan(recipe="bf16", **FL2VA, **{"hardware.measured.encode": MEASURED})
    assert p.derived_value("encode_s_est") == pytest.approx(2 * 0.1 * 4)  # 1344x768 is 4x the 672x384 point
    assert "(estimate, not measured)" not in render_summary(p)
    forced = _plan(recipe="fp8", **FL2VA, **{"hardware.measured.encode": MEASURED, f"levers.{LEVER}": "fp16"})
    assert forced.derived_value("encode_s_est") == pytest.approx(2 * 0.02 * 4)
    assert any("encode 0.80 s at fp32 -> 0.16 s at fp16" in r for r in forced.decision(LEVER).reasons)


def test_an_encode_with_no_time_on_the_hardware_leaves_the_call_unpredicted_and_says_so():
    p = _plan(recipe="bf16", **FL2VA, **{"hardware.measured.encode": []})
    assert p.derived_value("encode_s_est") is None and p.derived_value("call_s_est") is None
    assert "no VAE encode time on sm90" in " ".join(render_summary(p).split())


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_forced_lossy_encode_under_a_lossy_vae_recipe_says_it_is_outside_the_budget(dtype):
    d = _plan(recipe="fp8", **REF2VA, **{f"levers.{LEVER}": dtype}).decision(LEVER)
    assert (d.setting, d.lossless, d.forced) == (dtype, False, True)
    assert any("outside the measured budget" in r and "conditioning latents" in r for r in d.reasons)


def test_the_encode_is_the_biggest_share_names_its_cut():
    huge = [{**MEASURED[0], "seconds": 500.0}, {**MEASURED[1], "seconds": 100.0}]
    big = _plan(recipe="bf16", **FL2VA, **{"hardware.measured.encode": huge}).derived_value("call_biggest")
    assert big["part"] == "encode" and f"levers.{LEVER}=fp16" in big["cut"] and "800.0 s" in big["cut"]


@pytest.mark.parametrize("over,msg", [
    ({"recipe": "bf16", **FL2VA, f"levers.{LEVER}": "fp16"}, "policy lossless and vae=fp32"),
    ({"recipe": "fp8", f"levers.{LEVER}": "fp16"}, "t2va encodes nothing"),
    ({"recipe": "bf16", f"levers.{LEVER}": "fp32"}, "t2va encodes nothing"),
    ({"recipe": "bf16", **FL2VA, f"levers.{LEVER}": "off"}, "the encoder runs"),
])
def test_refusals_are_one_line(over, msg):
    with pytest.raises(PlanningError) as e:
        _plan(**over)
    assert msg in str(e.value) and "\n" not in str(e.value) and f"levers.{LEVER}=" in str(e.value)


def test_a_cast_encode_shrinks_the_vae_weights_by_its_encoder_and_quant_conv():
    from h3plan.planning.memory import vae_params

    a = _plan(recipe="fp8", **FL2VA)
    b = _plan(recipe="fp8", **FL2VA, **{f"levers.{LEVER}": "fp16"})
    n = vae_params(a.get("vae")["diffusers_config"])["encode_path"]
    got = (a.derived_value("memory_breakdown_gib")["vae_weights"]
           - b.derived_value("memory_breakdown_gib")["vae_weights"])
    assert got == pytest.approx(2 * n / 2**30, abs=0.011)  # 4 -> 2 bytes a parameter
    assert "vae_encode_precision=fp16" in b.derived_value("basis")["memory_breakdown_gib"]


TILES = "vae_encode_tiles"


@pytest.mark.parametrize("over,setting,why", [
    ({"recipe": "fp8"}, "off", "t2va encodes nothing"),
    ({"recipe": "bf16", **FL2VA}, "default", "vae_tiles is default"),
    ({"recipe": "fp8", **FL2VA}, "default", "vae_tiles=fp8_tiles re-tiles the decode; the encode keeps the VAE's own"),
])
def test_encode_tiles_decision_table(over, setting, why):
    d = _plan(**over).decision(TILES)
    assert (d.setting, d.lossless, d.forced) == (setting, True, False) and why in d.reasons[0]


def test_the_encode_tiles_row_shows_only_where_the_request_encodes_and_never_in_the_runs_line():
    assert TILES not in render_summary(_plan(recipe="fp8"))
    text = render_summary(_plan(recipe="fp8", **FL2VA))
    assert f"{TILES}      default" in text and f"{TILES}=" not in text  # default: nothing in the runs line


def test_forcing_the_decode_geometry_onto_the_encode():
    d = _plan(recipe="fp8", **FL2VA, **{f"levers.{TILES}": "decode"}).decision(TILES)
    assert (d.setting, d.lossless) == ("decode", False) and "outside the measured budget" in d.reasons[1]
    for over, msg in [({"recipe": "bf16", **FL2VA}, "vae_tiles is default"),
                      ({"recipe": "fp8"}, "t2va encodes nothing")]:
        with pytest.raises(PlanningError) as e:
            _plan(**over, **{f"levers.{TILES}": "decode"})
        assert msg in str(e.value) and "\n" not in str(e.value)


def test_ref2va_encodes_its_image_and_video_references_not_its_audio():
    from h3plan.facts.vae.encode import encode_inputs

    refs = [{"kind": "image", "height": 512, "width": 1024}, {"kind": "audio", "seconds": 3},
            {"kind": "video", "frames": 48, "fps": 24, "height": 720, "width": 1280, "audio_seconds": None}]
    p = _plan(recipe="bf16", **REF2VA, **{"video.references": refs})
    seq = p.derived_value("sequence")
    ins = encode_inputs(seq)
    image, video = seq["references"][0], seq["references"][2]
    assert [(x["frames"], x["height"], x["width"]) for x in ins] == [(1, image["height"], image["width"]),
                                                                    (video["frames"], video["height"], video["width"])]
    # each from the packaged point nearest its frame area: the image, resized to the pipeline's 2048-pixel short edge,
    # from the 2048x2048 reference; the video's frames, put on the 768x1344 canvas, from the keyframe's
    img, vid = ins
    assert (img["height"], img["width"]) == (2048, 4096) and (vid["height"], vid["width"]) == (768, 1344)
    pts = {tuple(q["input"]): q["seconds"] for q in p.get("hardware")["measured"]["encode"]
           if q["precision"] == "fp32" and q["tiles"] == "default"}
    want = pts[(1, 2048, 2048)] * 2 + pts[(1, 768, 1344)] * vid["frames"]
    assert p.derived_value("encode_s_est") == pytest.approx(want, abs=0.002)
    basis = p.derived_value("basis")["encode_s_est"]
    assert "1.54 s at 1x2048x2048" in basis and "0.1995 s at 1x768x1344" in basis


def test_an_encode_at_the_decode_geometry_reads_its_own_point_or_says_it_has_none():
    pts = MEASURED + [{**MEASURED[0], "tiles": "fp8_tiles", "seconds": 0.05}]
    shared = _plan(recipe="fp8", **FL2VA, **{"hardware.measured.encode": pts, f"levers.{TILES}": "decode"})
    assert shared.derived_value("encode_s_est") == pytest.approx(2 * 0.05 * 4)
    own = _plan(recipe="fp8", **FL2VA, **{"hardware.measured.encode": pts})
    assert own.derived_value("encode_s_est") == pytest.approx(2 * 0.1 * 4)
    none = _plan(recipe="fp8", **FL2VA, **{"hardware.measured.encode": MEASURED, f"levers.{TILES}": "decode"})
    assert none.derived_value("encode_s_est") is None
    assert "at the fp8_tiles geometry" in none.derived_value("basis")["encode_s_est"]
