"""`action=bench target=pipeline` on the CPU with the tiny pipeline: well-formed files, the frames contract.

Times on a CPU are meaningless (host clock; TRITON_INTERPRET unset as for a CPU user, so every fused kernel's
guard refuses the CPU and counts a fallback, which keeps the run fast): this proves the plumbing - the
pipeline build, the three settings on one transformer (plan installed and removed, regional compile switched
on and off: `backend=eager` here, dynamo without Inductor's minutes of C++ compiles), step and decode timing,
frames compared, JSON / markdown / PNG. The config keys `target` / `video` / `bench.pipeline` are passed as
a plain dict (run(cfg, plan) reads them with defaults), so this does not depend on the CLI schema.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIRED = ("video", "S", "gpus", "plan", "steps_timed", "steps_e2e", "eager_step_s", "best_step_s", "plan_step_s",
            "eager_decode_s", "best_decode_s", "plan_decode_s", "e2e_speedup_vs_eager", "e2e_speedup_vs_best",
            "best_config", "frames_bitwise", "frames_psnr_db")
# One fresh process per invocation list; each run: composed config -> plain dict + the pipeline keys.
DRIVER = """
import json, sys
from omegaconf import OmegaConf
from h3plan.config import compose
from h3plan.planner import resolve
from h3plan.actions import pipeline_bench
out, *runs = sys.argv[1:]
for spec in runs:
    spec = json.loads(spec)
    c = compose(["model=h3_tiny", "vae=h3_tiny_pipe"] + spec["overrides"])
    plan = resolve(c)
    cfg = OmegaConf.to_container(c, resolve=True, enum_to_str=True)
    cfg.update(target="pipeline", video=spec.get("video", "32x32x124"))
    cfg["bench"].update(out_dir=out, pipeline=spec["pipeline"])
    print("RC", pipeline_bench.run(cfg, plan), flush=True)
