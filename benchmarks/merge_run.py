"""A device run's pipe(...) rows into the committed records file of the card they ran on.

    python benchmarks/merge_run.py DIR [--results benchmarks/results]

DIR holds what the collect calls brought back (pipeline_h200.sh writes `pipeline-h200.json` and `pipeline-h200.log`
whatever the card; each run in it names its device). Every run the committed files do not hold yet goes to
`pipeline-<card>.json` of its own device (h200, h100, ...: harness.device_tag), its ratios filled against that file's
rows only (a compile of another card is no baseline), with the file's markdown and chart written again and DIR's log
(its detached.log where the run was detached) appended to `pipeline-<card>.log`. A run already committed is left as
it is: a committed row is what its run wrote. Then `python benchmarks/record_digests.py` appends the new rows'
digests.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COLLECTED = "pipeline-h200.json"  # the name pipeline_h200.sh gives its results on every card


def merge(collected: Path, results: Path) -> dict[str, int]:
    """card -> how many records were added to results/pipeline-<card>.json."""
    from h3plan.actions.bench import device_tag, pipeline_records as pr

    doc = pr.FILE.load_doc(str(collected / COLLECTED))
    by_run = {m["run"]: m for m in doc.get("runs", [])}
    added: dict[str, int] = {}
    targets: dict[str, dict] = {}
    for run_id, meta in by_run.items():
        rows = [dict(r) for r in doc["records"] if r["run"] == run_id]
        if not rows:
            continue
        card = device_tag(str(meta.get("device") or rows[0].get("device") or ""))
        if not card:
            raise SystemExit(f"merge_run: run {run_id} names no device: cannot tell which card's file it belongs to")
        path = results / f"pipeline-{card}.json"
        target = targets.setdefault(card, pr.FILE.load_doc(str(path)))
        if any(r["run"] == run_id for r in target["records"]):
            continue  # committed already
        pr.fill_speedups(rows, target["records"])
        target["records"] += rows
        target.setdefault("runs", []).append(meta)
        added[card] = added.get(card, 0) + len(rows)
    for card, target in targets.items():
        if not added.get(card):
            continue
        stem = results / f"pipeline-{card}"
        pr.write_doc(target, f"{stem}.json", f"{stem}.md")
        pr.write_chart(target["records"], f"{stem}.png")
        log = next((p for p in (collected / "detached.log", collected / "pipeline-h200.log") if p.exists()), None)
        if log is not None:
            with open(f"{stem}.log", "a") as f:
                f.write(log.read_text())
    return added


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("collected", type=Path)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if not (args.collected / COLLECTED).exists():
        print(f"merge_run: {args.collected / COLLECTED} not found", file=sys.stderr)
        return 1
    added = merge(args.collected, args.results)
    print("; ".join(f"pipeline-{c}.json: {n} records added" for c, n in added.items()) or "nothing new to merge")
    return 0


if __name__ == "__main__":
    sys.exit(main())
