"""Pipeline benchmark records: the schema, the results file (JSON), the markdown and the chart.

Pure Python (no torch; matplotlib only for the PNG, loaded lazily). A results file is
{"schema_version": 1, "runs": [...], "records": [...]}; records are merged by (video, gpus, plan, device),
so invocations with other plans or requests append to one file (S follows from the request). Times are seconds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .bench.records import _f, _one_line
from .results_file import ResultsFile, write_atomic

SCHEMA_VERSION = 1
KIND = "pipeline"
REQUIRED_KEYS = ("video", "S", "gpus", "plan", "steps_timed", "steps_e2e", "eager_step_s", "best_step_s",
                 "plan_step_s", "eager_decode_s", "best_decode_s", "plan_decode_s", "e2e_speedup_vs_eager",
                 "e2e_speedup_vs_best", "best_config", "frames_bitwise", "frames_psnr_db")
SETTINGS = ("eager", "best", "plan")


@dataclass
class PipelineRecord:
    """One (request, plan, GPUs) measurement; the first seventeen fields are the issue's record.

    *_step_s: median time of one denoise step (one transformer forward and the two scheduler updates) in
    diffusers' own loop, after the warm-up steps; *_decode_s: diffusers' video decode step (VAE decode,
    denormalisation, postprocess), best = diffusers' VAE as it ships (= eager); steps_e2e: transformer forwards
    of one generation at the pipeline's default num_inference_steps; *_e2e_s = overhead_s + steps_e2e * step
    + decode (+ audio_decode_s): a whole generation without the text encoder, compile and capture excluded.
    frames_bitwise: the plan's frames torch.equal to `frames_reference` (None: lossy plan, no such reference);
    frames_psnr_db / frames_ssim: the plan's frames against diffusers eager's (PSNR None: identical).
    """

    video: str
    S: int
    gpus: int
    plan: str
    steps_timed: int
    steps_e2e: int
    eager_step_s: float | None
    best_step_s: float | None
    plan_step_s: float | None
    eager_decode_s: float | None
    best_decode_s: float | None
    plan_decode_s: float | None
    e2e_speedup_vs_eager: float | None
    e2e_speedup_vs_best: float | None
    best_config: str
    frames_bitwise: bool | None
    frames_psnr_db: float | None
    frames_ssim: float | None = None
    frames_max_abs: float | None = None
    frames_reference: str = ""
    recipe: str = ""
    lossless: bool = False
    device: str = ""
    timing: str = "cuda-events"
    layers: int | None = None
    num_inference_steps: int | None = None
    steps_per_call: int | None = None
    warmup_steps: int | None = None
    rounds: int | None = None
    order: str = ""
    audio: bool = False
    audio_decode_s: float | None = None
    vae_precision: str = ""
    overhead_s: float | None = None
    eager_e2e_s: float | None = None
    best_e2e_s: float | None = None
    plan_e2e_s: float | None = None
    step_s_ranges: dict = field(default_factory=dict)
    latents_rel_error: dict = field(default_factory=dict)
    peak_mem_gib: dict = field(default_factory=dict)
    first_step_s: dict = field(default_factory=dict)
    counters: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    error: str | None = None


def e2e(overhead: float | None, steps: int, step_s: float | None, decode_s: float | None,
        audio_s: float | None = None) -> float | None:
    if step_s is None or decode_s is None:
        return None
    return (overhead or 0.0) + steps * step_s + decode_s + (audio_s or 0.0)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def record_key(r: Mapping) -> tuple:
    return (r["video"], r["gpus"], r["plan"], r.get("device", ""))


FILE = ResultsFile(SCHEMA_VERSION, REQUIRED_KEYS, record_key, "a pipeline benchmark file", kind=KIND)
new_doc, load_doc, check_records, merge_record = FILE.new_doc, FILE.load_doc, FILE.check_records, FILE.merge_record


def _finite(x):
    """NaN / inf (a diverged run) become null: the file stays standard JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def write_doc(doc: dict, json_path: str, md_path: str) -> None:
    doc["records"] = [_finite(r) for r in doc["records"]]
    write_atomic(json_path, json.dumps(_finite(doc), indent=1, allow_nan=False) + "\n")
    write_atomic(md_path, render_markdown(doc))


def _sorted(records):
    return sorted(records, key=lambda r: (r["plan"], r["gpus"], r["S"], r["video"], r.get("device", "")))


