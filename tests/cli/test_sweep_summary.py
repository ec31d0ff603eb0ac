"""The sweep summary (h3plan/sweep.py) without launching Hydra: a job's record from run_job, the rows collect()
reads back, summary.json against summary.csv, and the table's columns and cut reasons; and the Slurm launcher
on a machine without Slurm (a usage error, one line)."""

import csv
import json
import shutil
from types import SimpleNamespace

from h3plan import cli, sweep
from h3plan.planning.config import compose


def _job(sweep_dir, num, overrides, choices):
    out = sweep_dir / str(num)
    hc = SimpleNamespace(runtime=SimpleNamespace(output_dir=str(out), choices=choices), job=SimpleNamespace(num=num),
                         overrides=SimpleNamespace(task=overrides))
    return sweep.run_job(compose(overrides), hc)


def _sweep(tmp_path):
    _job(tmp_path, 0, ["hardware=sm90", "recipe=bf16"], {"hardware": "sm90", "recipe": "bf16"})
    _job(tmp_path, 1, ["hardware=sm90", "recipe=nvfp4"], {"hardware": "sm90", "recipe": "nvfp4"})
    _job(tmp_path, 2, ["hardware=sm107", "recipe=bf16"], {"hardware": "sm107", "recipe": "bf16"})
    rows = sweep.collect(tmp_path)
    sweep.write_summary(tmp_path, rows)
    return rows


def test_summary_json_and_csv_name_the_same_plan_file(tmp_path):
    _sweep(tmp_path)
    js = json.loads((tmp_path / "summary.json").read_text())
    with open(tmp_path / "summary.csv", newline="") as f:
        cs = list(csv.DictReader(f))
    assert [r.get("plan", "") for r in js] == [r["plan"] for r in cs] == ["0/plan.yaml", "", "2/plan.yaml"]
    assert all((tmp_path / r["plan"]).is_file() for r in js if r.get("plan"))


def test_memory_peak_and_never_ran_columns(tmp_path):
    rows = _sweep(tmp_path)
    with open(tmp_path / "summary.csv", newline="") as f:
        cs = list(csv.DictReader(f))
    ok90, bad, ok107 = rows
    assert ok90["peak_gib"] > 10 and ok90["never_ran"] == [] and not ok90["all_never_ran"]
    assert ok107["all_never_ran"] and "attention=fa4" in ok107["never_ran"]  # h3plan never ran on sm107
    assert float(cs[0]["memory_peak_gib_per_gpu"]) == ok90["peak_gib"] and cs[0]["never_ran"] == ""
    assert cs[2]["never_ran"].split() == ok107["never_ran"] and cs[1]["memory_peak_gib_per_gpu"] == ""
    head, row90, row107 = sweep.render(rows).split("\n\n")[-1].splitlines()[:3]  # the last band: the numbers
    assert head.split()[-2:] == ["peak_gib", "never_ran"]
    assert row90.split()[-2:] == [f"{ok90['peak_gib']:.1f}", "0"] and row107.split()[-1] == "all"


def test_the_table_fits_120_columns_in_bands_led_by_the_job_number(tmp_path):
    rows = _sweep(tmp_path)
    text = sweep.render(rows)
    assert max(map(len, text.splitlines())) <= 120, text
    bands = text.split("\n\n")
    heads = [b.splitlines()[0].split() for b in bands]
    assert len(bands) > 1 and all(h[0] == "#" for h in heads)
    assert [c for h in heads for c in h[1:]] == sweep.render(rows, width=10_000).splitlines()[0].split()[1:]
    for b in bands[1:]:  # the valid rows again, by number; an invalid row's reason only in the first band
        numbers = [x.split()[0] for x in b.splitlines()[1:] if x[:1].isdigit() and " combinations, " not in x]
        assert numbers == ["0", "2"]


def test_invalid_rows_are_cut_in_the_table_and_whole_in_the_files(tmp_path):
    rows = _sweep(tmp_path)
    reason = rows[1]["reason"]
    assert rows[1]["status"] == "invalid" and "docs/sources.md" in reason and len(reason) > 200
    line = sweep.render(rows).splitlines()[2]
    shown = line.split("invalid: ", 1)[1]
    assert len(shown) <= sweep.REASON_ROOM and shown.endswith("...") and "docs/sources.md" not in shown
    assert shown.startswith("levers.gemm_quant=auto cannot apply: recipe nvfp4 needs nvfp4 GEMMs")
    assert sweep.render(rows).splitlines()[-1].endswith("1 invalid or failed (whole reasons: summary.csv)")
    with open(tmp_path / "summary.csv", newline="") as f:
        assert list(csv.DictReader(f))[1]["reason"] == reason


def test_slurm_launcher_without_slurm_is_a_usage_error(capsys, monkeypatch):
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "srun" else which(name, *a, **k))
    monkeypatch.setattr(cli, "_submitit_installed", lambda: True)  # the plugin installed (pip install -e '.[sweep]')
    assert cli.run(["-m", "hydra/launcher=submitit_slurm", "hydra.launcher.partition=p", "hardware=sm90,sm107"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["h3plan: error: hydra/launcher=submitit_slurm: no Slurm on this machine (srun is not "
                                "on PATH); sweep from a Slurm login node, or here with hydra/launcher=joblib (or "
                                "without hydra/launcher)"], err
