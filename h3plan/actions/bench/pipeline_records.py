"""Pipeline benchmark records: the schema, the results file (JSON), the markdown and the chart.

Pure Python (no torch; matplotlib only for the PNG, loaded lazily). A results file is
{"schema_version": 2, "kind": "pipeline-call", "runs": [...], "records": [...]}: one record per row of one run
(a setting - diffusers eager, diffusers' best, an h3plan plan, the bitwise reference - at one VAE precision),
keyed by (run, setting, label, vae); a new run appends its rows. Times are seconds.

A record is what its run wrote. What was learned about a row afterwards (a check it failed that its record does not
show, a field edited after the run, the row that supersedes it) lives beside the file, in <stem>-corrections.json
({"kind": "pipeline-call-corrections", "corrections": [{"row": its key fields, "what", "checks", "superseded_by"}]}),
and the markdown and the README tables show each correction at its row.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from h3plan.facts.vae.encode import encode_inputs
from h3plan.facts.workflows import DEFAULT_TASK
from h3plan.levers import MEMORY_SPECS, terms
from h3plan.planner import resolve_config
from h3plan.planning.config import compose
from omegaconf import OmegaConf

from .results_file import ResultsFile
from .roles import BACKEND, DECODE_PRECISION, STEP_CACHE, counter
from .tables import cell, fmt, md_table, one_line, text_table

SCHEMA_VERSION = 2
KIND = "pipeline-call"
REQUIRED_KEYS = ("run", "video", "S", "gpus", "setting", "label", "vae", "forward_s", "rest_s", "wall_s", "e2e_s",
                 "steps_e2e", "speedup_vs_eager", "speedup_vs_best", "speedup_vs_best_fp32", "frames")
SETTINGS = ("eager", "best", "plan", "reference")


@dataclass
class CallRecord:
    """One row: one setting's call `pipe(prompt_embeds=..., height=, width=, num_frames=, num_inference_steps=,
    output_type="pt", output="videos")`, as diffusers documents it (no autocast; the VAE in `vae`).

    forward_s: median of the timed transformer forwards (CUDA events around each forward; the first `warmup`
    forwards of the call are dropped: compile, JIT); wall_s: the whole call by wall clock (synchronised);
    rest_s: wall_s minus every forward (layout, noise, scheduler updates, the video and audio decode, the
    postprocess); e2e_s = steps_e2e x forward_s + rest_s, one generation at the pipeline's default
    num_inference_steps. speedup_vs_eager / _vs_best: e2e of diffusers eager / best with the same VAE precision
    over this row's; speedup_vs_best_fp32: against diffusers' best with diffusers' default fp32 VAE.
    frames: {"against": row, "bitwise": bool | None, "psnr_db", "ssim", "max_abs"}: against diffusers eager
    with the same VAE precision; for a plan with a reference row, bitwise against that reference.
    """

    run: str
    video: str
    S: int
    gpus: int
    setting: str
    label: str
    vae: str
    forward_s: float | None
    rest_s: float | None
    wall_s: float | None
    e2e_s: float | None
    steps_e2e: int
    speedup_vs_eager: float | None = None
    speedup_vs_best: float | None = None
    speedup_vs_best_fp32: float | None = None
    frames: dict = field(default_factory=dict)
    forwards_s: list = field(default_factory=list)
    first_forward_s: float | None = None
    peak_gib: float | None = None
    counters: dict = field(default_factory=dict)
    device: str = ""
    timing: str = "cuda-events"
    layers: int | None = None
    num_inference_steps: int | None = None
    forwards_per_call: int | None = None
    warmup_forwards: int | None = None
    recipe: str = ""
    lossless: bool | None = None
    config: str = ""
    notes: list = field(default_factory=list)
    error: str | None = None
    workflow: str = DEFAULT_TASK
    """The request's workflow (t2va, fl2va: first and last keyframe, ref2va: one image reference); the call
    includes its encodes (in rest_s) and S its conditioning rows."""
    request: dict = field(default_factory=dict)
    """A plan row's request as overrides (request_overrides): what replan composes again."""
    recipe_overrides: dict = field(default_factory=dict)
    """A plan row's recipe fields set beyond its preset and tier (recipe_overrides: recipe.vae, recipe.cache, ...),
    which its label does not name: what replan composes again."""
    rest_parts: dict = field(default_factory=dict)
    """Seconds of the rest's timed parts per call (median): text_encoder (with its moves), vae_encode, vae_decode."""
    checks: list = field(default_factory=list)
    """Every check the bench declared for this row, each PASS or FAIL with its rule and numbers (pipeline_checks)."""
    whole_call: bool = False
    """e2e_s is one whole call of steps_e2e forwards timed end to end (a step-cache row, bench.pipeline.whole); False:
    steps_e2e x the median timed forward + the rest of a short call of forwards_per_call forwards."""
    call_forwards_s: list = field(default_factory=list)
    """A whole call's every forward in order (CUDA events), computed or skipped."""
    call_computed: list | None = None
    """A step-cache call: for each of call_forwards_s, whether the cache computed it (else it skipped)."""
    short_call: dict = field(default_factory=dict)
    """bench.pipeline.whole: the short call before the whole one (its timed forwards, median, rest, and the E2E it
    extrapolates), what the row's `extrapolation` check holds against the whole call."""
    frames_vs_lossless: dict = field(default_factory=dict)
    """A lossy plan's frames against the lossless plan's (the recipe=bf16 plan, fp32 VAE) from a call of as many
    forwards: this run's row, or bench.pipeline.frames_dir's from an earlier run ("from" says which)."""
    text_encoder_weight_sets: int | None = None
    """A prompted row whose seeded conditioner shared this many decoder layers' weights (bench.pipeline.
    text_encoder_weight_sets): its encode computed every layer, its peak_gib holds that many layers' weights only."""


def e2e(steps: int, forward_s: float | None, rest_s: float | None) -> float | None:
    if forward_s is None or rest_s is None:
        return None
    return steps * forward_s + rest_s


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def record_key(r: Mapping) -> tuple:
    return (r["run"], r.get("workflow", DEFAULT_TASK), r["setting"], r["label"], r["vae"])


FILE = ResultsFile(SCHEMA_VERSION, REQUIRED_KEYS, record_key, "a pipeline (user call) benchmark file", kind=KIND,
                   nan_as_null=True)
new_doc, load_doc, check_records, merge_record = FILE.new_doc, FILE.load_doc, FILE.check_records, FILE.merge_record


def write_doc(doc: dict, json_path: str, md_path: str) -> None:
    """NaN / inf (a diverged run) are written as null: the file stays standard JSON. The markdown shows the
    corrections file beside the JSON (load_corrections)."""
    fixes = load_corrections(json_path)
    FILE.write_doc(doc, json_path, md_path, lambda d: render_markdown(d, fixes))


CORRECTIONS_KIND = "pipeline-call-corrections"


def corrections_path(json_path: str) -> str:
    """<stem>-corrections.json beside <stem>.json."""
    stem = json_path[:-len(".json")] if json_path.endswith(".json") else json_path
    return stem + "-corrections.json"


def load_corrections(json_path: str) -> list[dict]:
    """The corrections of the results file at `json_path` (none where there is no corrections file); a file that is not
    one is an error."""
    path = corrections_path(json_path)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or doc.get("kind") != CORRECTIONS_KIND or not isinstance(doc.get("corrections"), list):
        raise ValueError(f"{path} is not a corrections file (kind {CORRECTIONS_KIND})")
    for c in doc["corrections"]:
        missing = [k for k in ("run", "setting", "label", "vae") if k not in c.get("row", {})]
        if missing or not c.get("what"):
            raise ValueError(f"{path}: a correction needs its row's run, setting, label and vae, and what it corrects")
    return doc["corrections"]


def corrections_of(r: Mapping, fixes: Sequence[Mapping]) -> list[Mapping]:
    """The corrections whose row is `r` (its record key)."""
    return [c for c in fixes if record_key({"workflow": "t2va", **c["row"]}) == record_key(r)]


def checks_of(r: Mapping, fixes: Sequence[Mapping] = ()) -> list[Mapping]:
    """The row's declared checks: as its run recorded them (a record from before the `checks` field: the verdicts
    its notes and frames hold, read_back), then those a correction records."""
    own = r["checks"] if "checks" in r else read_back(r)
    return list(own) + [k for c in corrections_of(r, fixes) for k in c.get("checks") or ()]


def read_back(r: Mapping) -> list[dict]:
    """The verdicts an older record wrote before it had `checks`: its notes' "overhead check: ... PASS|FAIL", and
    its frames' bitwise comparison where the row had one to match (its reference, or diffusers eager for the
    stock-bits plan, levers.attention=sdpa)."""
    out = []
    for n in r.get("notes") or ():
        if n.startswith("overhead check:") and n.rsplit(" ", 1)[-1] in ("PASS", "FAIL"):
            out.append({"name": "overhead", "result": n.rsplit(" ", 1)[-1],
                        "detail": n.removeprefix("overhead check: ")})
    f = r.get("frames") or {}
    against = str(f.get("against", ""))
    must = against.startswith("eager with") or (
        f"+{BACKEND}=sdpa" in r["label"] and against.startswith("diffusers eager"))
    if r["setting"] == "plan" and must and f.get("bitwise") is not None:
        out.append({"name": "bitwise", "result": "PASS" if f["bitwise"] else "FAIL", "detail": f"against {against}"})
    return out


def whole_call(r: Mapping) -> bool:
    """The row's E2E is one whole call timed end to end (a record from before the field: its E2E is its wall time,
    as the step-cache rows wrote it)."""
    if "whole_call" in r:
        return bool(r["whole_call"])
    return r.get("e2e_s") is not None and r.get("e2e_s") == r.get("wall_s")


def timed_as(r: Mapping) -> str:
    """How the row's E2E was measured: one whole call, or its median timed forward extrapolated."""
    if whole_call(r):
        return "whole call"
    n, per = len(r.get("forwards_s") or ()), r.get("forwards_per_call")
    return (f"{n} timed forward{'s' if n != 1 else ''} (median) x {r['steps_e2e']} + rest of a {per}-forward call"
            if per else f"{n} timed forwards (median) x {r['steps_e2e']} + rest")


def fill_speedups(rows: list[dict], earlier: Sequence[Mapping] = ()) -> None:
    """Each row's ratios against diffusers eager / best of the same run and VAE precision, and best at fp32. A row
    whose run has no best at its VAE precision takes it from `earlier` runs of the same request (same_precision_best),
    and `best_run` names that run."""
    def find(setting, vae):
        return next((r for r in rows if r["setting"] == setting and r["vae"] == vae and r.get("e2e_s")), None)

    e32 = find("eager", "fp32")
    for r in rows:
        e, b, b32 = find("eager", r["vae"]), find("best", r["vae"]), find("best", "fp32")
        if b is None and r["setting"] != "best":
            b = same_precision_best(r, earlier)
            if b is not None:
                r["best_run"] = b["run"]
        if r["setting"] == "eager" and r["vae"] != "fp32" and r.get("rest_s"):  # the decode precision's own speed
            r["rest_speedup_vs_fp32"] = ratio(e32 and e32["rest_s"], r["rest_s"])
        r["speedup_vs_eager"] = ratio(e and e["e2e_s"], r.get("e2e_s"))
        r["speedup_vs_best"] = ratio(b and b["e2e_s"], r.get("e2e_s"))
        r["speedup_vs_best_fp32"] = ratio(b32 and b32["e2e_s"], r.get("e2e_s"))


def same_request(a: Mapping, b: Mapping) -> bool:
    """Two rows of one request on one kind of GPU: workflow, video, packed rows, GPUs, layers, forwards of a
    generation and the device (an H100's compile is no baseline for an H200's plan)."""
    return all(a.get(k, d) == b.get(k, d) for k, d in (("workflow", "t2va"), ("video", None), ("S", None),
                                                       ("gpus", None), ("layers", None), ("steps_e2e", None),
                                                       ("device", None)))


def same_precision_best(row: Mapping, records: Sequence[Mapping]) -> Mapping | None:
    """diffusers' best (its regional compile) with `row`'s VAE precision for `row`'s request: the row's own run's,
    else the latest other run's, a whole call before an extrapolated one; None where no run measured it."""
    pool = [r for r in records if r["setting"] == "best" and r["vae"] == row["vae"] and r.get("e2e_s")
            and not r.get("error") and same_request(r, row)]
    own = [r for r in pool if r["run"] == row["run"]]
    if own:
        return own[0]
    return max(pool, key=lambda r: (whole_call(r), r["run"]), default=None)


def frames_text(f: Mapping) -> str:
    if not f:
        return ""
    if f.get("bitwise"):
        return f"bitwise vs {f.get('against')}"
    head = "" if f.get("bitwise") is None else "**not bitwise**, "
    return (f"{head}PSNR {fmt(f.get('psnr_db'), '{:.1f}', none='inf')} dB, SSIM {fmt(f.get('ssim'), '{:.5f}')} "
            f"vs {f.get('against')}")


def _runs(records):
    order = []
    for r in records:
        if r["run"] not in order:
            order.append(r["run"])
    return order


def _x(key: str):
    """A ratio cell: 1.234x, or - where the row has no such ratio."""
    return lambda r: fmt(r[key], "{:.3f}x")


def checks_text(r: Mapping, fixes: Sequence[Mapping] = ()) -> str:
    """`overhead FAIL, bitwise PASS`; `(corrected)` where a correction names the row for more than the recipe
    fields replan composes it with (a recipe_overrides note changes no figure of the row)."""
    text = ", ".join(f"{k['name']} {k['result']}" for k in checks_of(r, fixes))
    fixed = any(set(c) - {"row", "what", "recipe_overrides"} or not c.get("recipe_overrides")
                for c in corrections_of(r, fixes))
    return " ".join(x for x in (text, "(corrected)" if fixed else "") if x)


RECORD_COLUMNS = (("setting", "l", cell("label")), ("VAE", "l", cell("vae")),
                  ("forward s", "r", lambda r: fmt(r["forward_s"], "{:.3f}")),
                  ("rest s", "r", lambda r: fmt(r["rest_s"], "{:.2f}")),
                  ("E2E s", "r", lambda r: fmt(r["e2e_s"], "{:.1f}")), ("vs eager", "r", _x("speedup_vs_eager")),
                  ("vs best", "r", _x("speedup_vs_best")), ("vs best (fp32 VAE)", "r", _x("speedup_vs_best_fp32")),
                  ("frames", "l", lambda r: frames_text(r.get("frames") or {})),
                  ("peak GiB", "r", lambda r: fmt(r.get("peak_gib"), "{:.1f}")), ("timed as", "l", timed_as))
RUN_COLUMNS = (("run", "l", cell("run")), ("device", "l", cell("device")), ("GPUs", "r", cell("gpus")),
               ("torch", "l", cell("torch")), ("diffusers", "l", cell("diffusers")), ("started", "l", cell("started")))
SUMMARY_COLUMNS = (("setting", "<40", lambda r: r["label"][:40]), ("vae", "<5", cell("vae")),
                   ("forward", ">8", lambda r: fmt(r["forward_s"], "{:.3f}")),
                   ("rest", ">8", lambda r: fmt(r["rest_s"], "{:.2f}")),
                   ("e2e", ">8", lambda r: fmt(r["e2e_s"], "{:.1f}")),
                   ("vs eager", ">8", lambda r: fmt(r["speedup_vs_eager"], "{:.3f}")),
                   ("vs best", ">8", lambda r: fmt(r["speedup_vs_best"], "{:.3f}")),
                   ("vs best32", ">9", lambda r: fmt(r["speedup_vs_best_fp32"], "{:.3f}")))

COLUMN_NOTES = """\
## What each column means

- Every row is one call of the pipeline exactly as diffusers documents it: `pipe(prompt_embeds=..., height=...,
  width=..., num_frames=..., num_inference_steps=N, output_type="pt", output="videos")` on diffusers'
  `MiniMaxH3ModularPipeline` blocks (`MiniMaxH3CoreDenoiseStep` + `MiniMaxH3DecodeStep`: the video and the
  audio decode), seeded random weights, the same request and seed, one process, one transformer instance. No
  autocast anywhere: the VAE decodes in its own dtype, as diffusers' decode step runs it. A run's **workflow**:
  t2va as above; fl2va (first and last seeded keyframe) and ref2va (one seeded image reference) through diffusers'
  auto blocks less the text encoder step, the keyframe / reference encode part of the call, against the one
  partition the workflow runs (`transformer` / `transformer_ref`).
- **VAE**: fp32 is diffusers' default (the released checkpoint); fp16 / bf16 is the VAE cast as
  `from_pretrained(torch_dtype=...)` casts it (eager, best) or the plan's `vae_precision` (plan).
- **eager**: diffusers as it ships. **best**: `transformer.compile_repeated_blocks(fullgraph=True)` (context
  parallel + compile on several GPUs). **plan**: `h3plan.install(pipe, plan)`. **reference**: diffusers eager with
  the plan's attention backend and VAE precision, for the bitwise check.
- **forward s**: median transformer forward (CUDA events), the first forwards of the call dropped (compile, JIT).
  **rest s**: the call's wall clock minus its forwards (encodes, decodes, scheduler, layout). **E2E s** = steps x forward +
  rest: one generation at the pipeline's default `num_inference_steps` (49 forwards), text encoder excluded.
- **timed as**: "whole call": E2E is one real call of that many forwards timed end to end (a step-cache row, or
  `bench.pipeline.whole`), every forward kept; otherwise the median of the timed forwards of one short call (its
  first forwards untimed) x the generation's forwards + that short call's rest.
- **vs eager / vs best**: E2E ratio against diffusers eager / best with the same VAE precision (a plan decoding in
  fp16 against diffusers with its VAE cast to fp16); where the run has no best at that precision, the latest run of
  the same request that has one, named "(best of <run>)"; **vs best (fp32 VAE)**: against diffusers' best with its
  default VAE, in the same run.
- **checks**: every check the bench declared for the row before it ran, PASS or FAIL (`pipeline_checks.py`; a
  correction's too, marked "corrected").
- **frames**: against diffusers eager with the same VAE, or bitwise against the reference row. Random weights:
  PSNR/SSIM say how far the numerics moved, not how a video looks.
"""  # noqa: E501


def render_markdown(doc: Mapping, fixes: Sequence[Mapping] = ()) -> str:
    """The results file as markdown; `fixes`: its corrections (load_corrections), shown at their rows."""
    recs = doc.get("records", [])
    columns = tuple(c if c[0] != "vs best" else ("vs best", "r", lambda r: vs_best_text(r, recs))
                    for c in RECORD_COLUMNS)
    columns += (("checks", "l", lambda r: checks_text(r, fixes)),)
    devices = sorted({r.get("device", "") for r in recs}) or ["(none)"]
    out = [f"# The call users make: diffusers' `pipe(...)` with and without an h3plan plan ({', '.join(devices)})", ""]
    if any(r.get("timing") != "cuda-events" for r in recs):
        out += ["**Host-clock (CPU) rows below: their times are meaningless; they only show the plumbing.**", ""]
    for run in _runs(recs):
        rows = [r for r in recs if r["run"] == run]
        r0 = rows[0]
        out += [f"## Run {run}: {r0.get('workflow', 't2va')} {r0['video']} ({r0['S']:,} tokens), {r0['gpus']} GPU(s), "
                f"{r0.get('layers')} layers, "
                f"{r0['steps_e2e']} forwards end to end", ""]
        out += md_table(columns, rows, lead=2) + [""]
        for r in rows:
            fb = {k: v for k, v in (r.get("counters") or {}).items() if k.endswith(".fallback")}
            extra = [f"config: {r['config']}"] if r.get("config") else []
            extra += [f"guarded fallbacks in the timed call: {fb}"] if fb else []
            extra += list(r.get("notes") or [])
            extra += [f"{k['name']} {k['result']}: {k['detail']}" for k in r.get("checks") or ()]
            if r.get("best_run"):
                extra.append(f"vs best: diffusers' best with the {r['vae']} VAE from run {r['best_run']} "
                             "(none in this run)")
            if r.get("frames_vs_lossless"):
                extra.append("frames vs the lossless plan: " + frames_text(r["frames_vs_lossless"]) +
                             f" ({r['frames_vs_lossless'].get('from')})")
            extra += [correction_text(c) for c in corrections_of(r, fixes)]
            if extra:
                out.append(f"- {r['label']} ({r['vae']} VAE): " + "; ".join(extra))
        out.append("")
    runs = doc.get("runs", [])
    if runs:
        out += ["## Runs", ""] + md_table(RUN_COLUMNS, runs) + [""]
    out += [COLUMN_NOTES]
    return "\n".join(out)


def vs_best_text(r: Mapping, records: Sequence[Mapping]) -> str:
    """The row's ratio against diffusers' best at its own VAE precision: its run's, else the latest run's of the same
    request (named), else -."""
    b = same_precision_best(r, records)
    if b is None or not r.get("e2e_s"):
        return "-"
    return f"{b['e2e_s'] / r['e2e_s']:.3f}x" + ("" if b["run"] == r["run"] else f" (best of {b['run'][5:16]})")


def correction_text(c: Mapping) -> str:
    """A correction at its row: what it corrects, the checks it records, the row that supersedes it."""
    text = f"**correction** (corrections file): {c['what']}"
    text += "".join(f"; {k['name']} {k['result']}: {k['detail']}" for k in c.get("checks") or ())
    sup = c.get("superseded_by")
    return text + (f"; superseded by run {sup['run']} ({sup['label']}, {sup['vae']} VAE)" if sup else "")


def summary_table(records: Sequence[Mapping]) -> str:
    return text_table(SUMMARY_COLUMNS, records, lead=2,
                      free=("frames", lambda r: frames_text(r.get("frames") or {}).replace("**", "")))


def write_chart(records: Sequence[Mapping], path: str) -> str | None:
    """Stacked bars per row of the last run (forwards, rest); None when written, else the one-line reason."""
    runs = _runs(records)
    recs = [r for r in records if runs and r["run"] == runs[-1] and not r.get("error") and r.get("e2e_s")]
    if not recs:
        return "no finished records: PNG skipped"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: PNG skipped"
    try:
        fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(recs)), 4.2))
        for i, r in enumerate(recs):
            den = r["steps_e2e"] * r["forward_s"]
            ax.bar(i, den, 0.6, color="#4c72b0", label="forwards" if i == 0 else None)
            ax.bar(i, r["rest_s"], 0.6, bottom=den, color="#dd8452", label="rest (decode)" if i == 0 else None)
            if r.get("speedup_vs_best_fp32"):
                ax.annotate(f"{r['speedup_vs_best_fp32']:.2f}x", (i, den + r["rest_s"]),
                            ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(recs)), [f"{r['setting']}\n{r['vae']}" for r in recs], fontsize=7)
        ax.set_ylabel("seconds per generation")
        ax.set_title(f"pipe(...) end to end, {recs[0]['video']}, {recs[0]['steps_e2e']} forwards "
                     f"(x: vs diffusers' best with fp32 VAE)", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
    except Exception as exc:  # noqa: BLE001 -- the JSON and markdown are the results; the PNG is a view
        return f"PNG failed: {one_line(exc)}"
    return None


# the step-cache rows' budget (benchmarks/pipeline_h200.sh H3_PHASE=cache-*): SGLang's quality=high, 34 of 49 computed
CACHE_BUDGET = {"psnr_db_min": 28, "ssim_min": 0.93, "computed": 34, "unmeasured": True}  # as the rows ran: no evidence


def request_overrides(plan) -> dict:
    """The plan's request as overrides that compose it again: the video preset, the task with its keyframes or
    references, and the text encoder's placement."""
    v, te = plan.get("video"), plan.get("memory").get("text_encoder")
    out = {"video": v["name"], "video.task": v.get("task") or DEFAULT_TASK}
    out.update({f"video.{k}": v[k] for k in ("keyframes", "references") if v.get(k)})
    if te and te != "none":
        out["memory.text_encoder"] = te
    return out


def recipe_overrides(plan) -> dict:
    """The plan's recipe fields that differ from its preset's (with its tier): resolve_config keywords
    (`recipe.vae`, `recipe.cache`, ...) for what a plan row's label cannot say - `+vae=fp16` is the decode's
    precision, which an fp8 recipe gives with its FP8 tiles and `recipe.vae=fp16` with diffusers' tiles."""
    mine = plan.get("recipe")
    tier = (mine.get("tier") or {}).get("name")
    preset = OmegaConf.to_container(compose([f"tier={tier}" if tier else f"recipe={mine['name']}"]), resolve=True,
                                    enum_to_str=True)  # composed, not planned: any recipe on any hardware
    assert isinstance(preset, dict) and isinstance(preset["recipe"], dict)  # a composed config is a mapping
    return {f"recipe.{k}": v for k, v in mine.items() if v != preset["recipe"].get(k)}


def replan(row: Mapping, steps: int | None = None, fixes: Sequence[Mapping] = (), **groups):
    """A committed plan row planned again (h3plan.resolve_config with `groups`, e.g. hardware=...): its recipe,
    Ulysses degree, the `+lever=setting` words its label carries (the levers its run forced), the step cache's
    budget, the recipe fields its run set (its `recipe_overrides`; a row from before that field: its correction's,
    in `fixes`), the row's request (its `request`: a workflow, a text encoder; with a prompt through the text encoder,
    its text rows are the ones the call measured: the row's S less the request's other rows), and the row's decode
    precision where the recipe's own differs; `steps`: pipeline.num_inference_steps instead of the row's request."""
    over: dict = {"recipe": row["recipe"], "parallel": f"u{row['gpus']}", **row.get("request", {}), **groups}
    for word in row["label"].split()[1:]:
        lever, setting = word.lstrip("+").split("=", 1)
        if not word.startswith("+"):  # a config group the run chose (tier=quality)
            over[lever] = setting
            continue
        if lever != "vae":
            over[f"levers.{lever}"] = setting
        if lever == STEP_CACHE:
            over["recipe.cache"] = dict(CACHE_BUDGET)
    over.update(row.get("recipe_overrides") or next((c["recipe_overrides"] for c in corrections_of(row, fixes)
                                                     if c.get("recipe_overrides")), {}))
    if steps:
        over["pipeline.num_inference_steps"] = steps
    plan = resolve_config(**over)
    seq = plan.derived_value("sequence") or {}
    if prompted(row) and row.get("S") and seq.get("seq_len") not in (None, row["S"]):
        # a prompt through the conditioner: its rows are what the call packed (the template, the keyframes' and
        # references' vision blocks), which the request's video.text_tokens only gave as an example
        over["video.text_tokens"] = seq["text_rows"] + row["S"] - seq["seq_len"]
        plan = resolve_config(**over)
    if plan.decision(DECODE_PRECISION).setting != row["vae"]:
        plan = resolve_config(**over, **{"recipe.vae": row["vae"]})
    return plan


def sparse_decision(plan):
    """The plan's enabled decision that runs block-sparse attention (its Terms), or None."""
    return next((d for d in plan.decisions if d.enabled and terms({d.lever: d}).sparse_blocks), None)


def each_forward(forward_s: float, sparse_s: float | None, dense: int | None, forwards: int) -> list[float]:
    """Each forward's time of a call of `forwards`: `forward_s`, and `sparse_s` after `dense` dense forwards where
    the plan runs sparse attention."""
    return [forward_s if sparse_s is None or dense is None or i < dense else sparse_s for i in range(forwards)]


def planned_forwards(plan, forwards: int) -> list[float]:
    """The plan's time for each forward of a call of `forwards`: forward_s_est, and with sparse attention
    forward_sparse_s_est after its dense forwards."""
    sparse = sparse_decision(plan)
    return each_forward(plan.derived_value("forward_s_est"), plan.derived_value("forward_sparse_s_est"),
                        None if sparse is None else sparse.param("dense_forwards"), forwards)


def computed_median(per_forward: Sequence[float], row: Mapping) -> float:
    """The median of the times of the forwards `row` computed (its call_computed; else every forward)."""
    mask = row.get("call_computed") or [True] * row["steps_e2e"]
    return statistics.median(t for t, m in zip(per_forward, mask) if m)


def skipped_saving(per_forward: Sequence[float], row: Mapping, layers: int) -> float | None:
    """What a first_block cache's skipped forwards of `row` save against computing them: each one's time but its first
    block (1/layers of it); None where the row kept no mask of the call's forwards."""
    mask = row.get("call_computed")
    if not mask or len(mask) != len(per_forward):
        return None
    return sum(t for t, m in zip(per_forward, mask) if not m) * (1 - 1 / layers)


def predicted_forward(plan, row: Mapping) -> float | None:
    """The plan's figure for `row`'s forward_s (the median of the forwards the row computed): forward_s_est, or where
    the plan mixes dense and sparse forwards, the median of the planned times of the forwards the row computed."""
    if plan.derived_value("forward_s_est") is None:
        return None
    n = len(row.get("call_computed") or ()) or row["steps_e2e"]
    return computed_median(planned_forwards(plan, n), row)


def predicted_call(plan, row: Mapping, steps: int | None = None) -> float | None:
    """The plan's call estimate for `row`'s own call: call_s_est (its text encode counted, text_encode_s_est), less
    that encode where the row's call took prompt_embeds though the plan places a text encoder. A first_block cache's
    plan counts every forward computed (how many skip is the checkpoint's statistics): here it is taken at the
    forwards the row measured computing (its call_computed, else its count at the plan's forward), each skipped
    forward costing its first block (1/layers of its planned time: dense or sparse). `steps`: another request, the
    plan's own."""
    call = plan.derived_value("call_s_est")
    if call is None:
        return None
    if not prompted(row):
        call -= plan.derived_value("text_encode_s_est") or 0.0
    computed = (row.get("counters") or {}).get(f"{counter(STEP_CACHE)}.computed")
    if steps or computed is None or plan.decision(STEP_CACHE).setting != "first_block":
        return call
    n = plan.derived_value("sequence")["transformer_forwards"]
    saved = skipped_saving(planned_forwards(plan, n), row, row["layers"])
    if saved is None:
        saved = (n - computed) * plan.derived_value("forward_s_est") * (1 - 1 / row["layers"])
    return call - saved


def encode_shapes(plan) -> list[list[int]]:
    """[frames, height, width] of each video VAE encode the plan's request makes (keyframes, references)."""
    return [[x["frames"], x["height"], x["width"]] for x in encode_inputs(plan.derived_value("sequence") or {})]


def prompted(row: Mapping) -> bool:
    """A row whose call took a prompt through the text encoder (its request places one), not prompt_embeds."""
    setting = row.get("request", {}).get("memory.text_encoder")  # "auto" resolves by the plan; "none": prompt_embeds
    return setting in MEMORY_SPECS["text_encoder"].settings and setting != "none"