"""
FAST = {"compile_backend": "eager", "rounds": 1, "warmup": 0, "steps": 1, "audio": False, "decode_warmup": 0}


def _bench(out_dir, *runs):
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-c", DRIVER, str(out_dir), *map(json.dumps, runs)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _check(r):
    for k in REQUIRED:
        assert k in r, k
    assert r["error"] is None and r["device"] == "cpu" and r["timing"] == "host-clock"
    # 110 text rows + 2 x 207 audio latents + 37 latent frames x (32/4/2)^2 patches
    assert r["video"] == "32x32x124" and r["S"] == 110 + 414 + 37 * 16 and r["gpus"] == 1 and r["layers"] == 2
    assert r["steps_e2e"] == 49 and r["num_inference_steps"] == 50
    for s in ("eager", "best", "plan"):
        assert r[f"{s}_step_s"] > 0 and r[f"{s}_e2e_s"] > 0
    assert r["best_decode_s"] == r["eager_decode_s"] > 0 and r["plan_decode_s"] > 0
    assert math.isclose(r["e2e_speedup_vs_eager"], r["eager_e2e_s"] / r["plan_e2e_s"])
    assert math.isclose(r["e2e_speedup_vs_best"], r["best_e2e_s"] / r["plan_e2e_s"])
    assert r["best_config"].startswith("transformer.compile_repeated_blocks(fullgraph=True, backend='eager')")
    assert r["latents_rel_error"]["best"] == 0.0  # dynamo with the eager backend runs diffusers' ops as they are


def test_pipeline_bench_on_cpu_writes_files_and_lossless_frames_are_bitwise(tmp_path):
    res = _bench(tmp_path, {"overrides": ["levers.attention=sdpa"], "pipeline": FAST})
    assert res.returncode == 0 and res.stdout.count("RC 0") == 1, res.stdout[-2000:] + res.stderr[-3000:]
    doc = json.loads((tmp_path / "pipeline-cpu.json").read_text())
    assert doc["kind"] == "pipeline" and doc["schema_version"] == 1 and len(doc["runs"]) == 1
    (r,) = doc["records"]
    _check(r)
    assert r["plan"] == "sm90/bf16/u1 +attention=sdpa" and r["steps_timed"] == 1 and r["lossless"]
    # the plan's frames against diffusers eager, whose SDPA call is the plan's backend: bit for bit
    assert r["frames_bitwise"] is True and r["frames_psnr_db"] is None and r["frames_ssim"] == 1.0
    assert r["latents_rel_error"]["plan"] == 0.0 and "sdpa" in r["frames_reference"]
    assert r["counters"].get("modulation.fallback", 0) > 0  # the CPU refused the fused kernels, counted
    md = (tmp_path / "pipeline-cpu.md").read_text()
    assert "their times are meaningless" in md and "| sm90/bf16/u1 +attention=sdpa | 32x32x124 | 1116 | 1 | 2 |" in md
    assert "| bitwise |" in md
    if pytest.importorskip("matplotlib", reason="PNG needs matplotlib"):
        assert (tmp_path / "pipeline-cpu.png").stat().st_size > 0


@pytest.mark.slow
def test_lossy_plan_reports_psnr_and_appends_with_audio(tmp_path):
    """An FP8 plan (the CPU emulation still quantises): no bitwise claim, PSNR / SSIM against eager; a second
    plan appends to the same file; audio on; two interleaved rounds; the default attention fa4 runs a
    same-backend reference (on the CPU it falls back to diffusers' processor: bitwise)."""
    fast2 = dict(FAST, rounds=2, audio=True)
    res = _bench(tmp_path, {"overrides": ["recipe=fp8"], "pipeline": fast2}, {"overrides": [], "pipeline": fast2})
    assert res.returncode == 0 and res.stdout.count("RC 0") == 2, res.stdout[-2000:] + res.stderr[-3000:]
    doc = json.loads((tmp_path / "pipeline-cpu.json").read_text())
    fp8, bf16 = doc["records"]
    for r in (fp8, bf16):
        _check(r)
        assert r["steps_timed"] == 2 and r["audio"] and r["audio_decode_s"] > 0
        assert r["eager_e2e_s"] == pytest.approx(r["overhead_s"] + 49 * r["eager_step_s"] + r["eager_decode_s"]
                                                 + r["audio_decode_s"])
    assert fp8["plan"] == "sm90/fp8/u1" and not fp8["lossless"] and fp8["frames_bitwise"] is None
    assert 0 < fp8["latents_rel_error"]["plan"] < 2 ** -4 and fp8["frames_psnr_db"] > 20 and fp8["frames_ssim"] < 1
    assert bf16["plan"] == "sm90/bf16/u1" and bf16["frames_bitwise"] is True
    assert "fa4" in bf16["frames_reference"] and "reference" in bf16["latents_rel_error"]


def test_quality_closed_forms():
    import torch

    from h3plan.actions.quality import compare, psnr, ssim

    a, b = torch.full((2, 3, 16, 16), 0.25), torch.full((2, 3, 16, 16), 0.75)
    # constant images: variances and covariance vanish, SSIM = (2ab + C1) / (a^2 + b^2 + C1), C1 = 0.01^2
    assert ssim(a, b) == pytest.approx((2 * 0.25 * 0.75 + 1e-4) / (0.25 ** 2 + 0.75 ** 2 + 1e-4), rel=1e-12)
    assert psnr(a, b) == pytest.approx(10 * math.log10(1 / 0.25))
    x = torch.rand(3, 3, 20, 24, generator=torch.Generator().manual_seed(0))
    assert compare(x, x) == {"bitwise": True, "psnr_db": None, "ssim": 1.0, "max_abs": 0.0}
    assert ssim(x, x.clone()) == pytest.approx(1.0, abs=1e-12)
    noisy = (x + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))).clamp(0, 1)
    q = compare(noisy, x)
    assert not q["bitwise"] and 0.5 < q["ssim"] < 1 and 20 < q["psnr_db"] < 40