def _frames(r) -> str:
    if r.get("frames_bitwise"):
        return "bitwise"
    psnr, ssim = r.get("frames_psnr_db"), r.get("frames_ssim")
    head = "" if r.get("frames_bitwise") is None else "**not bitwise**, "
    return f"{head}PSNR {_f(psnr, '{:.1f}', none='inf')} dB, SSIM {_f(ssim, '{:.4f}')}"


COLUMN_NOTES = """\
## What each column compares

- Every setting runs diffusers' own modular pipeline blocks (`MiniMaxH3CoreDenoiseStep`: layout, noise, the two
  schedules and the denoise loop; `MiniMaxH3VideoDecodeStep`), seeded random weights, the same request and seed,
  in one process on one transformer instance.
- **eager**: diffusers as it ships. **best**: diffusers' best setting for these GPUs (`best config`): regional
  compile on one GPU; context-parallel Ulysses with a context-parallel attention backend, compiled, on several;
  the VAE as diffusers leaves it, so its decode time is eager's. **plan**: `h3plan.install(pipe, plan)`.
- **step s**: median of the timed denoise steps (device events between consecutive transformer calls of
  diffusers' loop), after the warm-up steps of every call. **decode s**: the video decode step after one
  untimed decode (the plan's first decode captures its CUDA graphs).
- **e2e s**: overhead + steps e2e x step + decode (+ audio decode): one generation at the pipeline's default
  `num_inference_steps`, text encoder, compile and graph capture excluded. **vs eager / vs best**: e2e ratios.
- **frames**: the plan's decoded frames against the reference named in the JSON (`frames_reference`):
  bitwise for a lossless plan (diffusers eager with the plan's attention backend); PSNR / SSIM against diffusers
  eager otherwise. Random weights and a few steps: the frames are noise, so PSNR/SSIM say how far the numerics
  moved, not how a video looks.
"""


