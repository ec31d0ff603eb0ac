"""The plan's time line against the H200's measured `pipe(...)` rows: every one-GPU plan row of
benchmarks/results/pipeline-h200.json planned again, with the packaged sm90 facts and with each tuned file under
docs/tuned/hardware/, at the row's 49 forwards and at a 4-forward request (measured: 4 x the row's forward + its
rest of the call); and the plan's peak memory against the measured one for every row whose call took a prompt
through the text encoder: in sample, since sm90's facts were fitted to these rows or measured at their
shapes. Out of sample (predict-holdout-h200.json / .md, `holdout`): each row predicted by the packaged sm90 facts
- held out: only a row no packaged fact was fitted to (a fact's `provenance` names the row it came from) and no
  correction supersedes (pipeline-h200-corrections.json) is checked;
- other shapes: every measured point at the row's own shapes dropped first (attention at its tokens and heads, the
  GEMMs and elementwise kernels at its rows, the decode at its latent, the encode at its inputs).
Declared before the run (predict-declared-h200.json / .md): the plan's figures for rows not yet measured, written
once (`--declare`: new phases are added, a declared one is never rewritten) with the hash of the sm90 facts they came
from; every later run of a row of the same request and label is checked against them in the .md, from the declared
numbers alone (nothing planned again, so a fact changed after the row cannot move its prediction).
CPU only. tests/planner/test_predict.py asserts the in-sample 5%, tests/planner/test_predict_holdout.py the held-out,
tests/planner/test_predict_declared.py the declared file.

    python benchmarks/predict.py [--out benchmarks/results] [--declare]
"""

import argparse
import datetime
import functools
import hashlib
import json
from pathlib import Path

import yaml

import h3plan
from h3plan.actions.bench import roles
from h3plan.actions.bench.pipeline_records import (computed_median, corrections_of, each_forward, encode_shapes,
                                                   load_corrections, predicted_call, predicted_forward, prompted,
                                                   record_key, replan, skipped_saving, sparse_decision)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results/pipeline-h200.json"
KINDS = ("attention", "gemm_block", "elementwise", "decode", "encode")


def facts() -> list[tuple[str, dict]]:
    """(name, group choices) of the packaged sm90 and of every committed tuned file."""
    out = [("sm90 (packaged)", {"hardware": "sm90"})]
    for f in sorted((ROOT / "docs/tuned/hardware").glob("*.yaml")):
        out.append((f"{f.stem} (tuned)", {"hydra.searchpath": [f"file://{f.parent.parent}"], "hardware": f.stem}))
    return out


def rows() -> list[dict]:
    doc, fixes = json.loads((ROOT / RESULTS).read_text()), load_corrections(str(ROOT / RESULTS))
    out = []
    for row in (r for r in doc["records"] if r["setting"] == "plan" and r["gpus"] == 1):
        for name, groups in facts():
            mixed = False  # a row with sparse attention: a 4-forward request runs dense forwards it did not time alone
            for steps in (None, 5) if row["steps_e2e"] > 4 else (None,):  # a 4-forward row is its own 4-step request
                if steps and mixed:
                    continue
                try:
                    plan = replan(row, steps, fixes, **groups)
                    mixed = sparse_decision(plan) is not None
                except h3plan.H3PlanError as e:  # a 4-forward request of a 34-forward step cache: refused, said so
                    out.append({"run": row["run"], "label": row["label"], "facts": name, "forwards": 4,
                                "error": str(e)})
                    continue
                n = plan.derived_value("computed_forwards") or plan.derived_value("sequence")["transformer_forwards"]
                measured = row["e2e_s"] if steps is None else n * row["forward_s"] + row["rest_s"]
                fwd, call = predicted_forward(plan, row), predicted_call(plan, row, steps)
                out.append({"run": row["run"], "label": row["label"], "facts": name,
                            "forwards": 4 if steps else row["steps_e2e"],
                            "forward_s": row["forward_s"], "forward_s_est": fwd, "call_s": measured, "call_s_est": call,
                            "forward_err": fwd / row["forward_s"] - 1, "call_err": call / measured - 1})
    return out


