"""Predictions declared before the run (benchmarks/predict.py --declare, benchmarks/results/predict-declared-h200.*).

- every pending phase of the bench is declared, and each declared phase is one of benchmarks/pipeline_h200.sh's;
- a declaration is what the packaged facts of the hash it names give (checked while sm90.yaml still has that hash);
- `--declare` adds the phases not declared yet and never rewrites one;
- a measured row is checked from the declared numbers alone (nothing planned again), and only a row run after the
  declaration;
- the committed table is the script's output.
"""

import json
import re
from pathlib import Path

import pytest

from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DOC = json.loads((ROOT / "benchmarks/results/predict-declared-h200.json").read_text())
RECORDS = json.loads((ROOT / "benchmarks/results/pipeline-h200.json").read_text())["records"]
SCRIPT = load_script("benchmarks/predict.py")
KEPT = ("declared", "facts_sha256")  # the declaration's own fields, beside what the plan gave


def test_every_pending_phase_is_declared_and_is_a_phase_of_the_bench():
    bench = (ROOT / "benchmarks/pipeline_h200.sh").read_text()
    phases = set(re.findall(r"^\s*([a-z0-9|-]+)\)", bench, re.M))
    phases = {p for alt in phases for p in alt.split("|")}
    declared = [d["phase"] for d in DOC["declarations"]]
    assert len(declared) == len(set(declared))
    assert set(SCRIPT.PENDING) <= set(declared)
    assert set(declared) <= phases, set(declared) - phases
    for d in DOC["declarations"]:
        assert re.fullmatch(r"[0-9a-f]{64}", d["facts_sha256"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", d["declared"])


def test_a_declaration_is_what_the_facts_of_its_hash_give():
    """While conf/hardware/sm90.yaml is the file a declaration names, planning its phase again gives its numbers
    (after a change to the facts the declaration stands as written: that is its point)."""
    same = [d for d in DOC["declarations"] if d["facts_sha256"] == SCRIPT.facts_sha256()]
    for d in same:
        again = SCRIPT.declaration(d["phase"], d["overrides"])
        assert json.loads(json.dumps(again)) == {k: v for k, v in d.items() if k not in KEPT}, d["phase"]


def test_declare_adds_new_phases_and_never_rewrites_one(tmp_path, monkeypatch):
    path = tmp_path / "declared.json"
    kept = {**DOC["declarations"][0], "forward_s_est": 123.0, "declared": "2000-01-01 00:00:00"}
    path.write_text(json.dumps({**DOC, "declarations": [kept]}))
    monkeypatch.setattr(SCRIPT, "PENDING", {kept["phase"]: kept["overrides"], "whole-lossless": {"recipe": "bf16"}})
    doc = SCRIPT.declare(path)
    assert doc["declarations"][0] == kept  # as written, though the facts give another forward
    assert [d["phase"] for d in doc["declarations"]] == [kept["phase"], "whole-lossless"]
    new = doc["declarations"][1]
    assert new["facts_sha256"] == SCRIPT.facts_sha256() and new["declared"] > kept["declared"]
    assert new["forward_s_est"] > 0 and new["label"] == "sm90/bf16/u1"


def _decl(**kw):
    return {"phase": "p", "declared": "2026-12-05 00:00:00", "workflow": "t2va", "video": "768x1344x124",
            "label": "sm90/fp8/u1 tier=quality +vae=fp16", "S": 37820, "forwards": 5, "layers": 50,
            "cache_setting": "first_block", "computed_forwards": 5, "forward_s_est": 4.0, "forward_sparse_s_est": 2.0,
            "dense_forwards": 2, "call_s_est": 20.0, "text_encode_s_est": 1.0, **kw}


def _row(**kw):
    return {"run": "2026-12-06 00:00:00", "setting": "plan", "gpus": 1, "whole_call": True, "workflow": "t2va",
            "device": "NVIDIA H200",
            "video": "768x1344x124", "label": "sm90/fp8/u1 tier=quality +vae=fp16", "S": 37820, "steps_e2e": 5,
            "forward_s": 2.5, "e2e_s": 16.0, "request": {"memory.text_encoder": "auto"},
            "call_computed": [True, True, False, True, True], **kw}


def test_a_row_is_checked_from_the_declared_numbers_alone():
    got = SCRIPT.check_declared(_decl(), _row())
    # computed: two dense (4.0) and two sparse (2.0) forwards: their median 3.0
    assert got["forward_s_est"] == pytest.approx(3.0) and got["forward_err"] == pytest.approx(3.0 / 2.5 - 1)
    # the call less the text encode (prompt_embeds given) less the skipped sparse forward but its first block
    assert got["call_s_est"] == pytest.approx(20.0 - 1.0 - 2.0 * (1 - 1 / 50))
    assert got["call_err"] == pytest.approx(got["call_s_est"] / 16.0 - 1)
    every = SCRIPT.check_declared(_decl(cache_setting="fixed"), _row(call_computed=None))
    assert every["forward_s_est"] == pytest.approx(2.0) and every["call_s_est"] == pytest.approx(19.0)


def test_a_row_that_failed_reads_failed_not_run_yet():
    """A run that failed before its call (the bench records each of its rows with the error) is listed as failed
    against the declaration, and counted apart from the checked runs."""
    bad = _row(error="OutOfMemoryError: CUDA out of memory", forward_s=None, e2e_s=None, call_computed=None)
    assert SCRIPT.check_declared(_decl(), bad) == {"run": bad["run"], "S": bad["S"], "error": bad["error"]}
    doc = {"tolerance": 0.05, "declarations": [dict(_decl(), computed_forwards=5)]}
    md = SCRIPT.declared_markdown(doc, [bad, _row(run="2026-12-07 00:00:00")])
    assert f"| {bad['run']}: failed (OutOfMemoryError: CUDA out of memory); 2026-12-07 00:00:00: forward " in md
    assert md.rstrip().endswith("Checked: 1 runs, 1 beyond 5%; 1 failed before their call (no figure to check).")


def test_only_a_row_of_its_request_and_label_run_after_the_declaration_on_the_facts_gpu_is_checked():
    d = _decl()
    rows = [_row(), _row(run="2026-12-04 00:00:00"), _row(video="768x1344x243"), _row(label="sm90/bf16/u1"),
            _row(workflow="fl2va"), _row(whole_call=False), _row(gpus=2), _row(setting="best"),
            _row(device="NVIDIA H100 80GB HBM3")]  # another card than the facts' (sm90.yaml products: H200)
    assert SCRIPT.declared_rows(d, rows) == rows[:1]


def test_the_committed_table_is_the_scripts_output():
    md = SCRIPT.declared_markdown(DOC, RECORDS)
    assert md == (ROOT / "benchmarks/results/predict-declared-h200.md").read_text()
    assert "Checked:" in md and all(d["phase"] in md for d in DOC["declarations"])
