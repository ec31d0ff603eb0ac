"""benchmarks/probes/ncu_table.py: the committed NVFP4 kernel table is what the committed Nsight Compute reports say."""
import json
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
D = ROOT / "benchmarks" / "results" / "probes" / "nvfp4-session10"


def _ncu_table():
    return load_script("benchmarks/probes/ncu_table.py")


# each session folder's reports, in the order of its table's layouts
REPORTS = {
    "nvfp4-session10": ("ncu-call1-variant.txt", "ncu-call2-coalesced.txt"),
    "nvfp4-session11": ("ncu-call1-main.txt", "ncu-call1-next.txt", "ncu-call3-swept.txt", "ncu-call4-planned.txt",
                        "ncu-call4-runner-up.txt", "ncu-call6-committed.txt", "ncu-call6-hints.txt"),
}
CAST_US = {"nvfp4-session10": [171.7, 105.1], "nvfp4-session11": [119.0, 104.2, 102.0, 103.0, 103.7, 104.1, 102.8]}


@pytest.mark.parametrize("folder", sorted(REPORTS))
def test_table_matches_the_reports(tmp_path, folder):
    d = D.parent / folder
    committed = json.loads((d / "ncu.json").read_text())
    labels = list(dict.fromkeys(r["layout"] for r in committed["records"]))
    reports = [f"{label}={d / name}" for label, name in zip(labels, REPORTS[folder], strict=True)]
    assert _ncu_table().main([str(tmp_path / "ncu"), *reports, "--copy-tbps", str(committed["copy_tbps"])]) == 0
    assert json.loads((tmp_path / "ncu.json").read_text()) == committed
    assert (tmp_path / "ncu.md").read_text() == (d / "ncu.md").read_text()
    cast = [r for r in committed["records"] if r["producer"] == "cast" and r["mode"] == "static"]
    assert [round(r["us"], 1) for r in cast] == CAST_US[folder]  # the reports' own Duration lines


def test_a_report_with_launches_missing_is_refused(tmp_path):
    text = (D / "ncu-call2-coalesced.txt").read_text()
    cut = text[:text.index("  _cast_kernel")]  # the cast's three launches missing
    (tmp_path / "short.txt").write_text(cut)
    with pytest.raises(SystemExit, match="has 9 launches, want 12"):
        _ncu_table().main([str(tmp_path / "x"), f"short={tmp_path / 'short.txt'}", "--copy-tbps", "4.27"])
