"""The command line through a subprocess: printing, formats, out=, errors, sweeps, search path,
and the no-torch guard."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from h3plan.planner import Plan

REPO = Path(__file__).resolve().parents[2]


def test_quick_start_prints_the_plan_fast_and_writes_nothing(cli):
    p = cli("hardware=sm107", "recipe=nvfp4", "parallel=u8")
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    out = p.stdout
    for lever in ("gemm_quant", "attention", "fp8_scales", "vae_ops"):
        assert lever in out
    assert len(out.splitlines()) <= 50  # the summary, read in a minute
    assert "untested h3plan has never run on sm107" in out
    from h3plan import resolve_config
    from h3plan.levers import not_installed

    for d in resolve_config(hardware="sm107", recipe="nvfp4", parallel="u8").decisions:
        assert (f"kernel   {d.lever}={d.setting} has no kernel yet: install skips it" in out) == bool(not_installed(d))
    assert "detail=full" in out
    assert os.listdir(cli.cwd) == []  # no outputs/, no .hydra/, no log file
    assert p.wall < 5.0, p.wall  # generous for a loaded 2-core CI machine; ~0.6 s here
    full = cli("hardware=sm107", "recipe=nvfp4", "parallel=u8", "detail=full").stdout
    for key in ("a2a_bytes_per_block_per_rank", "int64_indexing_required", "docs/sources.md#trtllm-seed"):
        assert key in full and key not in out
    assert "never run on sm107 hardware" in full


def test_json_and_out_round_trip(cli):
    p = cli("hardware=sm90", "recipe=fp8", "parallel=u4", "format=json", "out=plan.yaml")
    assert p.returncode == 0, p.stderr
    printed = Plan.from_json(p.stdout)
    assert Plan.load(str(cli.cwd / "plan.yaml")) == printed
    assert printed.decision("attention").setting == "cudnn_fp8"
    assert sorted(os.listdir(cli.cwd)) == ["plan.yaml"]


def test_yaml_format(cli):
    p = cli("hardware=sm107", "recipe=bf16", "parallel=u4", "parallel.seq_len=104076", "format=yaml")
    assert p.returncode == 0, p.stderr
    plan = Plan.from_yaml(p.stdout)
    assert (plan.decision("attention").setting, plan.decision("fa4_2cta").setting) == ("fa4", "on")
    assert (plan.derived_value("seq_len"), plan.decision("ulysses_overlap").setting) == (104076, "on")


def _one_error_line(p):
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("h3plan: error: "), p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    return lines[0]


@pytest.mark.slow  # CLI subprocesses (~2 s)
def test_bad_input_exits_2_with_one_line(cli):
    assert "parallel.ulysses=3" in _one_error_line(cli("parallel.ulysses=3"))
    assert ("parallel.ulysess: unknown key (did you mean parallel.ulysses?); allowed: name, ulysses, ring, seq_len"
            in _one_error_line(cli("parallel.ulysess=3")))
    assert "levers.gemm_quant=dequant_bf16" in _one_error_line(cli("hardware=sm90", "recipe=nvfp4"))
    assert os.listdir(cli.cwd) == []


@pytest.mark.slow  # three CLI subprocesses (~4 s)
def test_user_search_path_hardware_and_malformed_yaml(cli, tmp_path_factory):
    conf = tmp_path_factory.mktemp("userconf")
    (conf / "hardware").mkdir()
    (conf / "hardware" / "h100.yaml").write_text(textwrap.dedent("""\
        defaults:
          - sm90
          - _self_
        name: h100
        products: [H100]
        device: {memory_gb: 80, hbm_tbps: 3.35, source: "NVIDIA H100 SXM datasheet"}
        """))
    (conf / "hardware" / "broken.yaml").write_text("name: broken\nproducts: [H100\n")
    sp = f"hydra.searchpath=[file://{conf}]"
    # without the AdaLN tables the released model with the VAE resident does not fit 80 GB: the plan says so and
    # names what fits; with them (auto) it fits
    refused = _one_error_line(cli("hardware=h100", sp, "levers.adaln_table=off"))
    assert refused.startswith("h3plan: error: the plan does not fit one h100 GPU: peak ")
    assert "nearest fit: levers.adaln_table=on" in refused
    p = cli("hardware=h100", sp, "format=json")
    assert p.returncode == 0, p.stderr
    hw = json.loads(p.stdout)["config"]["hardware"]
    # name: h100 over sm90's measured and verified facts, none of its own: they stay sm90's (direct.inherited_name)
    assert (hw["option"], hw["name"]) == ("h100", "sm90")
    assert (hw["device"]["memory_gb"], hw["device"]["sm_count"]) == (80.0, 132)
    assert "malformed YAML in " in _one_error_line(cli("hardware=broken", sp))


@pytest.mark.slow  # a subprocess sweep (~4 s)
def test_sweep_summary_and_plans(cli):
    p = cli("-m", "hardware=sm90,sm107", "recipe=bf16,nvfp4", "hydra.sweep.dir=sweep")
    assert p.returncode == 0, p.stderr
    sweep = cli.cwd / "sweep"
    rows = json.loads((sweep / "summary.json").read_text())
    assert [r["status"] for r in rows] == ["ok", "invalid", "ok", "ok"]
    assert rows[1]["choices"]["recipe"] == "nvfp4" and "dequant_bf16" in rows[1]["reason"]
    csv_lines = (sweep / "summary.csv").read_text().splitlines()
    assert len(csv_lines) == 5 and csv_lines[0].startswith("job,combination,hardware")
    assert Plan.load(str(sweep / "3" / "plan.yaml")).decision("attention").setting == "cudnn_fp8"
    assert len(re.findall(r"hardware=sm90 recipe=nvfp4 parallel=u1 +invalid: levers.gemm_quant=auto", p.stdout)) == 1
    assert "4 combinations, 3 valid, 1 invalid or failed" in p.stdout
    assert sorted(os.listdir(cli.cwd)) == ["sweep"]


@pytest.mark.slow  # a subprocess sweep (~4 s)
def test_strict_sweep_exits_nonzero(cli):
    p = cli("-m", "hardware=sm90", "recipe=bf16,nvfp4", "strict=true", "hydra.sweep.dir=sweep")
    assert p.returncode == 1
    assert p.stderr.strip().startswith("h3plan: strict=true: 1 of 2 combinations are invalid")
    ok = cli("-m", "hardware=sm90", "recipe=bf16,fp8", "strict=true", "hydra.sweep.dir=sweep2")
    assert ok.returncode == 0, ok.stderr


def test_planning_imports_no_torch():
    code = ("import sys, h3plan.cli, h3plan.planner, h3plan.levers, h3plan.sweep\n"
            "from h3plan.cli import run\n"
            "rc = run(['hardware=sm107', 'recipe=nvfp4', 'parallel=u8', 'format=json'])\n"
            "assert rc == 0, rc\n"
            "bad = [m for m in ('torch', 'triton', 'diffusers', 'numpy') if m in sys.modules]\n"
            "assert not bad, bad\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def _into_a_closed_pipe(cwd, *args) -> tuple[int, str]:
    """`python -m h3plan ARGS | head -0`, deterministic: the reader's end is closed before the plan is written."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("HYDRA_FULL_ERROR", None)
    p = subprocess.Popen([sys.executable, "-m", "h3plan", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    return p.wait(timeout=120), err


@pytest.mark.parametrize("args", [(), ("detail=full",), ("format=json",), ("--help",)],
                         ids=["plan", "full", "json", "help"])
def test_a_closed_pipe_ends_quietly_with_0(tmp_path, args):
    assert _into_a_closed_pipe(tmp_path, *args) == (0, "")


@pytest.mark.slow  # a subprocess sweep (~4 s)
def test_a_sweep_into_a_closed_pipe_ends_quietly_with_0(tmp_path):
    assert _into_a_closed_pipe(tmp_path, "-m", "recipe=bf16,fp8", f"hydra.sweep.dir={tmp_path}/sweep") == (0, "")
    assert (tmp_path / "sweep" / "summary.json").is_file()
