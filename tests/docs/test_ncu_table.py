"""benchmarks/probes/ncu_table.py: the committed NVFP4 kernel table is what the committed Nsight Compute reports say."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
D = ROOT / "benchmarks" / "results" / "probes" / "nvfp4-session10"


def _ncu_table():
    spec = importlib.util.spec_from_file_location("ncu_table", ROOT / "benchmarks" / "probes" / "ncu_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_table_matches_the_reports(tmp_path):
    committed = json.loads((D / "ncu.json").read_text())
    labels = list(dict.fromkeys(r["layout"] for r in committed["records"]))
    reports = [f"{label}={D / name}" for label, name in zip(labels, ("ncu-call1-variant.txt", "ncu-call2-coalesced.txt"))]
    assert _ncu_table().main([str(tmp_path / "ncu"), *reports, "--copy-tbps", str(committed["copy_tbps"])]) == 0
    assert json.loads((tmp_path / "ncu.json").read_text()) == committed
    assert (tmp_path / "ncu.md").read_text() == (D / "ncu.md").read_text()
    cast = [r for r in committed["records"] if r["producer"] == "cast" and r["mode"] == "static"]
    assert [round(r["us"], 1) for r in cast] == [171.7, 105.1]  # the reports' own Duration lines


def test_a_report_with_launches_missing_is_refused(tmp_path):
    text = (D / "ncu-call2-coalesced.txt").read_text()
    cut = text[:text.index("  _cast_kernel")]  # the cast's three launches missing
    (tmp_path / "short.txt").write_text(cut)
    with pytest.raises(SystemExit, match="has 9 launches, want 12"):
        _ncu_table().main([str(tmp_path / "x"), f"short={tmp_path / 'short.txt'}", "--copy-tbps", "4.27"])