def peaks() -> list[dict]:
    """The plan's peak against the measured one for every row whose call took a prompt through the text encoder (the
    encode's peak, with the conditioner on the device; a t2va row's bench peak is its install's:
    benchmarks/memory.py)."""
    doc, fixes = json.loads((ROOT / RESULTS).read_text()), load_corrections(str(ROOT / RESULTS))
    out = []
    for row in (r for r in doc["records"] if r["setting"] == "plan" and r["gpus"] == 1 and prompted(r)):
        plan = replan(row, fixes=fixes, hardware="sm90")
        est = plan.derived_value("memory_peak_gib_per_gpu")
        out.append({"run": row["run"], "label": row["label"], "workflow": row["workflow"],
                    "text_encoder": row["request"]["memory.text_encoder"],
                    "phase": plan.derived_value("memory_peak_phase"),
                    "peak_gib": row["peak_gib"], "peak_gib_est": est, "peak_err": est / row["peak_gib"] - 1})
    return out


def markdown(recs: list[dict], mem: list[dict] = ()) -> str:
    lines = ["# Predicted against measured: the plan's time line and the H200's pipe(...) rows", "",
             "Rows: benchmarks/results/pipeline-h200.json (one H200). 4 forwards: measured = 4 x the row's forward + "
             "its rest of the call. Made by `python benchmarks/predict.py`; the 5% is asserted by "
             "tests/planner/test_predict.py.", "",
             "| run | plan | facts | forwards | forward s (pred) | err | call s (pred) | err |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in recs:
        if "error" in r:
            lines.append(f"| {r['run']} | {r['label']} | {r['facts']} | {r['forwards']} | refused: {r['error']} "
                         f"| | | |")
            continue
        lines.append(f"| {r['run']} | {r['label']} | {r['facts']} | {r['forwards']} | {r['forward_s']:.3f} "
                     f"({r['forward_s_est']:.3f}) | {r['forward_err']:+.1%} | {r['call_s']:.1f} "
                     f"({r['call_s_est']:.1f}) | {r['call_err']:+.1%} |")
    if mem:
        lines += ["", "## Peak memory with the text encoder", "",
                  "Rows whose call took a prompt through the seeded Qwen3-VL conditioner: the bench's peak "
                  "(torch.cuda.max_memory_allocated over the row) against the plan's (memory_peak_gib_per_gpu).", "",
                  "| run | plan | workflow | text encoder | peak phase | peak GiB (pred) | err |",
                  "|---|---|---|---|---|---:|---:|"]
        lines += [f"| {m['run']} | {m['label']} | {m['workflow']} | {m['text_encoder']} | {m['phase']} | "
                  f"{m['peak_gib']:.1f} ({m['peak_gib_est']:.1f}) | {m['peak_err']:+.1%} |" for m in mem]
    return "\n".join(lines) + "\n"


def fitted_to(row: dict, measured: dict) -> list[str]:
    """The packaged facts whose provenance names `row` of the pipeline results ("decode[0]: rest_s")."""
    out = []
    for kind in KINDS + (roles.DECODE_PRECISION, "stock_frames"):  # measured.<lever>: its evidence
        for i, p in enumerate(measured.get(kind) or ()):
            for prov in p.get("provenance") or ():
                if prov["file"] == RESULTS and not prov.get("commit") and record_key(prov["row"]) == record_key(row):
                    out.append(f"{kind}[{i}]: {prov.get('value', '')}")
    return out


def same_shape(kind: str, p: dict, shape: dict) -> bool:
    """A measured point at one of the row's own shapes."""
    if kind == "attention":
        return p["seq_len"] == shape["seq_len"] and p["heads"] == shape["heads"]
    if kind in ("gemm_block", "elementwise"):
        return p["rows"] == shape["rows"]
    if kind == "decode":
        return list(p["latent"][2:]) == shape["latent"]
    return list(p["input"]) in shape["encodes"]  # encode


def shape_of(plan) -> dict:
    seq, d = plan.derived_value("sequence"), plan.to_dict()["derived"]
    return {"seq_len": d["seq_len"], "heads": d["heads_per_rank"], "rows": d["batch"] * d["local_rows"],
            "latent": [seq["latent_frames"], seq["latent_height"], seq["latent_width"]],
            "encodes": encode_shapes(plan)}


def predicted(row: dict, plan) -> dict:
    fwd, call = predicted_forward(plan, row), predicted_call(plan, row)
    out = {"forward_s_est": fwd, "forward_err": None if fwd is None else fwd / row["forward_s"] - 1,
           "call_s_est": call, "call_err": None if call is None else call / row["e2e_s"] - 1}
    if call is None:
        basis = plan.to_dict()["derived"]["basis"]
        out["call_note"] = next((basis[k] for k in ("decode_s_est", "encode_s_est")
                                 if k in basis and str(basis[k]).startswith("no ")), "no call estimate")
    return out


def evaluate(row: dict, measured: dict, fixes=()) -> dict:
    plan = replan(row, fixes=fixes, hardware="sm90")
    shape = shape_of(plan)
    rec = {"run": row["run"], "workflow": row.get("workflow", "t2va"), "label": row["label"], "vae": row["vae"],
           "S": shape["seq_len"], "forward_s": row["forward_s"], "call_s": row["e2e_s"],
           "fitted": fitted_to(row, measured)}
    sup = next((c["superseded_by"] for c in corrections_of(row, fixes) if c.get("superseded_by")), None)
    if sup:
        rec["superseded_by"] = sup["run"]
    rec["held_out"] = None if rec["fitted"] or sup else predicted(row, plan)
    kept = {f"hardware.measured.{k}": [p for p in measured.get(k) or () if not same_shape(k, p, shape)] for k in KINDS}
    dropped = [f"{k}: {len(measured.get(k) or ()) - len(kept[f'hardware.measured.{k}'])}" for k in KINDS
               if len(measured.get(k) or ()) != len(kept[f"hardware.measured.{k}"])]
    try:
        rec["other_shapes"] = {"dropped": dropped, **predicted(row, replan(row, fixes=fixes, hardware="sm90", **kept))}
    except h3plan.H3PlanError as e:
        rec["other_shapes"] = {"dropped": dropped, "error": str(e)}
    return rec


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


def holdout_markdown(doc: dict) -> str:
    lines = ["# Predictions out of sample: sm90's facts against the H200's pipe(...) rows", "",
             "Every one-GPU plan row of `pipeline-h200.json`, planned again (pipeline_records.replan) with the "
             "packaged `conf/hardware/sm90.yaml`. **Held out**: rows no packaged fact was fitted to (a fact's "
             "`provenance` names the row it came from; a row that names one, or that a correction supersedes, is not "
             "checked). **Other shapes**: every measured point at the row's own shapes dropped first (attention at its "
             "tokens and heads, GEMMs and elementwise kernels at its rows, the decode at its latent, the encode at its "
             "inputs). Errors: predicted / measured - 1; "
             f"the target is {doc['tolerance']:.0%}. Made by `python benchmarks/predict.py`; "
             "tests/planner/test_predict_holdout.py checks it.", "",
             "| run | workflow | plan | S | fitted to it (in sample) | held out: forward | call "
             "| other shapes: forward | call | dropped |", "|---|---|---|---:|---|---:|---:|---:|---:|---|"]
    for r in doc["records"]:
        h, o = r["held_out"] or {}, r["other_shapes"]
        skip = f"superseded by {r['superseded_by']}" if r.get("superseded_by") else "in sample"
        call_o = o.get("error") or (_pct(o.get("call_err")) if o.get("call_err") is not None
                                    else f"- ({o.get('call_note', '')})")
        lines.append(f"| {r['run']} | {r['workflow']} | {r['label']} | {r['S']:,} | {'; '.join(r['fitted']) or '-'} "
                     f"| {_pct(h.get('forward_err')) if h else skip} | {_pct(h.get('call_err')) if h else skip} "
                     f"| {_pct(o.get('forward_err'))} | {call_o} | {', '.join(o['dropped']) or '-'} |")
    out = [r for r in doc["records"] if r["held_out"]]
    miss = [r for r in out if any(abs(r["held_out"][k] or 0) > doc["tolerance"] for k in ("forward_err", "call_err"))]
    other = [r for r in doc["records"] if abs(r["other_shapes"].get("forward_err") or 0) > doc["tolerance"]]
    lines += ["", f"Held out: {len(out)} rows, {len(miss)} beyond {doc['tolerance']:.0%}. Other shapes: "
              f"{len(other)} of {len(doc['records'])} forwards beyond {doc['tolerance']:.0%}."]
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=1)
def sm90_facts() -> dict:
    """conf/hardware/sm90.yaml, read once."""
    return yaml.safe_load((ROOT / "conf/hardware/sm90.yaml").read_text())


