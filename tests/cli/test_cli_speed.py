"""The cold plan stays fast: a plain plan composes without Hydra (planning/direct.py), one through Hydra's runner
composes once (Hydra 1.3 on its own composes twice: once to read hydra.mode, once to run), the schema stored once
per process, and no torch on the plan path.
Wall-clock numbers: `python benchmarks/plan_speed.py`."""

import contextlib
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
    # through Hydra's runner (a hydra.* override) one composition; a plain plan composes without Hydra (direct.py)
    calls = _count_compositions(monkeypatch)
    get_mode = Hydra.get_mode
    assert cli.run(["hardware=sm90", "recipe=bf16", "parallel=u1", "hydra.job.chdir=false"]) == 0
    assert "gemm_quant" in capsys.readouterr().out
    assert len(calls) == 1, calls
    assert Hydra.get_mode is get_mode  # the shortcut is undone after the run
    assert cli.run(["hardware=sm90", "recipe=bf16", "parallel=u1"]) == 0
    assert "gemm_quant" in capsys.readouterr().out
    assert len(calls) == 1, calls


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


@pytest.mark.parametrize("argv", [["hardware=sm90", "recipe=bf16", "parallel=u1"],
                                  ["hardware=sm107", "recipe=nvfp4", "parallel=u8"]])
def test_the_plan_path_imports_no_torch_nor_numpy(argv):
    # the summary asks levers without an install option for their skip reason: still torch-free; and a plain plan
    # composes without Hydra (planning/direct.py), so Hydra is not imported either
    code = ("import sys, io, contextlib\n"
            "from h3plan.cli import run\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert run({argv!r}) == 0\n"
            "print(sorted(m for m in ('torch', 'triton', 'diffusers', 'numpy', 'hydra') if m in sys.modules))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_a_plain_plan_skips_hydras_job_runner(monkeypatch, capsys):
    import hydra._internal.utils as hydra_utils

    def refuse(**kwargs):
        raise AssertionError("a plain plan ran Hydra's job runner")

    monkeypatch.setattr(hydra_utils, "_run_hydra", refuse)
    assert cli.run(["hardware=sm90", "recipe=bf16", "parallel=u1"]) == 0
    assert "gemm_quant" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["recipe=bogus"], ["levers.attention=cudnn_fp8"], ["video.height=720"], ["nope=1"]])
def test_the_shortcut_fails_with_the_runners_line(argv, capsys):
    # a hydra.* override takes Hydra's runner: both routes print the same line and exit code
    assert cli.run(argv) == cli.run([*argv, "hydra.job.chdir=false"]) == 2
    err = capsys.readouterr().err.splitlines()
    # its `this works` repeats argv
    assert len(err) == 2 and err[0] == err[1].replace(" hydra.job.chdir=false", ""), err


def test_libyaml_composes_the_same_config(monkeypatch):
    from omegaconf import OmegaConf

    from h3plan.planning import config

    overrides = ["hardware=sm90", "recipe=fp8", "parallel=u2", "video=t2v_768x1344_10s"]
    fast = OmegaConf.to_container(config.compose(overrides))
    monkeypatch.setattr(config, "libyaml", contextlib.nullcontext)
    assert OmegaConf.to_container(config.compose(overrides)) == fast


def test_libyaml_parses_as_omegaconf_does(monkeypatch):
    import omegaconf._utils as utils
    import yaml

    from h3plan.planning import config

    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml: OmegaConf's own loader runs")
    text = "a: 1e3\nb: 2024-01-01\nc: .5\nd: on\n"
    pure = yaml.load(text, Loader=utils.get_yaml_loader())
    used = []
    original = config.libyaml
    monkeypatch.setattr(config, "libyaml", lambda: used.append(1) or original())
    with original():
        loader = utils.get_yaml_loader()
        assert issubclass(loader, yaml.cyaml.CParser)
        assert yaml.load(text, Loader=loader) == pure  # omegaconf's float resolver, no timestamps
        with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key a"):
            yaml.load("a: 1\na: 2\n", Loader=loader)
    assert not issubclass(utils.get_yaml_loader(), yaml.cyaml.CParser)  # restored
    config.compose(["hardware=sm90"])
    assert used == [1]
