"""`python -m h3plan action=bench` end to end on the CPU with the tiny model: well-formed files.

Timing on a CPU is meaningless (host clock, everything a GPU kernel would do falls back to diffusers'
code): this proves the plumbing only -- model build, install, diffusers' best (regional compile with
Inductor, a few seconds per length on the CPU), inputs capture, interleaved repetitions, correctness columns,
JSON/markdown/PNG, and that a second plan appends to the same JSON.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


COMMON = ["action=bench", "model=h3_tiny", "vae=h3_tiny", "parallel.seq_len=48", "bench.seq_lens=[48]",
          "bench.warmup=0", "bench.iters=1"]
# Two CLI invocations in one fresh process (torch imported once); TRITON_INTERPRET unset, as for a CPU user:
# the fused kernels' guards then refuse the CPU and count fallbacks, so the run stays fast and deterministic.
DRIVER = """
import sys
from h3plan import cli
out, *runs = sys.argv[1:]
for extra in runs:
    rc = cli.run({common!r} + ["bench.out_dir=" + out] + extra.split())
    print("RC", rc, flush=True)
"""


def _bench_twice(out_dir, *runs):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-c", DRIVER.format(common=COMMON), str(out_dir), *runs], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.slow  # a subprocess importing torch (~5 s)
def test_module_entry_point_refuses_ulysses(tmp_path):
    """`python -m h3plan action=bench` reaches the action, which refuses U > 1 in one line (before importing torch)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "h3plan", *COMMON, "parallel=u4", f"bench.out_dir={tmp_path}"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == (
        "h3plan: error: parallel.ulysses=4: action=bench times one device; use parallel=u1")
    assert not list(tmp_path.iterdir())


def test_cpu_refuses_gpu_lengths_with_the_smoke_form(tmp_path, capsys):
    """`action=bench model=h3_tiny` alone would time 19,000 and 37,820 rows on the CPU for many minutes: refused in
    one line that ends with the smoke form, before any file is written."""
    import torch

    from h3plan import cli
    from h3plan.actions.bench.measure import CPU_SMOKE

    if torch.cuda.is_available():
        pytest.skip("a GPU runs the default lengths")
    assert cli.run(["action=bench", "model=h3_tiny", f"bench.out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("h3plan: error: bench.seq_lens=[19000, 37820]: at most 1,024 rows on the CPU (the defaults are GPU "
                   f"lengths, minutes to hours here): the smoke form is {CPU_SMOKE}")
    assert not list(tmp_path.iterdir())


def test_results_go_to_a_run_folder_of_their_own():
    """No bench.out_dir: outputs/<date>/<time> (Hydra's run-folder layout), never the shared ./benchmarks/results."""
    from h3plan.actions.bench import options

    cfg = {"bench": {"seq_lens": [48], "blocks": [1], "warmup": 0, "iters": 1, "out_dir": None, "tag": None}}
    parts = options(cfg).out_dir.split(os.sep)
    assert parts[0] == "outputs" and len(parts) == 3 and len(parts[1]) == 10 and len(parts[2]) == 8
    cfg["bench"]["out_dir"] = "somewhere"
    assert options(cfg).out_dir == "somewhere"


@pytest.mark.slow
def test_the_cpu_smoke_form_runs(tmp_path):
    """The refusal's command as a user types it, in an empty folder: exit 0, files under outputs/<date>/<time>."""
    import shlex

    from h3plan.actions.bench.measure import CPU_SMOKE

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, *shlex.split(CPU_SMOKE)[1:]], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (path,) = tmp_path.glob("outputs/*/*/block-cpu.json")
    assert [rec["S"] for rec in json.loads(path.read_text())["records"]] == [64]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]


