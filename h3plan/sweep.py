"""Sweeps (`python -m h3plan -m hardware=sm90,sm107 recipe=bf16,nvfp4 ...`).

Each job resolves its plan and writes plan.yaml (or the reason it is invalid) and result.json into
its own job directory; it never raises, so an invalid combination cannot abort the sweep. The
SweepSummary callback runs once in the launching process after all jobs, reads every result.json
from the sweep directory (files, not process state, so the joblib and submitit launchers work the
same), prints one table and writes summary.json and summary.csv beside the jobs. With strict=true
an invalid or failed combination makes the sweep exit 1 (through `strict_failure`). In a sweep `out` is
ignored (every plan goes to its job directory); `format=json|yaml` prints the summary rows (summary.json's)
in that format on stdout instead of the table, the closing line going to stderr.

A row's `plan` is the plan file's path relative to the sweep directory (`<job dir>/plan.yaml`) in summary.json and
summary.csv alike (a job's own result.json names it relative to the job directory). `peak_gib` is the plan's peak
memory per GPU; `never_ran` the `lever=setting` pairs h3plan never ran on that hardware (the table shows their
count, `all` when every lever is a prediction). The table cuts an invalid row's reason (no parentheses, at most
REASON_ROOM characters); summary.json and summary.csv keep it whole.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from . import planner
from .actions import run_action
from .errors import H3PlanError
from .levers import COLUMNS
from .planning.config import condense
from .planning.schema import LEVER_SETTINGS

GROUPS = ("hardware", "recipe", "parallel", "model", "vae")
KEY_LEVERS = tuple(COLUMNS)  # the levers whose SPEC names a sweep column, in registry order
REASON_ROOM = 100  # an invalid row's reason in the table (the files keep it whole)
WIDTH = 120  # the summary table's width: its columns wrap into bands beyond it


# Set by SweepSummary in the launching process (Hydra turns a callback's exception into a warning);
# h3plan.cli.run reads it for the exit code.
strict_failure: str | None = None


def run_job(cfg, hc) -> dict[str, Any]:
    """One sweep job: plan.yaml + result.json in the job's output dir. Never raises."""
    out = Path(hc.runtime.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rec: dict[str, Any] = {
        "job": int(hc.job.num),
        "overrides": list(hc.overrides.task),
        "choices": {g: hc.runtime.choices.get(g) for g in GROUPS},
    }
    try:
        plan = planner.resolve(cfg)
        (out / "plan.yaml").write_text(plan.to_yaml())
        rec.update(status="ok", plan="plan.yaml", lossless=plan.lossless,
                   decisions={d.lever: d.setting for d in plan.decisions},
                   hardware_verified=all(d.hardware_verified for d in plan.decisions),
                   never_ran=[f"{d.lever}={d.setting}" for d in plan.decisions if not d.hardware_verified],
                   all_never_ran=not any(d.hardware_verified for d in plan.decisions),
                   peak_gib=plan.derived_value("memory_peak_gib_per_gpu"),
                   attention_ms=plan.derived_value("attention_ms_per_block_est"),
                   gemm_ms=plan.derived_value("gemm_ms_per_block_est"))
        if cfg.action.name != "plan":
            rec["action_rc"] = run_action(cfg, plan)
            if rec["action_rc"]:
                rec.update(status="failed", reason=f"action={cfg.action.name} returned {rec['action_rc']}")
    except H3PlanError as e:
        rec.update(status="invalid", reason=str(e))
    except Exception as e:  # noqa: BLE001 - recorded; the sweep goes on
        line, code = condense(e)
        rec.update(status="invalid" if code == 2 else "failed", reason=line)
    (out / "result.json").write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for job_dir in sorted((p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")),
                          key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name)):
        f = job_dir / "result.json"
        if f.exists():
            row = json.loads(f.read_text())
            if row.get("plan"):  # relative to the sweep directory, as summary.csv gives it
                row["plan"] = f"{job_dir.name}/{row['plan']}"
            rows.append(row)
        else:
            rows.append({"job": job_dir.name, "overrides": [], "choices": {}, "status": "failed",
                         "reason": f"no result.json in {job_dir.name} (the job did not finish)"})
    return rows


def _label(row: dict[str, Any], common: frozenset = frozenset()) -> str:
    """hardware/recipe/parallel choices plus the overrides that differ between jobs."""
    ch = row.get("choices") or {}
    base = " ".join(f"{g}={ch[g]}" for g in ("hardware", "recipe", "parallel") if ch.get(g))
    rest = [o for o in row.get("overrides", [])
            if o not in common and o.split("=", 1)[0].lstrip("+~") not in ("hardware", "recipe", "parallel")]
    return " ".join([base] + rest).strip() or str(row.get("job"))


def _cut(reason: str, room: int) -> str:
    """An invalid row's reason for the table: without its parentheses (sources and asides, one level nested), cut
    at a word to `room` characters."""
    text = " ".join(re.sub(r"\s*\((?:[^()]|\([^()]*\))*\)", "", reason).split())
    return text if len(text) <= room else text[: room - 3].rsplit(" ", 1)[0].rstrip(";,:") + "..."


def _common(rows: list[dict[str, Any]]) -> frozenset:
    sets = [set(r.get("overrides", [])) for r in rows]
    return frozenset(set.intersection(*sets)) if sets else frozenset()


def render(rows: list[dict[str, Any]], width: int = WIDTH) -> str:
    """The sweep's table: a row per combination, its key levers and numbers, in bands that fit `width` columns; an
    invalid row's reason cut (the files keep it whole)."""
    head = ["#", "combination", "status"] + [COLUMNS[k] for k in KEY_LEVERS] + [
        "lossless", "attn_ms", "gemm_ms", "peak_gib", "never_ran"]
    table, common = [], _common(rows)
    for r in rows:
        cells = [str(r["job"]), _label(r, common)]
        if r["status"] == "ok":
            d = r["decisions"]
            cells += ["ok"] + [d[k] for k in KEY_LEVERS] + [
                "yes" if r["lossless"] else "no",
                "n/a" if r.get("attention_ms") is None else f"{r['attention_ms']:.1f}",
                "n/a" if r.get("gemm_ms") is None else f"{r['gemm_ms']:.1f}",
                "n/a" if r.get("peak_gib") is None else f"{r['peak_gib']:.1f}",
                "all" if r.get("all_never_ran") else str(len(r.get("never_ran", [])))]
        else:
            cells += [f"{r['status']}: {r.get('reason', '')}"]  # cut to the band's room below
        table.append(cells)
    widths = [max([len(head[i])] + [len(c[i]) for c in table if len(c) > i and not (i == 2 and c[i] != "ok")])
              for i in range(len(head))]
    lines: list[str] = []
    for band in _bands(widths, width):  # the columns that fit `width`, each band led by the job's number
        if lines:
            lines.append("")
        lines.append("  ".join(f"{head[i]:<{widths[i]}}" for i in band).rstrip())
        for c in table:
            if len(c) == len(head):
                lines.append("  ".join(f"{c[i]:<{widths[i]}}" for i in band).rstrip())
            elif band[1] == 1:  # an invalid row: its reason in the first band only, cut to the width
                status, _, reason = c[2].partition(": ")
                room = max(40, min(REASON_ROOM, width - widths[0] - widths[1] - 4 - len(status) - 2))
                lines.append(f"{c[0]:<{widths[0]}}  {c[1]:<{widths[1]}}  {status}: {_cut(reason, room)}")
    n_bad = sum(r["status"] != "ok" for r in rows)
    total = f"{len(rows)} combinations, {len(rows) - n_bad} valid, {n_bad} invalid or failed"
    return "\n".join(lines + [total + (" (whole reasons: summary.csv)" if n_bad else "")]) + "\n"


def _bands(widths: list[int], width: int) -> list[list[int]]:
    """The table's columns in bands of at most `width` characters (two spaces between columns): the first band holds
    the number, the combination and the status, each later band the number again; a column wider than a band has
    one of its own."""
    bands, band = [], [0, 1, 2]
    for i in range(3, len(widths)):
        if sum(widths[j] + 2 for j in band) + widths[i] > width and len(band) > (3 if band[1] == 1 else 1):
            bands.append(band)
            band = [0]
        band.append(i)
    return bands + [band]


def write_summary(sweep_dir: Path, rows: list[dict[str, Any]]) -> None:
    (sweep_dir / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    levers, common = list(LEVER_SETTINGS), _common(rows)
    with open(sweep_dir / "summary.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job", "combination", *GROUPS, "status", "reason", *levers, "lossless", "hardware_verified",
                    "attention_ms_per_block_est", "gemm_ms_per_block_est", "memory_peak_gib_per_gpu",
                    "never_ran", "plan"])
        for r in rows:
            ch, d = r.get("choices") or {}, r.get("decisions") or {}
            w.writerow([r["job"], _label(r, common), *(ch.get(g, "") for g in GROUPS), r["status"], r.get("reason", ""),
                        *(d.get(k, "") for k in levers), r.get("lossless", ""), r.get("hardware_verified", ""),
                        r.get("attention_ms", ""), r.get("gemm_ms", ""), _blank(r.get("peak_gib")),
                        " ".join(r.get("never_ran", [])), r.get("plan", "")])


def _blank(v: Any) -> Any:
    return "" if v is None else v


class SweepSummary(Callback):
    """Hydra callback (conf/config.yaml, hydra.callbacks.sweep_summary): the sweep's one summary."""

    sweep_dir: str | None = None

    def on_multirun_start(self, config, **kwargs: Any) -> None:
        # resolved once, before the launcher resolves it (Hydra caches ${now:} on this config)
        self.sweep_dir = str(config.hydra.sweep.dir)

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        sweep_dir = Path(self.sweep_dir or str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            return
        rows = collect(sweep_dir)
        write_summary(sweep_dir, rows)
        fmt = getattr(config.get("format"), "name", config.get("format")) or "table"
        where = f"plans and summary (summary.json, summary.csv) in {sweep_dir}"
        try:
            if fmt == "json":
                print(json.dumps(rows, indent=1))
                print(where, file=sys.stderr)
            elif fmt == "yaml":
                import yaml

                print(yaml.safe_dump(rows, sort_keys=False, width=120), end="")
                print(where, file=sys.stderr)
            else:
                print(render(rows), end="")
                print(where)
            sys.stdout.flush()
        except BrokenPipeError:  # `-m ... | head`: the reader is gone (the files are written); stdout to /dev/null
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        global strict_failure
        bad = [r for r in rows if r["status"] != "ok"]
        if config.get("strict") and bad:
            strict_failure = (f"strict=true: {len(bad)} of {len(rows)} combinations are invalid or failed "
                              f"(see {sweep_dir / 'summary.csv'})")
