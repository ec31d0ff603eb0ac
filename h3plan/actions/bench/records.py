"""Block benchmark records: the schema, the results file (JSON), the markdown table and the chart hook.

Pure Python (no torch): the file format of `action=bench` and how it reads. A results file is
{"schema_version": 1, "runs": [...], "records": [...]}; records are merged by (plan, S, blocks, device),
so invocations with different plans append to one file. Targets (on the H200): a lossless
plan's single block >= 1.25x diffusers eager, an FP8 plan >= 1.5x, attention inside the plan >= 95% of
its backend standalone; the markdown says met / not met for every GPU record, each speedup also against
diffusers' best one-GPU setting (regional compile). Fields added later default to None, so older files
load and render them as "-".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from h3plan.facts.attention import LOSSLESS

from .results_file import ResultsFile
from .tables import cell, md_table, text_table
from .tables import fmt as _f
from .tables import one_line as _one_line

SCHEMA_VERSION = 1
# diffusers eager MiniMaxH3TransformerBlock on the H200, bf16, default attention
# (benchmarks/anchors/h200-diffusers-block.json)
ANCHOR_EAGER_MS = {19000: 46.5, 37820: 130.7}
TARGET_LOSSLESS_SPEEDUP = 1.25
TARGET_FP8_SPEEDUP = 1.5
TARGET_ATTENTION_FRACTION = 0.95
REQUIRED_KEYS = ("S", "blocks", "plan", "eager_ms", "plan_ms", "speedup", "attention_ms", "attention_backend",
                 "bitwise_equal", "rel_error")
LOSSLESS_BACKENDS = LOSSLESS  # the attention backends that keep eager's bits (h3plan.facts.attention's registry)


@dataclass
class BlockRecord:
    """One (plan, S, blocks) measurement. The first ten fields are REQUIRED_KEYS; times in ms.

    eager_ms / plan_ms: median block-stack forward (diffusers eager / plan installed); speedup = eager / plan.
    attention_ms: the plan's backend alone at the per-rank shape; attention_default_ms: diffusers'
    default dispatch there; attention_in_plan_ms: that backend's calls inside the plan's forward, and
    attention_standalone_ms: the backend on clones of those very arguments; fraction = standalone / in plan.
    attention_after_forward_ms: the same standalone call, each one right after a whole (untimed) plan
    forward, so in the power and clock state the plan's own call meets; fraction_matched = that / in plan.
    bitwise_equal: plan output == diffusers eager with the plan's attention backend (None: no such
    reference, see bitwise_reference); rel_error: ||plan - eager|| / ||eager|| against default attention.
    best_*: diffusers' best one-GPU setting (`best_config`: regional compile of the eager blocks), timed
    interleaved with eager and the plan; speedup_vs_best = best_ms / plan_ms; best_first_call_s: its first
    call at this (S, blocks), compile included, excluded from best_ms; best_rel_error: against eager as
    rel_error. None everywhere (and "" config) in records written before the best setting existed.
    """

    S: int
    blocks: int
    plan: str
    eager_ms: float | None
    plan_ms: float | None
    speedup: float | None
    attention_ms: float | None
    attention_backend: str
    bitwise_equal: bool | None
    rel_error: float | None
    recipe: str = ""
    lossless: bool = False
    device: str = ""
    timing: str = "cuda-events"
    eager_ms_range: list = field(default_factory=list)
    plan_ms_range: list = field(default_factory=list)
    attention_shape: list = field(default_factory=list)
    attention_default_ms: float | None = None
    attention_in_plan_ms: float | None = None
    attention_standalone_ms: float | None = None
    attention_in_plan_fraction: float | None = None
    attention_after_forward_ms: float | None = None
    attention_in_plan_fraction_matched: float | None = None
    bitwise_reference: str = ""
    backend_rel_error: float | None = None
    max_abs_error: float | None = None
    peak_mem_gib: float | None = None
    counters: dict = field(default_factory=dict)
    error: str | None = None
    best_config: str = ""
    best_ms: float | None = None
    best_ms_range: list = field(default_factory=list)
    speedup_vs_best: float | None = None
    best_first_call_s: float | None = None
    best_rel_error: float | None = None
    best_max_abs_error: float | None = None
    best_error: str | None = None


# ---------------------------------------------------------------- results file, markdown, chart


def record_key(r: Mapping) -> tuple:
    return (r["plan"], r["S"], r["blocks"], r.get("device", ""))


FILE = ResultsFile(SCHEMA_VERSION, REQUIRED_KEYS, record_key, "a block benchmark file")
new_doc, load_doc, check_records, merge_record = FILE.new_doc, FILE.load_doc, FILE.check_records, FILE.merge_record


def write_doc(doc: dict, json_path: str, md_path: str) -> None:
    FILE.write_doc(doc, json_path, md_path, render_markdown)


def _bitwise(r) -> str:
    return "-" if r.get("bitwise_equal") is None else ("yes" if r["bitwise_equal"] else "**no**")


def fallbacks(r: Mapping) -> int:
    """Guarded calls that took diffusers' path during the timed repetitions (0: every fused path ran)."""
    return sum(v for k, v in (r.get("counters") or {}).items() if k.endswith(".fallback"))


