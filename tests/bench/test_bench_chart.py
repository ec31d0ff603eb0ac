"""The PNG chart (benchmarks/plot.py through the bench action), drawn on the CPU from a fake result set."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from h3plan.actions import bench

from bench_fake import records

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_chart_without_matplotlib_says_why(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    why = bench.write_chart(records(), str(tmp_path / "c.png"))
    assert why and "matplotlib is not installed" in why and not (tmp_path / "c.png").exists()


@pytest.mark.parametrize("best", [False, True], ids=["older-records", "with-diffusers-best"])
def test_chart_is_a_png_of_the_expected_size(tmp_path, best):
    """With best_ms in the records the time panel gets diffusers' best as a fourth bar (write_chart returns the
    reason instead of None on any drawing error)."""
    pytest.importorskip("matplotlib", reason="matplotlib draws the PNG (pip install 'h3plan[bench]')")
    from matplotlib.image import imread

    path = tmp_path / "block-h200.png"
    recs = [dict(r, best_ms=r["eager_ms"] * 0.85) if best and r["blocks"] == 1 else r for r in records()]
    assert bench.write_chart(recs, str(path)) is None
    assert path.read_bytes()[:8] == PNG_MAGIC
    h, w = imread(str(path)).shape[:2]
    assert (w, h) == (16 * 110, int(4.8 * 110))  # figsize x dpi


def test_chart_with_no_successful_record_is_skipped(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib draws the PNG (pip install 'h3plan[bench]')")
    failed = [dict(r, error="boom", plan_ms=None) for r in records()]
    assert "no successful records" in bench.write_chart(failed, str(tmp_path / "x.png"))
    assert not (tmp_path / "x.png").exists()


@pytest.mark.slow  # a subprocess with matplotlib (~7 s)
def test_plot_cli_redraws_png_and_markdown_from_the_json(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib draws the PNG (pip install 'h3plan[bench]')")
    doc = bench.new_doc()
    for r in records():
        bench.merge_record(doc, r)
    src = tmp_path / "block-h200.json"
    src.write_text(json.dumps(doc))
    res = subprocess.run([sys.executable, "benchmarks/plot.py", str(src), "--md"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "block-h200.png").read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / "block-h200.md").read_text() == bench.render_markdown(doc)
    bad = subprocess.run([sys.executable, "benchmarks/plot.py", str(tmp_path / "missing.json")], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("plot: cannot read records")
