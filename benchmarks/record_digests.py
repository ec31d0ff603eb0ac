"""A committed pipe(...) row stays what its run wrote. benchmarks/results/pipeline-h200-digests.json holds, by record
key, the sha256 of every record of pipeline-h200.json (its canonical JSON: sorted keys, no spaces); a card's own
records file (pipeline-<card>.json, e.g. pipeline-h100.json) has its own <stem>-digests.json the same way.
tests/docs/test_records_append_only.py fails where a record no longer matches its digest (an edit: what was learned
after a run goes to pipeline-h200-corrections.json, a better figure to a new row), where a listed record is gone, and
where a record has no digest yet. After merging a run's rows into pipeline-h200.json, this script appends the new
records' digests; it never rewrites one, and refuses (exit 1, one line per record) while any committed record differs
from its digest.

    python benchmarks/record_digests.py [--check] [--file pipeline-h200.json]   (default: every records file)
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FILE = "pipeline-h200.json"
DERIVED = ("-digests.json", "-corrections.json")  # files kept beside a records file, not records files
KIND = "record-digests"


def record_files(results: Path = RESULTS) -> list[str]:
    """The pipe(...) records files in `results`, one per card the pipeline bench's rows were committed for."""
    return sorted(p.name for p in results.glob("pipeline-*.json") if not p.name.endswith(DERIVED))


def digests_path(results: Path = RESULTS, name: str = FILE) -> Path:
    """<stem>-digests.json beside <stem>.json."""
    return results / (name.removesuffix(".json") + "-digests.json")


def digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def key_of(record: dict) -> list:
    """pipeline_records.record_key, as a JSON list."""
    from h3plan.actions.bench.pipeline_records import record_key

    return list(record_key(record))


def load(path: Path, of: str) -> list[dict]:
    """The digest entries of the file at `path` ([] where there is none); a file that is not one is an error."""
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("of") != of \
            or not isinstance(doc.get("records"), list):
        raise ValueError(f"{path} is not the record digests of {of} (kind {KIND})")
    return doc["records"]


def problems(records: list[dict], entries: list[dict]) -> list[tuple[str, str]]:
    """(kind, line) per record that differs from its digest ("changed"), per listed record that is gone ("gone"), per
    record key found twice ("twice") and per record without a digest ("new"); [] where the records are what the
    digests say."""
    out: list[tuple[str, str]] = []
    by_key: dict[tuple, list[dict]] = {}
    for r in records:
        by_key.setdefault(tuple(key_of(r)), []).append(r)
    out += [("twice", f"record {list(k)} appears {len(rs)} times") for k, rs in by_key.items() if len(rs) > 1]
    listed = set()
    for e in entries:
        k = tuple(e["key"])
        listed.add(k)
        if k not in by_key:
            out.append(("gone", f"record {list(k)} is listed but no longer in the file"))
        elif digest(by_key[k][0]) != e["sha256"]:
            out.append(("changed", f"record {list(k)} changed after it was committed: restore it; a correction goes "
                                   "to the corrections file or a new row"))
    out += [("new", f"record {list(k)} has no digest: run python benchmarks/record_digests.py") for k in by_key
            if k not in listed]
    return out


def appended(records: list[dict], entries: list[dict]) -> list[dict]:
    """`entries` with a digest appended for every record not listed yet, in the file's order."""
    listed = {tuple(e["key"]) for e in entries}
    return entries + [{"key": key_of(r), "sha256": digest(r)} for r in records if tuple(key_of(r)) not in listed]


def write(path: Path, of: str, entries: list[dict]) -> None:
    """One entry a line, so that an appended run is a diff of added lines."""
    about = (f"sha256 of every record of {of} as committed (canonical JSON: sorted keys, no spaces), by record key; "
             "appended by benchmarks/record_digests.py, never rewritten; where a record was edited before its first "
             "commit, the corrections file says so")
    head = json.dumps({"kind": KIND, "of": of, "about": about}, indent=1)[:-2]
    lines = ",\n".join("  " + json.dumps(e) for e in entries)
    path.write_text(f"{head},\n \"records\": [\n{lines}\n ]\n}}\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only check; exit 1 on any problem")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--file", help="one records file (default: every pipeline-<card>.json in --results)")
    args = ap.parse_args(argv)
    files = [args.file] if args.file else record_files(args.results)
    if not files:
        print(f"no pipeline-<card>.json in {args.results}", file=sys.stderr)
        return 1
    status = 0
    for name in files:
        status = max(status, _one(args.results, name, args.check))
    return status


def _one(results: Path, name: str, check: bool) -> int:
    records = json.loads((results / name).read_text())["records"]
    path = digests_path(results, name)
    entries = load(path, name)
    found = problems(records, entries)
    refused = found if check else [p for p in found if p[0] != "new"]
    for _, line in refused:
        print(f"{name}: {line}", file=sys.stderr)
    if refused or check:
        return 1 if refused else 0
    new = appended(records, entries)
    write(path, name, new)
    print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {len(new) - len(entries)} appended, "
          f"{len(new)} in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