def on_facts_device(row: dict) -> bool:
    """A row run on a GPU the sm90 facts were measured on (their `products`: H200): an H100's row is another card's
    speed (less bandwidth and memory), never a check of these facts."""
    return any(p in row.get("device", "") for p in sm90_facts()["products"])


def holdout() -> dict:
    measured = sm90_facts()["measured"]
    fixes = load_corrections(str(ROOT / RESULTS))
    plans = [r for r in json.loads((ROOT / RESULTS).read_text())["records"]
             if r["setting"] == "plan" and r["gpus"] == 1 and on_facts_device(r)]
    return {"kind": "predict-holdout", "facts": "conf/hardware/sm90.yaml", "results": RESULTS, "tolerance": 0.05,
            "records": [evaluate(r, measured, fixes) for r in plans]}


# The phases of benchmarks/pipeline_h200.sh whose rows are not measured yet, as the plan overrides each one runs
# (hardware=sm90 parallel=u1 besides): their figures are declared before the run (--declare).
_FL2VA = {"video": "t2v_768x1344_5s", "video.task": "fl2va", "video.keyframes": ["first", "last"],
          "video.text_tokens": 2026}
_FIXED = f"levers.{roles.STEP_CACHE}"
_CACHE = {"psnr_db_min": 28, "ssim_min": 0.93, "computed": 34, "unmeasured": True}
PENDING = {
    "whole-tier": {"tier": "quality"},
    "whole-tier-fixed": {"tier": "quality", "recipe.cache": {"policy": None, **_CACHE}, _FIXED: "fixed"},
    "whole-tier-fl2va": {"tier": "quality", **_FL2VA, "memory.text_encoder": "resident"},
    "whole-tier-ref2va": {"tier": "quality", "video": "ref2va_768x1344_5s", "memory.text_encoder": "resident"},
    "whole-tier-10s": {"tier": "quality", "video": "t2v_768x1344_10s"},
    "turbo-fp16": {"recipe": "bf16", "recipe.vae": "fp16", "video": "fl2va_turbo_768x1344",
                   "memory.text_encoder": "offload_after"},
    "whole-cache-fp8": {"recipe": "fp8", "recipe.vae": "fp16", "recipe.cache": _CACHE, _FIXED: "fixed"},
    "whole-cache-bf16": {"recipe": "bf16", "recipe.vae": "fp16", "recipe.cache": _CACHE, _FIXED: "fixed"},
    "whole-lossless": {"recipe": "bf16"},
}
DECLARED = "benchmarks/results/predict-declared-h200.json"