def _vs_best(r) -> str:
    """'; 1.050x diffusers' best' for the target lines; why not where it did not run; '' in older records."""
    if r.get("speedup_vs_best") is not None:
        return f"; {r['speedup_vs_best']:.3f}x diffusers' best"
    why = r.get("best_error") or r.get("best_config")
    return f"; diffusers' best: {why}" if why else ""


def _tflops(shape, ms):
    if not shape or not ms:
        return None
    B, S, H, D = shape
    return 4.0 * B * S * S * H * D / (ms * 1e-3) / 1e12


def _sorted(records):
    return sorted(records, key=lambda r: (r["plan"], r["S"], r["blocks"], r.get("device", "")))


def _is_fp8(r) -> bool:
    return r.get("recipe") == "fp8"


def target_lines(records: Sequence[Mapping]) -> list[str]:
    """One line per target and (plan, S): the measured value and met / not met. Single-block records only."""
    lines = []
    for r in _sorted(records):
        if r["blocks"] != 1 or r.get("error") or r.get("timing") != "cuda-events":
            continue
        sp = r.get("speedup")
        if r.get("lossless"):
            goal, what = TARGET_LOSSLESS_SPEEDUP, "lossless plan block"
        elif _is_fp8(r):
            goal, what = TARGET_FP8_SPEEDUP, "FP8 plan block"
        else:
            goal, what = None, "plan block"
        if goal is not None:
            verdict = "met" if sp is not None and sp >= goal else "**not met**"
            extra = f", rel. error vs BF16 eager {_f(r.get('rel_error'), '{:.2e}')}" if not r.get("lossless") else ""
            if r.get("lossless") and r.get("bitwise_equal") is False:
                extra += ", **not bitwise equal to eager with the same backend**"
            if fallbacks(r):
                extra += f", {fallbacks(r)} guarded calls fell back"
            lines.append(f"- {what} >= {goal}x diffusers eager, `{r['plan']}` S={r['S']} x{r['blocks']}: "
                         f"{_f(sp, '{:.3f}')}x{extra} -> {verdict}{_vs_best(r)}")
        frac = r.get("attention_in_plan_fraction")
        if frac is not None:
            verdict = "met" if frac >= TARGET_ATTENTION_FRACTION else "**not met**"
            matched = r.get("attention_in_plan_fraction_matched")
            ctx = "" if matched is None else (f" (context, not the target: {matched:.1%} of the same call made right "
                                              f"after a plan forward)")
            lines.append(f"- attention inside the plan >= {TARGET_ATTENTION_FRACTION:.0%} of "
                         f"`{r['attention_backend']}` standalone, `{r['plan']}` S={r['S']} x{r['blocks']}: {frac:.1%} "
                         f"-> {verdict}{ctx}")
    for S, anchor in sorted(ANCHOR_EAGER_MS.items()):
        eager = [r["eager_ms"] for r in records if r["S"] == S and r["blocks"] == 1 and r.get("eager_ms")
                 and r.get("timing") == "cuda-events" and "h200" in r.get("device", "").lower()]
        if eager:
            lines.append(f"- (context) diffusers eager block at S={S}: {', '.join(f'{e:.1f}' for e in eager)} ms "
                         f"in these runs; anchor {anchor} ms (benchmarks/anchors/h200-diffusers-block.json)")
    return lines