def test_options_refuse_bad_values_in_one_line():
    from h3plan.actions.pipeline_bench import options
    from h3plan.errors import UsageError

    for cfg, msg in (({"bench": {"pipeline": {"steps": 0}}}, "bench.pipeline.steps=0: must be an integer >= 1"),
                     ({"bench": {"pipeline": {"vae": "fp64"}}}, "bench.pipeline.vae=fp64: one of auto, fp16_autocast"),
                     ({"video": "768x1344"}, "video='768x1344': expected HEIGHTxWIDTHxFRAMES")):
        with pytest.raises(UsageError) as e:
            options(cfg)
        assert str(e.value).startswith(msg) and "\n" not in str(e.value)
    o = options({"video": "768x1344x124", "bench": {"out_dir": "x"}})
    assert (o.video, o.steps, o.rounds, o.warmup, o.text_tokens, o.best) == ("768x1344x124", 1, 2, 2, 110, True)


def test_cpu_refuses_real_width_with_the_smoke_form():
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    import torch
    from omegaconf import OmegaConf

    from h3plan.actions.pipeline_bench import run
    from h3plan.config import compose
    from h3plan.errors import UsageError
    from h3plan.planner import resolve

    if torch.cuda.is_available():
        pytest.skip("a GPU runs real width")
    c = compose([])
    cfg = OmegaConf.to_container(c, resolve=True, enum_to_str=True)
    with pytest.raises(UsageError) as e:
        run(cfg, resolve(c))
    from h3plan.actions.pipeline_bench import CPU_SMOKE

    assert "needs a CUDA GPU" in str(e.value) and str(e.value).endswith(CPU_SMOKE)


def test_the_cpu_smoke_form_composes_to_the_tiny_request():
    """The hint's command is valid CLI input: it plans, and the pipeline bench reads a 32x32x124 request from it."""
    import shlex

    from h3plan.actions.pipeline_bench import CPU_SMOKE, options
    from h3plan.config import compose
    from h3plan.planner import resolve

    argv = shlex.split(CPU_SMOKE)
    assert argv[:3] == ["python", "-m", "h3plan"]
    c = compose(argv[3:])
    o = options(c, resolve(c))
    assert (o.video, o.rounds, o.warmup, o.compile_backend) == ("32x32x124", 1, 0, "eager")


@pytest.mark.slow
def test_the_cpu_smoke_form_runs(tmp_path):
    """The hint's command as a user types it, in an empty folder: it runs, and writes under outputs/<date>/<time>
    (no bench.out_dir given), never into ./benchmarks/results."""
    import shlex

    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    from h3plan.actions.pipeline_bench import CPU_SMOKE

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, *shlex.split(CPU_SMOKE)[1:]], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    (path,) = tmp_path.glob("outputs/*/*/pipeline-cpu.json")
    assert json.loads(path.read_text())["records"][0]["video"] == "32x32x124"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outputs"]


@pytest.mark.slow
def test_ulysses_two_ranks_on_gloo(tmp_path):
    """parallel=u2 under torchrun on two CPU processes (gloo): eager on every rank, the plan's Ulysses install over
    the group, the lossless frames bitwise; diffusers' context parallelism needs an accelerator, so the best
    setting is recorded as failed and the record says why (rank 0 writes the files)."""
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           os.path.join(ROOT, "benchmarks", "pipeline.py"), "model=h3_tiny", "vae=h3_tiny_pipe", "parallel=u2",
           "levers.attention=sdpa", "--video", "32x32x124", "--out", str(tmp_path), "--rounds", "1", "--warmup", "0",
           "--decode-warmup", "0", "--no-audio", "--compile-backend", "eager", "--cp-backend", "native"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    (r,) = json.loads((tmp_path / "pipeline-cpu.json").read_text())["records"]
    assert r["gpus"] == 2 and r["plan"] == "sm90/bf16/u2 +attention=sdpa" and r["error"] is None
    assert r["frames_bitwise"] is True and r["latents_rel_error"]["plan"] == 0.0
    assert r["best_step_s"] is None and r["e2e_speedup_vs_best"] is None
    assert r["best_config"].startswith("transformer.set_attention_backend('native') + enable_parallelism(")
    assert any(n.startswith("best failed: RuntimeError: diffusers' enable_parallelism needs an accelerator")
               for n in r["notes"])
