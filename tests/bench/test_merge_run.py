"""benchmarks/merge_run.py: a collected run goes to the records file of the card it ran on, its ratios taken from
that card's rows only, a committed run is never merged twice, and a run that names no device is refused."""

import copy
import json
import shutil
from pathlib import Path

import pytest
from scripts import load_script

merge_run = load_script("benchmarks/merge_run.py")
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _committed():
    return json.loads((RESULTS / "pipeline-h200.json").read_text())


def _as_run(doc, run_id, new_id, device):
    meta = copy.deepcopy(next(m for m in doc["runs"] if m["run"] == run_id))
    rows = [copy.deepcopy(r) for r in doc["records"] if r["run"] == run_id]
    meta["run"], meta["device"] = new_id, device
    for r in rows:
        r["run"], r["device"] = new_id, device
        r.pop("best_run", None)
    return meta, rows


@pytest.fixture
def results(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    for name in ("pipeline-h200.json", "pipeline-h200-corrections.json"):
        shutil.copy(RESULTS / name, out / name)
    return out


def _collected(tmp_path, runs, records, log="=== phase whole-best\n"):
    d = tmp_path / "collected"
    d.mkdir(exist_ok=True)
    doc = _committed()
    doc["runs"], doc["records"] = runs, records
    (d / "pipeline-h200.json").write_text(json.dumps(doc))
    (d / "detached.log").write_text(log)
    return d


def test_an_h100_run_goes_to_its_own_file_with_its_own_baseline(tmp_path, results):
    from h3plan.actions.bench import pipeline_records as pr

    doc = _committed()
    plan = next(r for r in reversed(doc["records"]) if r["setting"] == "plan" and r.get("best_run"))
    best = next(r for r in doc["records"] if r["run"] == plan["best_run"] and r["setting"] == "best")
    assert pr.same_request(plan, best)  # an H200 plan row and the H200 compile it was held against
    m1, r1 = _as_run(doc, best["run"], "2099-01-01 00:00:00", "NVIDIA H100 80GB HBM3")
    m2, r2 = _as_run(doc, plan["run"], "2099-01-01 00:10:00", "NVIDIA H100 80GB HBM3")
    m3, r3 = _as_run(doc, plan["run"], "2099-01-01 00:20:00", "NVIDIA H100 80GB HBM3")
    committed = next(m for m in doc["runs"] if m["run"] == plan["run"])
    same = [r for r in doc["records"] if r["run"] == plan["run"]]
    before = (results / "pipeline-h200.json").read_text()

    # a plan run alone: no H100 compile yet, and the H200's is no baseline
    assert merge_run.merge(_collected(tmp_path, [committed, m2], same + r2), results) == {"h100": len(r2)}
    assert (results / "pipeline-h200.json").read_text() == before  # the committed H200 run is not merged again
    h100 = json.loads((results / "pipeline-h100.json").read_text())
    alone = next(r for r in h100["records"] if r["run"] == m2["run"] and r["setting"] == "plan")
    assert alone.get("best_run") is None and alone["speedup_vs_best"] is None

    # then the H100's compile, and a plan run after it: held against that compile
    assert merge_run.merge(_collected(tmp_path, [m1, m3], r1 + r3), results) == {"h100": len(r1) + len(r3)}
    h100 = json.loads((results / "pipeline-h100.json").read_text())
    assert [r["run"] for r in h100["records"]] == [r["run"] for r in r2 + r1 + r3]
    later = next(r for r in h100["records"] if r["run"] == m3["run"] and r["setting"] == "plan")
    assert later["best_run"] == m1["run"]
    own = next(r for r in r1 if r["setting"] == "best" and r["vae"] == later["vae"])
    assert later["speedup_vs_best"] == pytest.approx(own["e2e_s"] / later["e2e_s"])
    assert (results / "pipeline-h100.md").exists()
    assert (results / "pipeline-h100.log").read_text() == "=== phase whole-best\n" * 2

    assert merge_run.merge(_collected(tmp_path, [m1, m3], r1 + r3), results) == {}  # merged once


def test_an_h200_run_goes_to_the_h200_file(tmp_path, results):
    doc = _committed()
    m, rows = _as_run(doc, doc["runs"][-1]["run"], "2099-01-02 00:00:00", "NVIDIA H200")
    collected = _collected(tmp_path, [m], rows)
    assert merge_run.merge(collected, results) == {"h200": len(rows)}
    h200 = json.loads((results / "pipeline-h200.json").read_text())
    assert h200["records"][-len(rows):][0]["run"] == m["run"] and not (results / "pipeline-h100.json").exists()


def test_a_run_without_a_device_is_refused(tmp_path, results):
    doc = _committed()
    m, rows = _as_run(doc, doc["runs"][-1]["run"], "2099-01-03 00:00:00", "")
    collected = _collected(tmp_path, [m], rows)
    with pytest.raises(SystemExit, match="names no device"):
        merge_run.merge(collected, results)
    assert merge_run.main([str(tmp_path / "nowhere")]) == 1