RECORD_COLUMNS = (("plan", "l", cell("plan")), ("S", "r", cell("S")), ("blocks", "r", cell("blocks")),
                  ("eager ms", "r", lambda r: _f(r["eager_ms"])), ("best ms", "r", lambda r: _f(r.get("best_ms"))),
                  ("plan ms", "r", lambda r: _f(r["plan_ms"])), ("speedup", "r", lambda r: f"{_f(r['speedup'])}x"),
                  ("vs best", "r", lambda r: _f(r.get("speedup_vs_best"), "{:.2f}x")),
                  ("bitwise (same attention)", "l", _bitwise),
                  ("rel. error vs eager", "r", lambda r: _f(r["rel_error"], "{:.2e}")),
                  ("guard fallbacks", "r", fallbacks), ("peak GiB", "r", lambda r: _f(r.get("peak_mem_gib"), "{:.1f}")))
RUN_COLUMNS = tuple((k, a, cell(k)) for k, a in (("plan", "l"), ("device", "l"), ("torch", "l"), ("diffusers", "l"),
                                                  ("warmup", "r"), ("iters", "r"), ("started", "l")))

COLUMN_NOTES = """\
## What each column compares

- **eager ms**: diffusers' own `MiniMaxH3TransformerBlock.forward` (default attention dispatch), `blocks`
  blocks in a row, bf16, one GPU; median of the timed repetitions (CUDA events, synchronized).
- **plan ms**: the same blocks, same weights and inputs, after `h3plan.install(model, plan)`;
  repetitions interleaved with eager in the same process. **speedup** = eager ms / plan ms.
- **best ms**: diffusers' best one-GPU setting, a copy of the eager blocks compiled the way diffusers users
  do (`compile_repeated_blocks(fullgraph=True)`, static shapes per S), timed interleaved with the other two
  after its own warm-up; the first call (the compile) is reported apart. **vs best** = best ms / plan ms.
  `-`: not run (`bench.best=off`) or a record from before the column existed.
- **bitwise**: the plan's output `torch.equal` to diffusers' eager blocks run with the *plan's attention
  backend* (every other lever off): what "lossless" promises. `-` where no such reference exists
  (a lossy attention backend such as cudnn_fp8).
- **rel. error**: ||plan - eager|| / ||eager|| (Frobenius, fp32) against diffusers' eager blocks with
  their *default* attention; for a lossless plan it is the attention backend's own difference.
- **guard fallbacks**: guarded calls (h3plan.install counters) that routed to diffusers' own code
  during the timed plan repetitions; 0 means every installed fused path really ran.
- **attention**: random bf16 q/k/v of the per-rank shape (B, S, heads, head_dim): the plan's backend
  called directly against diffusers' default `dispatch_attention_fn`; TFLOP/s = 4*S^2*H*D / time.
- **in plan** / **standalone**: device events around the backend's calls inside the plan's forward,
  and the same backend on clones of those very arguments, calls back to back; **in-plan speed** =
  standalone / in plan (the target's measure).
- **after a forward** / **in-plan speed (matched)**: the same standalone call, each one issued right after
  a whole untimed plan forward, and that time / in plan. On a GPU at its power cap a call that follows
  GEMMs runs at a lower clock than one that follows attention; this column holds that state equal, so
  what is left between it and "in plan" is what the plan itself adds around the call.
"""


