"""Sweeps through Hydra's joblib launcher plugin (separate worker processes): every job writes its
plan and result, and the summary is collected from the sweep directory, not from in-process state."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow  # a joblib launcher sweep in a subprocess (~4 s)
def test_joblib_launcher_sweep(cli, tmp_path):
    sweep = tmp_path / "sweep"
    p = cli("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hardware=sm90,sm107", "recipe=bf16,nvfp4",
            "parallel=u1", f"hydra.sweep.dir={sweep}")
    assert p.returncode == 0, p.stderr
    rows = json.loads((sweep / "summary.json").read_text())
    status = {(r["choices"]["hardware"], r["choices"]["recipe"]): r["status"] for r in rows}
    assert len(rows) == 4 and sorted(r["job"] for r in rows) == [0, 1, 2, 3]
    assert status[("sm90", "nvfp4")].startswith("invalid")
    assert all(v == "ok" for k, v in status.items() if k != ("sm90", "nvfp4"))
    assert (sweep / "summary.csv").exists()
    assert "4 combinations, 3 valid, 1 invalid or failed" in p.stdout


def test_joblib_plugin_is_discovered():
    code = "from hydra.core.plugins import Plugins; from hydra.plugins.launcher import Launcher; " \
           "print([p.__name__ for p in Plugins.instance().discover(Launcher)])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "JoblibLauncher" in out