def facts_sha256() -> str:
    return hashlib.sha256((ROOT / "conf/hardware/sm90.yaml").read_bytes()).hexdigest()


def declaration(phase: str, over: dict) -> dict:
    """The plan's figures for one pending phase: its row key (workflow, video, label: what the bench will write),
    its tokens, each forward's planned time, the call and its text encode."""
    from h3plan.actions.bench.pipeline_settings import row_label

    plan = h3plan.resolve_config(hardware="sm90", parallel="u1", **over)
    seq, video = plan.derived_value("sequence"), plan.get("video")
    n = seq["transformer_forwards"]
    sparse = sparse_decision(plan)
    return {"phase": phase, "overrides": over, "workflow": video["task"],
            "video": f"{video['height']}x{video['width']}x{video['frames']}", "label": row_label(plan),
            "S": seq["seq_len"], "forwards": n, "layers": plan.get("model")["diffusers_config"]["num_layers"],
            "cache_setting": plan.decision(roles.STEP_CACHE).setting,
            "computed_forwards": plan.derived_value("computed_forwards") or n,
            "forward_s_est": plan.derived_value("forward_s_est"),
            "forward_sparse_s_est": plan.derived_value("forward_sparse_s_est"),
            "dense_forwards": None if sparse is None else sparse.param("dense_forwards"),
            "call_s_est": plan.derived_value("call_s_est"),
            "text_encode_s_est": plan.derived_value("text_encode_s_est") or 0.0}


def check_declared(d: dict, row: dict) -> dict:
    """A measured row against its declaration, from the declared numbers alone: the forward is the median of the
    declared times of the forwards the row computed; the call is the declared call, less the text encode where the
    call took prompt_embeds, less (for a first_block cache, whose plan counts every forward computed) each skipped
    forward's time but its first block. A row that failed (its error, no call): the run and the error, no figure."""
    if row.get("error"):
        return {"run": row["run"], "S": row["S"], "error": row["error"]}
    per = each_forward(d["forward_s_est"], d["forward_sparse_s_est"], d["dense_forwards"], d["forwards"])
    fwd_est = computed_median(per, row)
    call = d["call_s_est"] - (0.0 if prompted(row) else d["text_encode_s_est"])
    if d["cache_setting"] == "first_block":
        call -= skipped_saving(per, row, d["layers"]) or 0.0
    return {"run": row["run"], "S": row["S"], "forward_s": row["forward_s"], "forward_s_est": fwd_est,
            "forward_err": fwd_est / row["forward_s"] - 1,
            "call_s": row["e2e_s"], "call_s_est": call, "call_err": call / row["e2e_s"] - 1}