def render_markdown(doc: Mapping) -> str:
    recs = _sorted(doc.get("records", []))
    devices = sorted({r.get("device", "") for r in recs}) or ["(none)"]
    out = [f"# Pipeline benchmark: diffusers eager, diffusers' best and h3plan plans ({', '.join(devices)})", ""]
    if any(r.get("timing") != "cuda-events" for r in recs):
        out += ["**Host-clock (CPU) records below: their times are meaningless; they only show the plumbing.**", ""]
    out += ["| plan | video | S | GPUs | layers | eager step s | best step s | plan step s | eager decode s | plan decode s "
            "| steps e2e | eager e2e s | best e2e s | plan e2e s | vs eager | vs best | frames |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in recs:
        if r.get("error"):
            out.append(f"| {r['plan']} | {r['video']} | {r['S']} | {r['gpus']} | | failed: {r['error'][:160]} "
                       "| | | | | | | | | | | |")
            continue
        out.append(f"| {r['plan']} | {r['video']} | {r['S']} | {r['gpus']} | {_f(r.get('layers'), '{}')} | "
                   f"{_f(r['eager_step_s'], '{:.3f}')} | {_f(r['best_step_s'], '{:.3f}')} | {_f(r['plan_step_s'], '{:.3f}')} | "
                   f"{_f(r['eager_decode_s'], '{:.2f}')} | {_f(r['plan_decode_s'], '{:.2f}')} | {r['steps_e2e']} | "
                   f"{_f(r.get('eager_e2e_s'), '{:.1f}')} | {_f(r.get('best_e2e_s'), '{:.1f}')} | "
                   f"{_f(r.get('plan_e2e_s'), '{:.1f}')} | {_f(r['e2e_speedup_vs_eager'], '{:.3f}')}x | "
                   f"{_f(r['e2e_speedup_vs_best'], '{:.3f}')}x | {_frames(r)} |")
    out += ["", "## Settings", ""]
    for r in recs:
        if r.get("error"):
            continue
        mem = ", ".join(f"{k} {v:.1f}" for k, v in (r.get("peak_mem_gib") or {}).items() if v is not None)
        fb = {k: v for k, v in (r.get("counters") or {}).items() if k.endswith(".fallback")}
        out.append(f"- `{r['plan']}` {r['video']} ({r['S']:,} tokens, {r['gpus']} GPU{'s' if r['gpus'] > 1 else ''}): "
                   f"best = {r['best_config']}; {r['steps_timed']} timed steps per setting ({r.get('order', '')}); "
                   f"steps e2e {r['steps_e2e']} (num_inference_steps={r.get('num_inference_steps')}); VAE "
                   f"{r.get('vae_precision', '')}; frames vs {r.get('frames_reference', '')}"
                   + (f"; peak GiB: {mem}" if mem else "") + (f"; guarded fallbacks while timed: {fb}" if fb else ""))
        for note in r.get("notes") or []:
            out.append(f"  - {note}")
    runs = doc.get("runs", [])
    if runs:
        out += ["", "## Runs", "", "| plan | video | device | GPUs | torch | diffusers | started |",
                "|---|---|---|---:|---|---|---|"]
        for run_ in runs:
            out.append(f"| {run_.get('plan')} | {run_.get('video')} | {run_.get('device')} | {run_.get('gpus')} | "
                       f"{run_.get('torch')} | {run_.get('diffusers')} | {run_.get('started')} |")
    out += ["", COLUMN_NOTES]
    return "\n".join(out)


def summary_table(records: Sequence[Mapping]) -> str:
    rows = [f"{'plan':<22} {'video':<14} {'S':>6} {'gpu':>3} {'eager/step':>10} {'best/step':>10} {'plan/step':>10} "
            f"{'vs eager':>8} {'vs best':>8}  frames"]
    for r in _sorted(records):
        if r.get("error"):
            rows.append(f"{r['plan']:<22} {r['video']:<14} {r['S']:>6} {r['gpus']:>3}  failed: {r['error'][:80]}")
            continue
        rows.append(f"{r['plan']:<22} {r['video']:<14} {r['S']:>6} {r['gpus']:>3} {_f(r['eager_step_s'], '{:.3f}'):>10} "
                    f"{_f(r['best_step_s'], '{:.3f}'):>10} {_f(r['plan_step_s'], '{:.3f}'):>10} "
                    f"{_f(r['e2e_speedup_vs_eager'], '{:.3f}'):>8} {_f(r['e2e_speedup_vs_best'], '{:.3f}'):>8}  "
                    f"{_frames(r).replace('**', '')}")
    return "\n".join(rows)


def write_chart(records: Sequence[Mapping], path: str) -> str | None:
    """Stacked bars per record (denoise = steps e2e x step, decode) for eager / best / plan; None when written,
    else the one-line reason it was not."""
    recs = [r for r in _sorted(records) if not r.get("error") and r.get("eager_step_s") is not None]
    if not recs:
        return "no finished records: PNG skipped"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: PNG skipped"
    try:
        fig, ax = plt.subplots(figsize=(max(6.0, 2.6 * len(recs)), 4.2))
        width, labels = 0.26, []
        for i, r in enumerate(recs):
            for j, s in enumerate(SETTINGS):
                step, dec = r.get(f"{s}_step_s"), r.get(f"{s}_decode_s")
                if step is None:
                    continue
                x = i + (j - 1) * width
                denoise = r["steps_e2e"] * step + (r.get("overhead_s") or 0.0)
                ax.bar(x, denoise, width, color=("#888888", "#4c72b0", "#dd8452")[j], label=s if i == 0 else None)
                top = (dec or 0.0) + (r.get("audio_decode_s") or 0.0)
                ax.bar(x, top, width, bottom=denoise, color=("#bbbbbb", "#8fa8d6", "#f0b48a")[j],
                       label=f"{s} decode" if i == 0 else None)
                if s == "plan":
                    ax.annotate(f"{_f(r.get('e2e_speedup_vs_eager'))}x eager\n{_f(r.get('e2e_speedup_vs_best'))}x best",
                                (x, denoise + top), ha="center", va="bottom", fontsize=7)
            labels.append(f"{r['plan']}\n{r['video']} U{r['gpus']}")
        ax.set_xticks(range(len(recs)), labels, fontsize=8)
        ax.set_xlim(-0.6, len(recs) - 0.4)
        ax.margins(y=0.15)
        ax.set_ylabel("seconds per generation (estimate)")
        unit = "host clock: meaningless" if any(r.get("timing") != "cuda-events" for r in recs) else recs[0].get("device", "")
        ax.set_title(f"MiniMax-H3 pipeline, {recs[0]['steps_e2e']} steps + decode ({unit})", fontsize=10)
        ax.legend(fontsize=7, ncol=3)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
    except Exception as exc:  # noqa: BLE001 -- the JSON and markdown are the results; the PNG is a view
        return f"PNG failed: {_one_line(exc)}"
    return None