def test_bench_refuses_bad_options_with_one_line(tmp_path, capsys):
    from h3plan import cli

    assert cli.run(COMMON + ["bench.iters=0", f"bench.out_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err.strip() == "h3plan: error: bench.iters=0: must be an integer >= 1"
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # two subprocess bench runs
def test_bench_on_cpu_writes_well_formed_files_and_appends(tmp_path):
    res = _bench_twice(tmp_path, "bench.blocks=[1,2]", "bench.blocks=[1] recipe=fp8")
    assert res.returncode == 0 and res.stdout.count("RC 0") == 2, res.stdout[-1500:] + res.stderr[-2000:]
    assert "host clock on the CPU; these times mean nothing" in res.stdout
    doc = json.loads((tmp_path / "block-cpu.json").read_text())
    assert [(r["plan"], r["S"], r["blocks"]) for r in doc["records"]] == [
        ("sm90/bf16/u1", 48, 1), ("sm90/bf16/u1", 48, 2), ("sm90/fp8/u1", 48, 1)]
    assert [r["plan"] for r in doc["runs"]] == ["sm90/bf16/u1", "sm90/fp8/u1"]
    for r in doc["records"]:
        assert r["timing"] == "host-clock" and r["error"] is None and r["device"] == "cpu"
        assert r["eager_ms"] > 0 and r["plan_ms"] > 0 and r["speedup"] == r["eager_ms"] / r["plan_ms"]
        assert r["attention_ms"] is None  # neither FA4 nor cuDNN runs on a CPU
        assert r["attention_default_ms"] > 0 and r["attention_shape"] == [1, 48, 4, 32]
        assert r["counters"].get("attention.fallback", 0) > 0 and r["attention_in_plan_ms"] is None
        assert r["attention_after_forward_ms"] is None and r["attention_in_plan_fraction_matched"] is None
        # diffusers' best (bench.best defaults on): timed in the same rounds, its compile apart
        assert r["best_config"].startswith("model.compile_repeated_blocks(fullgraph=True, dynamic=False)")
        assert r["best_error"] is None and 0 < r["best_ms"] < math.inf and r["best_ms_range"][0] <= r["best_ms"]
        assert r["speedup_vs_best"] == r["best_ms"] / r["plan_ms"] and math.isfinite(r["best_first_call_s"])
        # Inductor fuses and reorders the bf16 block: not eager's bits, but within bf16 rounding of a few ops
        assert 0 < r["best_rel_error"] < 2 ** -6 and r["best_max_abs_error"] > 0
    bf16, fp8 = doc["records"][0], doc["records"][2]
    # every fused path refuses the CPU (no interpreter), so the bf16 plan is diffusers' own code: rtol=0, atol=0
    assert bf16["attention_backend"] == "fa4" and bf16["bitwise_equal"] is True and bf16["rel_error"] == 0.0
    assert fp8["attention_backend"] == "cudnn_fp8" and fp8["bitwise_equal"] is None and fp8["lossless"] is False
    # the FP8 GEMMs' CPU emulation still quantises: e4m3 keeps 3 mantissa bits, <= 2^-4 relative per element
    assert 0 < fp8["rel_error"] < 2 ** -4 and fp8["counters"].get("gemm_quant.fallback", 0) > 0
    md = (tmp_path / "block-cpu.md").read_text()
    assert "their times are meaningless" in md
    assert "| sm90/bf16/u1 | 48 | 2 |" in md
    assert "| sm90/fp8/u1 | 48 | 1 |" in md
    assert "| best ms | plan ms | speedup | vs best |" in md and "## diffusers' best setting" in md
    assert "vs best" in res.stdout  # the printed summary
    png = tmp_path / "block-cpu.png"
    if importlib.util.find_spec("matplotlib") is not None:
        assert png.read_bytes()[:4] == b"\x89PNG"
    else:
        assert not png.exists() and "matplotlib is not installed" in res.stdout


@pytest.mark.slow
def test_bench_times_a_cpu_backend_standalone_and_after_a_forward(tmp_path):
    """SDPA runs on the CPU, so the standalone columns are filled: back to back and after a plan forward."""
    res = _bench_twice(tmp_path, "bench.blocks=[1] levers.attention=sdpa bench.best=off")
    assert res.returncode == 0 and res.stdout.count("RC 0") == 1, res.stdout[-1500:] + res.stderr[-2000:]
    (r,) = json.loads((tmp_path / "block-cpu.json").read_text())["records"]
    assert r["best_config"] == "not run (bench.best=off)" and r["best_ms"] is None and r["speedup_vs_best"] is None
    assert r["best_first_call_s"] is None and r["best_rel_error"] is None
    assert r["attention_backend"] == "sdpa" and r["counters"]["attention.fused"] > 0
    for key in ("attention_in_plan_ms", "attention_standalone_ms", "attention_after_forward_ms"):
        assert r[key] > 0, key
    assert r["attention_in_plan_fraction"] == r["attention_standalone_ms"] / r["attention_in_plan_ms"]
    assert r["attention_in_plan_fraction_matched"] == r["attention_after_forward_ms"] / r["attention_in_plan_ms"]


@pytest.mark.slow  # a whole in-process bench run (~10 s on two cores)
def test_a_failing_best_compile_is_recorded_and_eager_and_the_plan_still_run(tmp_path, monkeypatch):
    """diffusers' best is a peer, not the subject: its failure is one line in the record, exit 0, no best_ms."""
    import copy

    import torch

    from h3plan import cli
    from h3plan.actions.bench import measure
    from h3plan.actions.bench.diffusers_best import regional_compile

    def no_compiler(gm, example_inputs):
        raise RuntimeError("no C++ compiler on this host")

    def broken(copy_mod, eager, lengths):
        best = copy.deepcopy(eager)
        regional_compile(best, backend=no_compiler)
        return best, "regional compile with a backend that fails"

    monkeypatch.setattr(measure, "_best_model", broken)
    try:
        assert cli.run(COMMON + ["bench.blocks=[1]", f"bench.out_dir={tmp_path}"]) == 0
    finally:
        torch._dynamo.reset()
    (r,) = json.loads((tmp_path / "block-cpu.json").read_text())["records"]
    assert r["error"] is None and r["eager_ms"] > 0 and r["plan_ms"] > 0
    assert r["best_ms"] is None and r["speedup_vs_best"] is None and r["best_first_call_s"] is None
    assert "no C++ compiler on this host" in r["best_error"] and "\n" not in r["best_error"]
    md = (tmp_path / "block-cpu.md").read_text()
    assert "| 48 | 1 | failed: " in md and "no C++ compiler" in md