def render_markdown(doc: Mapping) -> str:
    recs = _sorted(doc.get("records", []))
    devices = sorted({r.get("device", "") for r in recs}) or ["(none)"]
    out = [f"# Block benchmark: diffusers eager vs h3plan plans ({', '.join(devices)})", ""]
    if any(r.get("timing") != "cuda-events" for r in recs):
        out += ["**Host-clock (CPU) records below: their times are meaningless; they only show the plumbing "
                "(files, correctness columns).**", ""]
    out += md_table(RECORD_COLUMNS, recs, lead=3)
    out += _best_section(recs)
    out += ["", "## Attention at the per-rank shape", "",
            "| plan | S | blocks | shape | backend | backend ms | TFLOP/s | diffusers default ms | TFLOP/s | in plan "
            "ms | standalone ms | in-plan speed | after a forward ms | in-plan speed (matched) |",
            "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in recs:
        if r.get("error"):
            continue
        shape = r.get("attention_shape") or []
        out.append(f"| {r['plan']} | {r['S']} | {r['blocks']} | {'x'.join(map(str, shape)) or '-'} | "
                   f"{r['attention_backend']} | {_f(r['attention_ms'])} | "
                   f"{_f(_tflops(shape, r['attention_ms']), '{:.0f}')} | {_f(r.get('attention_default_ms'))} | "
                   f"{_f(_tflops(shape, r.get('attention_default_ms')), '{:.0f}')} | "
                   f"{_f(r.get('attention_in_plan_ms'))} | {_f(r.get('attention_standalone_ms'))} | "
                   f"{_f(r.get('attention_in_plan_fraction'), '{:.1%}')} | {_f(r.get('attention_after_forward_ms'))} | "
                   f"{_f(r.get('attention_in_plan_fraction_matched'), '{:.1%}')} |")
    lines = target_lines(recs)
    out += ["", "## Targets (H200, one GPU, real width, bf16 activations)", ""]
    out += lines or ["- no GPU single-block records yet: no target can be judged"]
    runs = doc.get("runs", [])
    if runs:
        out += ["", "## Runs", ""] + md_table(RUN_COLUMNS, runs)
    notes = sorted({(r["plan"], r.get("bitwise_reference", "")) for r in recs if r.get("bitwise_reference")})
    if notes:
        out += ["", "Bitwise references: " + "; ".join(f"`{p}`: {n}" for p, n in notes)]
    out += ["", COLUMN_NOTES]
    return "\n".join(out)


def _best_section(recs) -> list[str]:
    """diffusers' best per record: its first call (compile included) and its error; [] when no record has it."""
    rows = [r for r in recs if not r.get("error") and r.get("best_config")]
    if not rows:
        return []
    out = ["", "## diffusers' best setting", "", "| plan | S | blocks | best ms (min-max) | first call s (compile) "
           "| rel. error vs eager | max abs error |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lo_hi = r.get("best_ms_range") or []
        spread = f" ({lo_hi[0]:.2f}-{lo_hi[1]:.2f})" if len(lo_hi) == 2 else ""
        ms = f"failed: {r['best_error'][:120]}" if r.get("best_error") else _f(r.get("best_ms")) + spread
        out.append(f"| {r['plan']} | {r['S']} | {r['blocks']} | {ms} | {_f(r.get('best_first_call_s'), '{:.1f}')} | "
                   f"{_f(r.get('best_rel_error'), '{:.2e}')} | {_f(r.get('best_max_abs_error'), '{:.2e}')} |")
    configs = sorted({(r["plan"], r["best_config"]) for r in rows})
    return out + ["", "Best settings: " + "; ".join(f"`{p}`: `{c}`" for p, c in configs)]


def write_chart(records: Sequence[Mapping], path: str) -> str | None:
    """The PNG through benchmarks/plot.py of this checkout (matplotlib, both loaded lazily).

    Returns None when written, else the one-line reason it was not (no checkout, no matplotlib, no data).
    """
    import importlib.util

    root = os.path.abspath(__file__)
    for _ in range(4):  # records.py -> bench -> actions -> h3plan -> the checkout
        root = os.path.dirname(root)
    here = os.path.join(root, "benchmarks", "plot.py")
    if not os.path.exists(here):
        return f"{here} not found (h3plan installed without its repository): PNG skipped"
    try:
        spec = importlib.util.spec_from_file_location("h3plan_bench_plot", here)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.write_chart(records, path)
    except Exception as exc:  # noqa: BLE001 -- the JSON and markdown are the results; the PNG is a view
        return f"PNG failed: {_one_line(exc)}"


SUMMARY_COLUMNS = (("plan", "<22", cell("plan")), ("S", ">6", cell("S")), ("blk", ">3", cell("blocks")),
                   ("eager ms", ">9", lambda r: _f(r["eager_ms"])), ("best ms", ">9", lambda r: _f(r.get("best_ms"))),
                   ("plan ms", ">9", lambda r: _f(r["plan_ms"])), ("speedup", ">7", lambda r: _f(r["speedup"])),
                   ("vs best", ">7", lambda r: _f(r.get("speedup_vs_best"))),
                   ("attn ms", ">8", lambda r: _f(r["attention_ms"])),
                   ("in-plan", ">7", lambda r: _f(r.get("attention_in_plan_fraction"), "{:.0%}")),
                   ("bitwise", ">7", lambda r: _bitwise(r).strip("*")),
                   ("rel err", ">9", lambda r: _f(r["rel_error"], "{:.2e}")))


def summary_table(records: Sequence[Mapping]) -> str:
    return text_table(SUMMARY_COLUMNS, _sorted(records), lead=3)
