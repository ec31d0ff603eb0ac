"""The numbers the README, the docs and the hardware files quote are the committed results' numbers.

- README tables between `<!-- generated: ... -->` markers are what benchmarks/readme_tables.py writes from
  benchmarks/results/*.json (after a bench: `python benchmarks/readme_tables.py`, commit both);
- every results .md with a generator is that generator's output of its .json;
- every decimal in the README's measured section, and in a docs/ paragraph that cites a results file, appears
  in the results files it cites;
- every measurement in conf/hardware/*.yaml whose source cites a results file appears in that file (a run
  kept from git history is allowed where the source names its commit; the last run must be in the file);
- nothing cites a file outside the repository.
"""

import json
import re
from pathlib import Path

import pytest
import yaml
from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
README = (ROOT / "README.md").read_text()
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")


def _module(name: str):
    return load_script(f"benchmarks/{name}.py")


def _json(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _numbers(obj, out: set) -> set:
    """Every number in a JSON document, as text rounded to 0-3 decimals (how the docs print them)."""
    if isinstance(obj, dict):
        for v in obj.values():
            _numbers(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _numbers(v, out)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out.update(f"{round(obj, nd):.{nd}f}" for nd in range(4))
    return out


def _cited_text(refs) -> tuple[str, set]:
    text, nums = "", set()
    for ref in refs:
        for base in (RESULTS, ROOT):
            p = base / ref
            if p.is_file():
                break
        else:
            raise AssertionError(f"cited file {ref} does not exist")
        for q in {p, p.with_suffix(".md"), p.with_suffix(".json")}:
            if q.is_file():
                text += q.read_text()
                if q.suffix == ".json":
                    _numbers(json.loads(q.read_text()), nums)
    return text, nums


def test_readme_tables_are_written_from_the_results():
    tables = _module("readme_tables")
    assert len(tables.MARK.findall(README)) == len(tables.TABLES)
    assert tables.render(README) == README, ("README tables differ from benchmarks/results: "
                                             "run python benchmarks/readme_tables.py")


def test_a_changed_result_fails_the_check(tmp_path, monkeypatch):
    tables = _module("readme_tables")
    doc = _json("pipeline-h200.json")
    doc["records"][0]["forward_s"] += 1.0
    (tmp_path / "pipeline-h200.json").write_text(json.dumps(doc))
    for name in ("block-h200.json", "parallel-h200.json"):
        (tmp_path / name).write_text((RESULTS / name).read_text())
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert tables.render(README) != README


def _pipeline_records():
    from h3plan.actions.bench import pipeline_records

    return pipeline_records


GENERATED = [
    *((stem, lambda doc, stem=stem: _pipeline_records().render_markdown(
        doc, _pipeline_records().load_corrections(str(RESULTS / f"{stem}.json"))))
      for stem in ("pipeline-h200", "pipeline-h100")),
    ("block-h200", lambda doc: __import__("h3plan.actions.bench.records", fromlist=["x"]).render_markdown(doc)),
    ("parallel-h200", lambda doc: _module("parallel").markdown(doc)),
    ("parallel-8blocks-h200", lambda doc: _module("parallel").markdown(doc)),
    ("parallel-bf16-h200", lambda doc: _module("parallel").markdown(doc)),
    ("vae-h200", lambda doc: _module("vae").markdown(doc, doc["records"])),
]


@pytest.mark.parametrize("stem,render", GENERATED, ids=[g[0] for g in GENERATED])
def test_results_markdown_is_its_json_rendered(stem, render):
    assert render(_json(f"{stem}.json")) == (RESULTS / f"{stem}.md").read_text()


def test_every_correction_names_a_committed_row_and_shows_at_it():
    """pipeline-h200-corrections.json: each correction's row (and the row superseding it) is in pipeline-h200.json;
    the markdown and the README table show it at that row; the first_block row's overhead check, declared before its
    run, is a FAIL there."""
    pr = _pipeline_records()
    recs = _json("pipeline-h200.json")["records"]
    fixes = pr.load_corrections(str(RESULTS / "pipeline-h200.json"))
    assert fixes
    for c in fixes:
        assert [r for r in recs if pr.corrections_of(r, [c])], c["row"]
        if c.get("superseded_by"):
            assert any(pr.record_key(r) == pr.record_key(c["superseded_by"]) for r in recs), c["superseded_by"]
    fb = next(r for r in recs if r["run"] == "2026-12-02 16:09:40" and "+step_cache=first_block" in r["label"])
    assert [(k["name"], k["result"]) for k in pr.checks_of(fb, fixes)] == [("overhead", "FAIL")]
    md = (RESULTS / "pipeline-h200.md").read_text()
    assert "| whole call | overhead FAIL (corrected) |" in md and "**correction** (corrections file)" in md
    line = next(x for x in README.splitlines()
                if x.startswith("| 12-02 16:09 | t2va | sm90/fp8/u1 +step_cache=first_block"))
    assert "overhead FAIL (corrected)" in line


def test_bounds_quote_the_timed_benches():
    block = {r["S"]: r["speedup"] for r in _json("block-h200.json")["records"] if r["recipe"] == "fp8"}
    rows = [r for r in _json("bounds-h200.json")["records"] if r["target"].startswith("FP8 block")]
    assert rows and all(r["now"] == round(block[r["S"]], 3) for r in rows), rows


def _measured_section() -> list[tuple[list[str], str]]:
    """(cited results files, text) per paragraph or bullet of the README's H200 section; a paragraph that cites
    nothing belongs to the one before it (a table after its caption)."""
    sec = README[README.index("## Measured on the H200"):]
    sec = sec[:sec.index("\n## ", 5)]
    cite = re.compile(r"`((?:[\w-]+/)*[\w.-]+\.(?:md|json|log|yaml))`")
    groups: list[list] = []
    for para in re.split(r"\n\s*\n", sec):
        refs = [r for r in cite.findall(para) if not r.startswith("tests/")]
        if refs or not groups:
            groups.append([refs, para])
        else:
            groups[-1][1] += "\n\n" + para
    out = []
    for refs, para in groups:
        for item in re.split(r"\n- ", para):
            out.append(([r for r in cite.findall(item) if not r.startswith("tests/")] or refs, item))
    return out


def test_readme_numbers_are_in_the_files_they_cite():
    missing = []
    for refs, text in _measured_section():
        if not refs:
            continue  # the versions line
        body = re.sub(r"<!-- generated: .*?<!-- /generated -->", "", text, flags=re.S)  # checked above
        cited, nums = _cited_text(refs)
        missing += [(n, refs) for n in DECIMAL.findall(body) if n not in cited and n not in nums]
    assert not missing, missing


@pytest.mark.parametrize("doc", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_docs_numbers_are_in_the_results_they_cite(doc):
    cite = re.compile(r"(?:benchmarks/results/)?((?:[\w-]+/)*[\w.-]+-h[12]00(?:x\d)?\.(?:md|json|log))")
    missing = []
    for para in re.split(r"\n\s*\n", (ROOT / "docs" / doc).read_text()):
        refs = cite.findall(para)
        if refs:
            cited, nums = _cited_text(refs)
            missing += [(n, refs) for n in DECIMAL.findall(para) if n not in cited and n not in nums]
    assert not missing, missing


def _hardware_points(node, path=""):
    if isinstance(node, dict):
        sources = " ".join(v for k, v in node.items() if k.endswith("source") and isinstance(v, str))
        files = re.findall(r"benchmarks/results/[\w./-]+?\.(?:json|md)", sources)
        if files:
            yield path, node, files, "commit" in sources
        for k, v in node.items():
            yield from _hardware_points(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _hardware_points(v, f"{path}[{i}]")


@pytest.mark.parametrize("hw", ["sm90", "sm100", "sm103", "sm107"])
def test_hardware_measurements_are_in_the_results_they_cite(hw):
    facts = yaml.safe_load((ROOT / "conf" / "hardware" / f"{hw}.yaml").read_text())
    missing = []
    for path, node, files, from_history in _hardware_points(facts, hw):
        cited, nums = _cited_text([f.removeprefix("benchmarks/results/") for f in files])
        for k, v in node.items():
            vals = ([v] if isinstance(v, float)
                    else [x for x in v if isinstance(x, float)] if isinstance(v, list) else [])
            if from_history and isinstance(v, list):
                vals = vals[-1:]  # earlier runs live in the file's git history, named by commit in the source
            missing += [(f"{path}.{k}", x, files) for x in vals if repr(x) not in cited and repr(x) not in nums]
    assert not missing, missing


OUTSIDE = re.compile(r"\.\./shared|/work/|\bDESIGN\.md")


def test_nothing_points_outside_the_repository():
    files = [ROOT / "README.md", ROOT / "tests" / "gpu" / "README.md", *(ROOT / "docs").glob("*.md"),
             *(ROOT / "conf").rglob("*.yaml"), *(ROOT / "h3plan").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "benchmarks").glob("*.sh")]
    bad = [f"{f.relative_to(ROOT)}:{i}" for f in files for i, line in enumerate(f.read_text().splitlines(), 1)
           if OUTSIDE.search(line)]
    assert not bad, bad
