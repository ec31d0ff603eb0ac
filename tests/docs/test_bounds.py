"""benchmarks/bounds.py reads only committed results: it runs on a CPU and its verdicts follow from the numbers."""
import json
from pathlib import Path
from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _bounds():
    return load_script("benchmarks/bounds.py")


def test_bounds_from_committed_results(tmp_path):
    import shutil

    res = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", res, ignore=shutil.ignore_patterns("logs", "sweeps", "*.png"))
    assert _bounds().main(["--results", str(res)]) == 0
    rows = json.loads((res / "bounds-h200.json").read_text())["records"]
    assert {r["target"].split(" (issue ")[1][:2] for r in rows} == {"11", "12", "13", "19", "23"}
    for r in rows:
        assert r["now"] <= r["bound"] * 1.05, r  # a bound below today's measurement would be no bound
    assert (res / "bounds-h200.md").read_text() == (ROOT / "benchmarks" / "results" / "bounds-h200.md").read_text()