def declared_rows(d: dict, records: list[dict]) -> list[dict]:
    """The one-GPU whole-call plan rows of d's request and label run after it was declared, on the facts' GPU."""
    return [r for r in records if r["setting"] == "plan" and r["gpus"] == 1 and r["run"] > d["declared"]
            and on_facts_device(r)
            and r.get("whole_call") and r.get("workflow", "t2va") == d["workflow"] and r["video"] == d["video"]
            and r["label"] == d["label"]]


def declare(path: Path) -> dict:
    """Adds a declaration for every pending phase not declared yet; a declared phase is kept as written."""
    doc = json.loads(path.read_text()) if path.exists() else {
        "kind": "predict-declared", "facts": "conf/hardware/sm90.yaml", "tolerance": 0.05, "declarations": []}
    have = {d["phase"] for d in doc["declarations"]}
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    for phase, over in PENDING.items():
        if phase not in have:
            doc["declarations"].append({"declared": now, "facts_sha256": facts_sha256(), **declaration(phase, over)})
    return doc


def declared_markdown(doc: dict, records: list[dict]) -> str:
    tol = doc["tolerance"]
    lines = ["# Declared before the run: the plan's figures for H200 rows not yet measured", "",
             "Each row's figures were written (`python benchmarks/predict.py --declare`) before any run of its phase "
             "(`benchmarks/pipeline_h200.sh`), from the packaged `conf/hardware/sm90.yaml` of the hash it names; a "
             "later `pipe(...)` row of the same request and label is checked against them here, from the declared "
             "numbers alone. Errors: declared / measured - 1; the target is "
             f"{tol:.0%}. tests/planner/test_predict_declared.py checks this file.", "",
             "| phase | declared | workflow | plan | S | forwards (dense) | forward s | sparse forward s | call s "
             "| measured runs |", "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    checked = []
    for d in doc["declarations"]:
        got = [check_declared(d, r) for r in declared_rows(d, records)]
        checked += got
        runs = "; ".join(f"{g['run']}: failed ({g['error'][:100]})" if "error" in g
                         else f"{g['run']}: forward {_pct(g['forward_err'])}, call {_pct(g['call_err'])}" for g in got)
        fs = d["forward_sparse_s_est"]
        lines.append(f"| {d['phase']} | {d['declared']} | {d['workflow']} | {d['label']} | {d['S']:,} "
                     f"| {d['computed_forwards']}" + (f" ({d['dense_forwards']})" if d["dense_forwards"] else "")
                     + f" | {d['forward_s_est']:.3f} | {'-' if fs is None else f'{fs:.3f}'} | {d['call_s_est']:.1f} "
                     f"| {runs or 'not run yet'} |")
    failed = [g for g in checked if "error" in g]
    miss = [g for g in checked if "error" not in g and any(abs(g[k] or 0) > tol for k in ("forward_err", "call_err"))]
    lines += ["", f"Checked: {len(checked) - len(failed)} runs, {len(miss)} beyond {tol:.0%}"
              + (f"; {len(failed)} failed before their call (no figure to check)." if failed else ".")]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results"))
    ap.add_argument("--declare", action="store_true", help="declare the pending phases' figures (never rewrites one)")
    args = ap.parse_args()
    out = Path(args.out)
    declared = ROOT / DECLARED
    if args.declare:
        doc = declare(declared)
        declared.write_text(json.dumps(doc, indent=1) + "\n")
    if declared.exists():
        doc = json.loads(declared.read_text())
        records = json.loads((ROOT / RESULTS).read_text())["records"]
        (out / "predict-declared-h200.md").write_text(declared_markdown(doc, records))
    recs, mem = rows(), peaks()
    doc = {"kind": "predict", "records": recs, "peaks": mem}
    (out / "predict-h200.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "predict-h200.md").write_text(markdown(recs, mem))
    doc = holdout()
    (out / "predict-holdout-h200.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "predict-holdout-h200.md").write_text(holdout_markdown(doc))
    print(markdown(recs, mem) + "\n" + holdout_markdown(doc))


if __name__ == "__main__":
    main()
