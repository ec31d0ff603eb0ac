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


def _recipe(plan: str) -> str:
    return plan.split("/")[1].split("+")[0]


def pipeline() -> list[str]:
    """pipeline-h200.json: diffusers' own pipe(...) per row of each run (the user's call; no autocast)."""
    rows = ["| run | workflow | setting | VAE | forward | rest of the call | E2E | vs eager | vs best (same VAE) "
            "| vs best (fp32 VAE) | frames |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in _load("pipeline-h200.json")["records"]:
        if r.get("error") or r["setting"] == "reference":
            continue
        f = r.get("frames") or {}
        frames = (f"bitwise vs {f['against'].split(' (')[0]}" if f.get("bitwise") else "" if not f else
                  f"PSNR {f['psnr_db']:.1f} dB vs eager {f['against'].rsplit('(', 1)[-1].split()[0]} VAE")
        if r["setting"] == "plan" and not r.get("lossless", True) and r["recipe"] == "bf16" and r["vae"] == "fp32":
            frames += " (withdrawn fp32 QK kernel, see notes)"
        if "+step_cache=" in r["label"]:
            frames = (f"{len(r['forwards_s'])} of {r['steps_e2e']} forwards computed; the whole call timed; quality: "
                      "docs/step_cache.md")
        x = lambda k: fmt(r[k], "{:.3f}x")  # noqa: E731 - a ratio cell, - where the run has no such row
        rows.append(f"| {r['run'][5:16]} | {r.get('workflow', 't2va')} | {r['label']} | {r['vae']} | {r['forward_s']:.3f} s "
                    f"| {r['rest_s']:.2f} s | {r['e2e_s']:.1f} s | {x('speedup_vs_eager')} | {x('speedup_vs_best')} "
                    f"| {x('speedup_vs_best_fp32')} | {frames} |")
    return rows


def blocks() -> list[str]:
    """block-h200.json: one real-width block, eager / diffusers' best / the plan."""
    rows = ["| plan | S | eager | diffusers' best | plan | vs eager | vs best |", "|---|---:|---:|---:|---:|---:|---:|"]
    recs = [r for r in _load("block-h200.json")["records"] if r["blocks"] == 1 and not r.get("error")]
    for r in sorted(recs, key=lambda r: (r["plan"], r["S"])):
        rows.append(f"| {r['plan']} | {r['S']:,} | {r['eager_ms']:.1f} ms | {r['best_ms']:.1f} ms | {r['plan_ms']:.1f} ms "
                    f"| {r['speedup']:.2f}x | {r['speedup_vs_best']:.2f}x |")
    return rows


def parallel() -> list[str]:
    """parallel-h200.json: two GPUs, each Ulysses plan against the same plan on one GPU and diffusers' CP."""
    rows = ["| S | plan | exchange | plan ms | same plan, 1 GPU | diffusers CP | vs diffusers CP | scaling | bitwise vs 1 GPU |",
            "|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for r in _load("parallel-h200.json")["records"]:
        same = "yes" if r["bitwise_vs_u1"] else f"no (rel {r['rel_vs_u1']:.1e})"
        rows.append(f"| {r['S']:,} | {r['plan'].split('+')[0]} | {r['exchange']} | {r['plan_ms']:.1f} | {r['plan_u1_ms']:.1f} "
                    f"| {r['diffusers_cp_ms']:.1f} | {r['speedup_vs_diffusers_cp']:.2f}x | {r['scaling_vs_u1']:.2f}x | {same} |")
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
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "README.md", "generated"))
            return 1
        return 0
    a.readme.write_text(new)
    print(f"{a.readme}: {len(MARK.findall(new))} tables written from {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
