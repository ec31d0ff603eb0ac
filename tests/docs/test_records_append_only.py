"""The committed pipe(...) rows are what their runs wrote: every record of benchmarks/results/pipeline-h200.json (and
of any other card's pipeline-<card>.json) matches the digest benchmarks/record_digests.py appended for it, none listed
is gone, and every record has one."""

import copy
import json

import pytest
from scripts import load_script

digests = load_script("benchmarks/record_digests.py")


def _committed():
    records = json.loads((digests.RESULTS / digests.FILE).read_text())["records"]
    return records, digests.load(digests.digests_path(), digests.FILE)


def test_the_records_files_are_found():
    assert digests.FILE in digests.record_files()
    assert not {n for n in digests.record_files() if n.endswith(("-digests.json", "-corrections.json"))}


@pytest.mark.parametrize("name", digests.record_files())
def test_every_committed_record_matches_its_digest(name):
    records = json.loads((digests.RESULTS / name).read_text())["records"]
    entries = digests.load(digests.digests_path(digests.RESULTS, name), name)
    assert entries, f"the digests of {name} list no record"
    found = digests.problems(records, entries)
    assert not found, "\n".join(line for _, line in found)


def test_each_cards_file_has_its_own_digests(tmp_path, capsys):
    records, _ = _committed()
    for name, rows in (("pipeline-h200.json", records[:2]), ("pipeline-h100.json", records[2:4])):
        (tmp_path / name).write_text(json.dumps({"records": rows}))
    (tmp_path / "pipeline-h200-corrections.json").write_text(json.dumps({"records": []}))
    assert digests.main(["--results", str(tmp_path)]) == 0
    assert [e["key"] for e in digests.load(tmp_path / "pipeline-h100-digests.json", "pipeline-h100.json")] == \
        [digests.key_of(r) for r in records[2:4]]
    assert not (tmp_path / "pipeline-h200-corrections-digests.json").exists()
    edited = copy.deepcopy(records[2:4])
    edited[0]["e2e_s"] = 1.0
    (tmp_path / "pipeline-h100.json").write_text(json.dumps({"records": edited}))
    assert digests.main(["--results", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "pipeline-h100.json: record" in err and "pipeline-h200.json" not in err
    assert digests.main(["--results", str(tmp_path), "--check", "--file", "pipeline-h200.json"]) == 0


@pytest.mark.parametrize("edit", ["figure", "note", "dropped", "added_field"])
def test_an_edited_or_dropped_record_is_caught(edit):
    records, entries = _committed()
    records = copy.deepcopy(records)
    plan = next(i for i, r in enumerate(records) if r["setting"] == "plan")
    if edit == "figure":
        records[plan]["forward_s"] *= 1.01
    elif edit == "note":
        records[plan]["notes"] = records[plan]["notes"] + ["re-derived after the run"]
    elif edit == "dropped":
        del records[plan]
    else:
        records[plan]["frames_vs_lossless"] = {"psnr_db": 40.0}
    kinds = [k for k, _ in digests.problems(records, entries)]
    assert kinds == (["gone"] if edit == "dropped" else ["changed"])


def test_a_new_run_is_appended_and_an_edit_is_refused(tmp_path, capsys):
    records, _ = _committed()
    doc = {"records": records[:3]}
    (tmp_path / digests.FILE).write_text(json.dumps(doc))
    assert digests.main(["--results", str(tmp_path)]) == 0
    first = digests.load(digests.digests_path(tmp_path), digests.FILE)
    assert [e["key"] for e in first] == [digests.key_of(r) for r in records[:3]]
    assert digests.main(["--results", str(tmp_path), "--check"]) == 0

    doc["records"] = records[:5]  # a later run's rows merged in
    (tmp_path / digests.FILE).write_text(json.dumps(doc))
    assert digests.main(["--results", str(tmp_path), "--check"]) == 1
    assert "has no digest" in capsys.readouterr().err
    assert digests.main(["--results", str(tmp_path)]) == 0
    second = digests.load(digests.digests_path(tmp_path), digests.FILE)
    assert second[:3] == first and len(second) == 5

    edited = copy.deepcopy(records[:5])
    edited[1]["e2e_s"] = 1.0
    (tmp_path / digests.FILE).write_text(json.dumps({"records": edited}))
    assert digests.main(["--results", str(tmp_path)]) == 1
    assert "changed after it was committed" in capsys.readouterr().err
    assert digests.load(digests.digests_path(tmp_path), digests.FILE) == second  # never rewritten


def test_a_file_that_is_not_a_digest_file_is_refused(tmp_path):
    path = tmp_path / "pipeline-h200-digests.json"
    path.write_text(json.dumps({"kind": "other", "records": []}))
    with pytest.raises(ValueError, match="is not the record digests of pipeline-h200.json"):
        digests.load(path, digests.FILE)
