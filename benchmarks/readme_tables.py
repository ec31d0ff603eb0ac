"""The README's measured tables, written from the committed results JSON (no GPU, no torch).

    python benchmarks/readme_tables.py            # rewrite every generated table in README.md
    python benchmarks/readme_tables.py --check    # exit 1 (and show the diff) when README.md differs

A generated table sits between `<!-- generated: NAME (...) -->` and `<!-- /generated -->`; NAME picks the
function below and the results file it reads. After a bench rewrites benchmarks/results/*.json, run this and
commit README.md with the results; tests/docs/test_results_drift.py fails until they agree.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path

from h3plan.actions.bench.tables import fmt

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MARK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) .*?-->\n)(?P<body>.*?)(<!-- /generated -->)", re.S)


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _short_run(run: str) -> str:
    return run[5:16]


def _timed(r: dict) -> str:
    from h3plan.actions.bench.pipeline_records import whole_call

    if whole_call(r):
        return "whole call"
    return f"{len(r['forwards_s'])} of {r.get('forwards_per_call')} fwd x {r['steps_e2e']} + rest"


def _who(against: str) -> str:
    """The reference a frames comparison names, short: eager or compile (diffusers'), else its label."""
    return "eager" if "eager" in against else "compile" if "compile" in against else against.split(" (")[0]


def pipeline() -> list[str]:
    """pipeline-h200.json: diffusers' own pipe(...) per row of each run (the user's call; no autocast), led by the ratio
    against diffusers' regional compile at the row's own VAE precision (its run's, else the latest run of the same
    request that has one, named), then the frames against the lossless plan; the corrections file's entries below."""
    from h3plan.actions.bench import pipeline_records as pr, roles

    doc = _load("pipeline-h200.json")
    fixes = pr.load_corrections(str(RESULTS / "pipeline-h200.json"))
    rows = ["| run | workflow | setting | VAE | E2E | vs diffusers' compile, same VAE | frames vs the lossless plan "
            "| timed as | checks | forward | rest of the call | vs eager | vs compile, fp32 VAE | frames |",
            "|---|---|---|---|---:|---:|---|---|---|---:|---:|---:|---:|---|"]
    for r in doc["records"]:
        if r.get("error") or r["setting"] == "reference":
            continue
        f = r.get("frames") or {}
        frames = (f"bitwise vs {f['against'].split(' (')[0]}" if f.get("bitwise") else "" if not f else
                  f"PSNR {f['psnr_db']:.1f} dB vs {_who(f['against'])} "
                  f"{f['against'].rsplit('(', 1)[-1].split()[0]} VAE")
        if r.get("call_computed"):
            computed = f"{sum(map(bool, r['call_computed']))} of {r['steps_e2e']} forwards computed"
            frames = "; ".join(x for x in (computed, frames) if x)
        elif f"+{roles.STEP_CACHE}=" in r["label"]:
            frames = f"{len(r['forwards_s'])} of {r['steps_e2e']} forwards computed; quality: docs/step_cache.md"
        best = pr.same_precision_best(r, doc["records"])
        same = "-" if best is None else f"{best['e2e_s'] / r['e2e_s']:.3f}x" + (
            "" if best["run"] == r["run"] else f" (compile of {_short_run(best['run'])})")
        ll = r.get("frames_vs_lossless") or {}
        lossless = "" if r["setting"] != "plan" or r.get("lossless") else (
            "not measured" if not ll else pr.frames_text(ll).replace(" vs ", " vs ", 1))
        x = lambda k: fmt(r[k], "{:.3f}x")  # noqa: E731 - a ratio cell, - where the run has no such row
        rows.append(f"| {_short_run(r['run'])} | {r.get('workflow', 't2va')} | {r['label']} | {r['vae']} "
                    f"| {r['e2e_s']:.1f} s "
                    f"| {same} | {lossless} | {_timed(r)} | {pr.checks_text(r, fixes)} | {r['forward_s']:.3f} s "
                    f"| {r['rest_s']:.2f} s | {x('speedup_vs_eager')} | {x('speedup_vs_best_fp32')} | {frames} |")
    rows.append("")
    for c in fixes:
        row = c["row"]
        rows.append(f"- correction, {_short_run(row['run'])} {row.get('workflow', 't2va')} {row['label']} "
                    f"({row['vae']} VAE): "
                    + pr.correction_text(c).removeprefix("**correction** (corrections file): "))
    return rows


def blocks() -> list[str]:
    """block-h200.json: one real-width block, eager / diffusers' best / the plan."""
    rows = ["| plan | S | eager | diffusers' best | plan | vs eager | vs best |", "|---|---:|---:|---:|---:|---:|---:|"]
    recs = [r for r in _load("block-h200.json")["records"] if r["blocks"] == 1 and not r.get("error")]
    for r in sorted(recs, key=lambda r: (r["plan"], r["S"])):
        rows.append(f"| {r['plan']} | {r['S']:,} | {r['eager_ms']:.1f} ms | {r['best_ms']:.1f} ms | {r['plan_ms']:.1f} "
                    f"ms | {r['speedup']:.2f}x | {r['speedup_vs_best']:.2f}x |")
    return rows


def parallel() -> list[str]:
    """parallel-h200.json: two GPUs, each Ulysses plan against the same plan on one GPU and diffusers' CP."""
    rows = ["| S | plan | exchange | plan ms | same plan, 1 GPU | diffusers CP | vs diffusers CP | scaling | bitwise "
            "vs 1 GPU |",
            "|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for r in _load("parallel-h200.json")["records"]:
        same = "yes" if r["bitwise_vs_u1"] else f"no (rel {r['rel_vs_u1']:.1e})"
        rows.append(f"| {r['S']:,} | {r['plan'].split('+')[0]} | {r['exchange']} | {r['plan_ms']:.1f} | "
                    f"{r['plan_u1_ms']:.1f} | {r['diffusers_cp_ms']:.1f} | {r['speedup_vs_diffusers_cp']:.2f}x | "
                    f"{r['scaling_vs_u1']:.2f}x | {same} |")
    return rows


def compile_runs() -> list[str]:
    """parallel-h200.json `compile`: regional compile over the installed degree-1 plans (the last run)."""
    rows = ["| recipe | S | plan ms | compiled ms | plain / compiled | bitwise |", "|---|---:|---:|---:|---:|---|"]
    for c in _load("parallel-h200.json")["compile"]:
        rows.append(f"| {c['recipe']} | {c['S']:,} | {c['plan_ms']:.1f} | {c['compiled_ms']:.1f} | {c['speedup']:.3f}x "
                    f"| {'yes' if c['bitwise'] else 'no'} |")
    return rows


TABLES = {"pipeline": pipeline, "blocks": blocks, "parallel": parallel, "compile": compile_runs}


def render(text: str) -> str:
    """`text` with every generated table rewritten from the results; an unknown NAME raises KeyError."""
    return MARK.sub(lambda m: m.group(1) + "\n".join(TABLES[m.group("name")]()) + "\n" + m.group(4), text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when README.md differs from the results")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    a = ap.parse_args(argv)
    old = a.readme.read_text()
    new = render(old)
    if a.check:
        if new != old:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                       "README.md", "generated"))
            return 1
        return 0
    a.readme.write_text(new)
    print(f"{a.readme}: {len(MARK.findall(new))} tables written from {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
