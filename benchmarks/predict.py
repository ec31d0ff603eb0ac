"""The plan's time line against the H200's measured `pipe(...)` rows (issue 34): every one-GPU plan row of
benchmarks/results/pipeline-h200.json planned again, with the packaged sm90 facts and with each tuned file under
docs/tuned/hardware/, at the row's 49 forwards and at a 4-forward request (measured: 4 x the row's forward + its
rest of the call); and the plan's peak memory against the measured one for every row whose call took a prompt
through the text encoder (issue 32). CPU only; writes predict-h200.json / .md. tests/planner/test_predict.py asserts
the 5%.

    python benchmarks/predict.py [--out benchmarks/results]
"""

import argparse
import json
from pathlib import Path

import h3plan
from h3plan.actions.bench.pipeline_records import predicted_call, prompted, replan

ROOT = Path(__file__).resolve().parents[1]


def facts() -> list[tuple[str, dict]]:
    """(name, group choices) of the packaged sm90 and of every committed tuned file."""
    out = [("sm90 (packaged)", {"hardware": "sm90"})]
    for f in sorted((ROOT / "docs/tuned/hardware").glob("*.yaml")):
        out.append((f"{f.stem} (tuned)", {"hydra.searchpath": [f"file://{f.parent.parent}"], "hardware": f.stem}))
    return out


def rows() -> list[dict]:
    doc = json.loads((ROOT / "benchmarks/results/pipeline-h200.json").read_text())
    out = []
    for row in (r for r in doc["records"] if r["setting"] == "plan" and r["gpus"] == 1):
        for name, groups in facts():
            for steps in (None, 5) if row["steps_e2e"] > 4 else (None,):  # a 4-forward row is its own 4-step request
                try:
                    plan = replan(row, steps, **groups)
                except h3plan.H3PlanError as e:  # a 4-forward request of a 34-forward step cache: refused, said so
                    out.append({"run": row["run"], "label": row["label"], "facts": name, "forwards": 4, "error": str(e)})
                    continue
                n = plan.derived_value("computed_forwards") or plan.derived_value("sequence")["transformer_forwards"]
                measured = row["e2e_s"] if steps is None else n * row["forward_s"] + row["rest_s"]
                fwd, call = plan.derived_value("forward_s_est"), predicted_call(plan, row, steps)
                out.append({"run": row["run"], "label": row["label"], "facts": name, "forwards": 4 if steps else row["steps_e2e"],
                            "forward_s": row["forward_s"], "forward_s_est": fwd, "call_s": measured, "call_s_est": call,
                            "forward_err": fwd / row["forward_s"] - 1, "call_err": call / measured - 1})
    return out


def peaks() -> list[dict]:
    """The plan's peak against the measured one for every row whose call took a prompt through the text encoder (the
    encode's peak, with the conditioner on the device; a t2va row's bench peak is its install's: benchmarks/memory.py)."""
    doc = json.loads((ROOT / "benchmarks/results/pipeline-h200.json").read_text())
    out = []
    for row in (r for r in doc["records"] if r["setting"] == "plan" and r["gpus"] == 1 and prompted(r)):
        plan = replan(row, hardware="sm90")
        est = plan.derived_value("memory_peak_gib_per_gpu")
        out.append({"run": row["run"], "label": row["label"], "workflow": row["workflow"],
                    "text_encoder": row["request"]["memory.text_encoder"], "phase": plan.derived_value("memory_peak_phase"),
                    "peak_gib": row["peak_gib"], "peak_gib_est": est, "peak_err": est / row["peak_gib"] - 1})
    return out


def markdown(recs: list[dict], mem: list[dict] = ()) -> str:
    lines = ["# Predicted against measured: the plan's time line and the H200's pipe(...) rows", "",
             "Rows: benchmarks/results/pipeline-h200.json (one H200). 4 forwards: measured = 4 x the row's forward + its "
             "rest of the call. Made by `python benchmarks/predict.py`; the 5% is asserted by tests/planner/test_predict.py.", "",
             "| run | plan | facts | forwards | forward s (pred) | err | call s (pred) | err |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in recs:
        if "error" in r:
            lines.append(f"| {r['run']} | {r['label']} | {r['facts']} | {r['forwards']} | refused: {r['error']} | | | |")
            continue
        lines.append(f"| {r['run']} | {r['label']} | {r['facts']} | {r['forwards']} | {r['forward_s']:.3f} ({r['forward_s_est']:.3f}) | "
                     f"{r['forward_err']:+.1%} | {r['call_s']:.1f} ({r['call_s_est']:.1f}) | {r['call_err']:+.1%} |")
    if mem:
        lines += ["", "## Peak memory with the text encoder", "",
                  "Rows whose call took a prompt through the seeded Qwen3-VL conditioner: the bench's peak "
                  "(torch.cuda.max_memory_allocated over the row) against the plan's (memory_peak_gib_per_gpu).", "",
                  "| run | plan | workflow | text encoder | peak phase | peak GiB (pred) | err |", "|---|---|---|---|---|---:|---:|"]
        lines += [f"| {m['run']} | {m['label']} | {m['workflow']} | {m['text_encoder']} | {m['phase']} | "
                  f"{m['peak_gib']:.1f} ({m['peak_gib_est']:.1f}) | {m['peak_err']:+.1%} |" for m in mem]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results"))
    out = Path(ap.parse_args().out)
    recs, mem = rows(), peaks()
    (out / "predict-h200.json").write_text(json.dumps({"kind": "predict", "records": recs, "peaks": mem}, indent=1) + "\n")
    (out / "predict-h200.md").write_text(markdown(recs, mem))
    print(markdown(recs, mem))


if __name__ == "__main__":
    main()
