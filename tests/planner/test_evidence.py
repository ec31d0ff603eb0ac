"""facts/evidence.py: a QualityPoint meets a budget only where every bound set is reached by a figure it has; a
verdict judges the calibrated points where any exist, else the published ones, by the worst; a points file round
trips and anything else is one line naming the file."""

import pytest

from h3plan.facts import evidence as ev


def _p(ssim, psnr, audio=None, kind="published", **knobs):
    return ev.QualityPoint.make("lever", "on", knobs or {"k": 1}, ["t2va"], ssim=ssim, psnr_db=psnr, audio_snr_db=audio,
                                kind=kind, where="here", source="docs/sources.md#x")


def test_meets_every_bound_it_has_a_figure_for():
    b = ev.Budget.of({"psnr_db_min": 28, "ssim_min": 0.93})
    assert _p(0.931, 28.16).meets(b) and _p(0.931, 28.0).meets(b)
    assert _p(0.901, 28.77).misses(b) == ["SSIM 0.901 < 0.93"]
    assert _p(0.9, 27.0).misses(b) == ["SSIM 0.9 < 0.93", "PSNR 27 dB < 28 dB"]
    audio = ev.Budget.of({"psnr_db_min": 28, "ssim_min": 0.93, "audio_snr_db_min": 15})
    assert _p(0.95, 30.0).misses(audio) == ["audio SNR not measured"]
    assert _p(0.95, 30.0, 20.0).meets(audio)
    assert ev.Budget.of(None).empty and _p(None, None).meets(ev.Budget())
    assert audio.text() == "SSIM >= 0.93, PSNR >= 28 dB, audio SNR >= 15 dB"


def test_verdict_prefers_calibrated_and_takes_the_worst():
    b = ev.Budget.of({"psnr_db_min": 28, "ssim_min": 0.93})
    assert ev.verdict([], b).status == "unmeasured"
    good, bad = _p(0.95, 30.0), _p(0.90, 29.0)
    v = ev.verdict([good, bad], b)
    assert (v.status, v.point, v.misses) == ("misses", bad, ("SSIM 0.9 < 0.93",))
    mine = _p(0.94, 29.0, kind="calibrated")
    assert ev.verdict([bad, mine], b).point is mine and ev.verdict([bad, mine], b).status == "meets"
    assert ev.best([good, bad, mine]) is good


def test_applies_needs_every_knob_and_the_workflow():
    p = _p(0.9, 28.0, threshold=0.04, warmup=4)
    assert p.applies("lever", "on", {"threshold": 0.04, "warmup": 4, "other": 1}, "t2va")
    assert not p.applies("lever", "on", {"threshold": 0.08, "warmup": 4}, "t2va")
    assert not p.applies("lever", "on", {"threshold": 0.04}, "t2va")
    assert not p.applies("lever", "on", {"threshold": 0.04, "warmup": 4}, "fl2va")
    assert not p.applies("lever", "off", {"threshold": 0.04, "warmup": 4}, "t2va")


@pytest.mark.parametrize("suffix", ["yaml", "json"])
def test_points_file_round_trip(tmp_path, suffix):
    path = str(tmp_path / f"points.{suffix}")
    p = ev.QualityPoint.make("step_cache", "fixed", {"computed": 40, "forwards": 49}, ["t2va"], psnr_db=31.5, ssim=0.95,
                             audio_snr_db=21.0, speedup=1.2, kind="calibrated", where="2 prompts")
    ev.write_points(path, "step_cache", [p], checkpoint="/ckpt", date="d")
    (got,), ckpt = ev.read_points(path, "step_cache")
    assert got == ev.QualityPoint.make("step_cache", "fixed", {"computed": 40, "forwards": 49}, ["t2va"], psnr_db=31.5,
                                       ssim=0.95, audio_snr_db=21.0, speedup=1.2, kind="calibrated", where="2 prompts",
                                       source=path) and ckpt == "/ckpt"
    with pytest.raises(ev.EvidenceError, match="points of lever 'step_cache', not other"):
        ev.read_points(path, "other")


@pytest.mark.parametrize("body,match", [
    ("not: [valid", "not JSON or YAML"),
    ("format: h3plan.quality_points\nversion: 2\n", "version 2, this h3plan reads 1"),
    ("format: h3plan.quality_points\nversion: 1\nlever: step_cache\npoints: []\n", "non-empty 'points'"),
    ("format: h3plan.quality_points\nversion: 1\nlever: step_cache\npoints: [{setting: fixed}]\n",
     "needs setting, knobs"),
    ("format: h3plan.quality_points\nversion: 1\nlever: step_cache\npoints: [{setting: fixed, knobs: {}, workflows: "
     "[t2va], ssim: .nan}]\n", "ssim=nan must be a finite number"),
])
def test_a_bad_points_file_is_one_line(tmp_path, body, match):
    path = tmp_path / "p.yaml"
    path.write_text(body)
    with pytest.raises(ev.EvidenceError, match=match) as e:
        ev.read_points(str(path), "step_cache")
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ev.EvidenceError, match="bin.json"):
        ev.read_points(str(tmp_path / "bin.json"), "step_cache")
