"""The cold plan stays fast: one Hydra composition per plan (Hydra 1.3 on its own composes twice: once to
read hydra.mode, once to run), the schema stored once per process, and no torch on the plan path.
Wall-clock numbers: `python benchmarks/plan_speed.py`."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra._internal.hydra import Hydra

from h3plan import cli
from h3plan.planning import schema
from h3plan.planning.config import CONFIG_NAME, CONFIG_PATH

REPO = Path(__file__).resolve().parents[2]


def _count_compositions(monkeypatch) -> list:
    calls = []
    original = Hydra.compose_config

    def counting(self, *args, **kwargs):
        calls.append(kwargs.get("run_mode"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Hydra, "compose_config", counting)
    return calls


def test_a_plan_composes_the_config_once(monkeypatch, capsys):
    calls = _count_compositions(monkeypatch)
    get_mode = Hydra.get_mode
    assert cli.run(["hardware=sm90", "recipe=bf16", "parallel=u1"]) == 0
    assert "gemm_quant" in capsys.readouterr().out
    assert len(calls) == 1, calls
    assert Hydra.get_mode is get_mode  # the shortcut is undone after the run


def test_the_config_leaves_hydra_mode_unset():
    # The premise of the shortcut: Hydra's get_mode would answer None for h3plan's own config.
    from hydra import compose, initialize_config_dir

    schema.register()
    with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
        cfg = compose(config_name=CONFIG_NAME, overrides=["hardware=sm107"], return_hydra_config=True)
    assert cfg.hydra.mode is None


@pytest.mark.slow  # a Hydra multirun sweep (~2 s)
def test_a_hydra_mode_override_still_sweeps(monkeypatch, capsys, tmp_path):
    calls = _count_compositions(monkeypatch)
    rc = cli.run(["hydra.mode=MULTIRUN", "recipe=bf16,fp8", f"hydra.sweep.dir={tmp_path}"])
    assert rc == 0, capsys.readouterr().err
    assert {"0", "1"} <= set(os.listdir(tmp_path))
    assert len(calls) >= 2  # Hydra's own get_mode ran: an override can set the mode


def test_the_schema_is_stored_once(monkeypatch):
    from hydra.core.config_store import ConfigStore

    schema.register()
    stored = []
    monkeypatch.setattr(ConfigStore, "store", lambda self, **kw: stored.append(kw))
    schema.register()
    assert stored == []


@pytest.mark.parametrize("argv", [["hardware=sm90", "recipe=bf16", "parallel=u1"], ["hardware=sm107", "recipe=nvfp4", "parallel=u8"]])
def test_the_plan_path_imports_no_torch_nor_numpy(argv):
    # the summary asks levers without an install option for their skip reason: still torch-free
    code = ("import sys, io, contextlib\n"
            "from h3plan.cli import run\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert run({argv!r}) == 0\n"
            "print(sorted(m for m in ('torch', 'triton', 'diffusers', 'numpy') if m in sys.modules))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
