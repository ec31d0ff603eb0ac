"""PNG chart of block benchmark records (h3plan.actions.bench), and a CLI to redraw it from the JSON.

    python benchmarks/plot.py benchmarks/results/block-h200.json [out.png] [--md]

Three panels: block-stack forward time per (S, blocks) for diffusers eager, diffusers' best (regional
compile; where the records have it) and each plan; the speedup over eager with the 1.25x (lossless) and
1.5x (FP8) targets; attention alone per S (diffusers' default dispatch and each plan's backend). matplotlib is imported
inside `write_chart` only (the Agg canvas, no pyplot state), so the bench action runs without it and says so. `--md`
also rewrites the markdown table beside the JSON from the same records.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

NAN = float("nan")
TARGET_LOSSLESS, TARGET_FP8 = 1.25, 1.5  # h3plan.actions.bench TARGET_*_SPEEDUP


def _ok(records):
    return [r for r in records if not r.get("error") and r.get("plan_ms") is not None]


def write_chart(records, path: str) -> str | None:
    """Draw `records` (bench record dicts) to `path`; None when written, else why not."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return "matplotlib is not installed: PNG skipped (pip install matplotlib; python benchmarks/plot.py <json>)"
    recs = _ok(records)
    if not recs:
        return "no successful records: PNG skipped"
    configs = sorted({(r["S"], r["blocks"]) for r in recs})
    plans = sorted({r["plan"] for r in recs})
    by = {(r["plan"], r["S"], r["blocks"]): r for r in recs}
    fig = Figure(figsize=(16, 4.8))
    FigureCanvasAgg(fig)
    ax_t, ax_s, ax_a = fig.subplots(1, 3)
    xs = list(range(len(configs)))

    def bars(ax, series, slots):
        w = 0.8 / slots
        for i, (label, values, color) in enumerate(series):
            ax.bar([x - 0.4 + w * (i + 0.5) for x in xs[: len(values)]], values, w, label=label, color=color)

    eager = [statistics.median([r["eager_ms"] for r in recs if (r["S"], r["blocks"]) == c
                                and r.get("eager_ms")] or [NAN])
             for c in configs]
    color = {p: f"C{i}" for i, p in enumerate(plans)}  # one colour per plan in every panel
    plan_ms = [(p, [by[(p, *c)]["plan_ms"] if (p, *c) in by else NAN for c in configs], color[p]) for p in plans]
    best = [statistics.median([r["best_ms"] for r in recs if (r["S"], r["blocks"]) == c and r.get("best_ms")] or [NAN])
            for c in configs]
    peers = [("diffusers eager", eager, "0.6")] + ([("diffusers best (regional compile)", best, "0.35")]
                                                   if any(b == b for b in best) else [])  # NaN != NaN: none measured
    bars(ax_t, peers + plan_ms, len(plans) + len(peers))
    speed = [(p, [by[(p, *c)].get("speedup") or NAN if (p, *c) in by else NAN for c in configs], color[p])
             for p in plans]
    bars(ax_s, speed, len(plans))
    for container in ax_s.containers:
        ax_s.bar_label(container, fmt="%.2fx", fontsize=7)
    labels = [f"S={s}\n{b} block{'s' if b > 1 else ''}" for s, b in configs]
    for ax, title in ((ax_t, "block stack forward, ms (lower is better)"), (ax_s, "speedup over diffusers eager")):
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_title(title, fontsize=10)
    ax_s.axhline(1.0, color="0.3", lw=0.8)
    ax_s.axhline(TARGET_LOSSLESS, color="tab:green", ls="--", lw=1, label=f"lossless target {TARGET_LOSSLESS}x")
    ax_s.axhline(TARGET_FP8, color="tab:red", ls="--", lw=1, label=f"FP8 target {TARGET_FP8}x")
    for ax in (ax_t, ax_s):
        ax.legend(fontsize=7)

    seqs = sorted({r["S"] for r in recs})
    attn = {("diffusers default", "0.6"): {}}
    for r in recs:
        if r.get("attention_default_ms"):
            attn[("diffusers default", "0.6")].setdefault(r["S"], r["attention_default_ms"])
        if r.get("attention_ms"):
            key = (f"{r['attention_backend']} ({r['plan']})", color[r["plan"]])
            attn.setdefault(key, {}).setdefault(r["S"], r["attention_ms"])
    w = 0.8 / len(attn)
    for i, ((name, c), vals) in enumerate(attn.items()):
        ax_a.bar([x - 0.4 + w * (i + 0.5) for x in range(len(seqs))], [vals.get(s, NAN) for s in seqs], w, label=name,
                 color=c)
    ax_a.set_xticks(list(range(len(seqs))))
    ax_a.set_xticklabels([f"S={s}" for s in seqs], fontsize=8)
    ax_a.set_title("attention alone at the per-rank shape, ms", fontsize=10)
    ax_a.legend(fontsize=7)
    devices = ", ".join(sorted({r.get("device", "?") for r in recs}))
    title = f"MiniMax-H3 block: diffusers eager vs h3plan ({devices})"
    if any(r.get("timing") != "cuda-events" for r in recs):
        title += " -- HOST-CLOCK (CPU) TIMES: MEANINGLESS, PLUMBING ONLY"
    fig.suptitle(title, fontsize=11, color="tab:red" if "HOST" in title else "black")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return None


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    md = "--md" in args
    args = [a for a in args if a != "--md"]
    if not args or len(args) > 2:
        print("usage: python benchmarks/plot.py RESULTS.json [OUT.png] [--md]", file=sys.stderr)
        return 2
    src = args[0]
    out = args[1] if len(args) > 1 else os.path.splitext(src)[0] + ".png"
    try:
        with open(src) as f:
            doc = json.load(f)
        records = doc["records"] if isinstance(doc, dict) else doc
    except (OSError, ValueError, KeyError) as exc:
        print(f"plot: cannot read records from {src}: {exc}", file=sys.stderr)
        return 2
    why = write_chart(records, out)
    if why:
        print(f"plot: {why}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    if md:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's h3plan
        from h3plan.actions.bench import render_markdown

        md_path = os.path.splitext(src)[0] + ".md"
        with open(md_path, "w") as f:
            f.write(render_markdown(doc if isinstance(doc, dict) else {"records": records}))
        print(f"wrote {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
