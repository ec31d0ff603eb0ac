"""`action=bench bench.target=pipeline` on the CPU with the tiny pipeline: well-formed files, the frames contract.

Times on a CPU are meaningless (host clock; TRITON_INTERPRET unset as for a CPU user, so every fused kernel's
guard refuses the CPU and counts a fallback, which keeps the run fast): this proves the plumbing - the
pipeline build, diffusers' own `pipe(...)` called for every row on one transformer (plans installed and removed,
regional compile switched on and off: `backend=eager` here, dynamo without Inductor's minutes of C++ compiles,
the VAE cast per row and back), forward and wall-clock timing, frames compared, JSON / markdown / PNG. The
config keys `bench.target` / `video` / `bench.pipeline` are passed as a plain dict (run(cfg, plan) reads them
with defaults), so this does not depend on the CLI schema.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIRED = ("run", "video", "S", "gpus", "setting", "label", "vae", "forward_s", "rest_s", "wall_s", "e2e_s",
            "steps_e2e", "speedup_vs_eager", "speedup_vs_best", "speedup_vs_best_fp32", "frames")
# One fresh process per invocation list; each run: composed config -> plain dict + the pipeline keys.
DRIVER = """
import json, sys
from omegaconf import OmegaConf
from h3plan.planning.config import compose
from h3plan.planner import resolve
from h3plan.actions.bench import pipeline
out, *runs = sys.argv[1:]
for spec in runs:
    spec = json.loads(spec)
    c = compose(["model=h3_tiny", "vae=h3_tiny_pipe"] + spec["overrides"])
    plan = resolve(c)
    cfg = OmegaConf.to_container(c, resolve=True, enum_to_str=True)
    cfg.update(video=spec.get("video", "32x32x124"))
    cfg["bench"].update(target="pipeline", out_dir=out, pipeline=spec["pipeline"])
    print("RC", pipeline.run(cfg, plan), flush=True)
"""
FAST = {"compile_backend": "eager", "rounds": 1, "warmup": 0, "steps": 1, "decode_warmup": 0}


def _bench(out_dir, *runs):
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-c", DRIVER, str(out_dir), *map(json.dumps, runs)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def _rows(doc):
    return {(r["setting"], r["vae"], r["label"]): r for r in doc["records"]}


def _check(r):
    for k in REQUIRED:
        assert k in r, k
    assert r["error"] is None and r["device"] == "cpu" and r["timing"] == "host-clock"
    # 110 text rows + 2 x 207 audio latents + 37 latent frames x (32/4/2)^2 patches
    assert r["video"] == "32x32x124" and r["S"] == 110 + 414 + 37 * 16 and r["gpus"] == 1 and r["layers"] == 2
    assert r["steps_e2e"] == 49 and r["num_inference_steps"] == 50 and r["forwards_per_call"] == 1
    assert r["forward_s"] > 0 and r["rest_s"] > 0
    assert math.isclose(r["e2e_s"], 49 * r["forward_s"] + r["rest_s"])
    assert math.isclose(r["wall_s"], r["rest_s"] + sum(r["forwards_s"]))


@pytest.mark.slow
def test_pipeline_bench_times_the_users_call_per_vae_precision(tmp_path):
    """The lossless plan (fp32 VAE, diffusers' default) and the recipe's fp16 decode in one run: eager and best at
    both precisions, each plan bitwise against its same-backend reference, the fp16 decode against fp32 by PSNR."""
    res = _bench(tmp_path, {"overrides": ["levers.attention=sdpa"],
                            "pipeline": dict(FAST, plans=["recipe.vae=fp16 levers.attention=sdpa"])})
    assert res.returncode == 0 and res.stdout.count("RC 0") == 1, res.stdout[-2000:] + res.stderr[-3000:]
    doc = json.loads((tmp_path / "pipeline-cpu.json").read_text())
    assert doc["kind"] == "pipeline-call" and doc["schema_version"] == 2 and len(doc["runs"]) == 1
    rows = _rows(doc)
    assert [(r["setting"], r["vae"]) for r in doc["records"]] == [
        ("eager", "fp32"), ("best", "fp32"), ("reference", "fp32"), ("plan", "fp32"),
        ("eager", "fp16"), ("best", "fp16"), ("reference", "fp16"), ("plan", "fp16")]
    for r in doc["records"]:
        _check(r)
    plan32 = rows[("plan", "fp32", "sm90/bf16/u1 +attention=sdpa")]
    plan16 = rows[("plan", "fp16", "sm90/bf16/u1 +attention=sdpa +vae=fp16")]
    for p in (plan32, plan16):
        assert p["frames"]["bitwise"] is True and p["frames"]["against"].startswith("eager with")
        assert [(c["name"], c["result"]) for c in p["checks"]] == [("bitwise", "PASS")]  # declared: a field
        assert p["counters"].get("modulation.fallback", 0) > 0  # the CPU refused the fused kernels, counted
        e, b, b32 = (next(r for r in doc["records"] if r["setting"] == s and r["vae"] == v)
                     for s, v in (("eager", p["vae"]), ("best", p["vae"]), ("best", "fp32")))
        assert math.isclose(p["speedup_vs_eager"], e["e2e_s"] / p["e2e_s"])
        assert math.isclose(p["speedup_vs_best"], b["e2e_s"] / p["e2e_s"])
        assert math.isclose(p["speedup_vs_best_fp32"], b32["e2e_s"] / p["e2e_s"])
    assert plan32["lossless"] and not plan16["lossless"] and plan16["counters"].get("vae_ops.qk_norm_rope.fallback")
    best = rows[("best", "fp32", next(k[2] for k in rows if k[0] == "best"))]
    assert best["config"].startswith("transformer.compile_repeated_blocks(fullgraph=True, backend='eager')")
    assert best["frames"]["bitwise"] is True  # dynamo with the eager backend runs diffusers' ops as they are
    e16 = next(r for r in doc["records"] if r["setting"] == "eager" and r["vae"] == "fp16")
    assert e16["frames"]["bitwise"] is False
    assert e16["frames"]["psnr_db"] > 40
    assert "fp32 VAE" in e16["frames"]["against"]
    md = (tmp_path / "pipeline-cpu.md").read_text()
    assert "their times are meaningless" in md and "| sm90/bf16/u1 +attention=sdpa +vae=fp16 | fp16 |" in md
    assert "bitwise vs eager with" in md and "autocast anywhere: the VAE decodes in its own dtype" in md
    if pytest.importorskip("matplotlib", reason="PNG needs matplotlib"):
        assert (tmp_path / "pipeline-cpu.png").stat().st_size > 0


@pytest.mark.slow
def test_lossy_plan_reports_psnr_and_a_second_run_appends(tmp_path):
    """An FP8 plan (the CPU emulation still quantises): no bitwise claim, PSNR / SSIM against eager with its own
    fp16 VAE; a second run appends to the same file; two interleaved rounds."""
    fast2 = dict(FAST, rounds=2)
    res = _bench(tmp_path, {"overrides": ["recipe=fp8"], "pipeline": fast2}, {"overrides": ["levers.attention=sdpa"],
                                                                              "pipeline": dict(FAST, best=False)})
    assert res.returncode == 0 and res.stdout.count("RC 0") == 2, res.stdout[-2000:] + res.stderr[-3000:]
    doc = json.loads((tmp_path / "pipeline-cpu.json").read_text())
    assert len(doc["runs"]) == 2
    first = [r for r in doc["records"] if r["run"] == doc["runs"][0]["run"]]
    fp8 = next(r for r in first if r["setting"] == "plan")
    assert fp8["label"] == "sm90/fp8/u1 +vae=fp16" and fp8["vae"] == "fp16" and not fp8["lossless"]
    assert len(fp8["forwards_s"]) == 2  # two rounds, one timed forward each
    assert fp8["frames"]["bitwise"] is None and fp8["frames"]["psnr_db"] > 20 and fp8["frames"]["ssim"] < 1
    assert "fp16 VAE" in fp8["frames"]["against"] and not any(r["setting"] == "reference" for r in first)
    second = [r for r in doc["records"] if r["run"] == doc["runs"][1]["run"]]
    assert [r["setting"] for r in second] == ["eager", "reference", "plan"]


@pytest.mark.slow
def test_each_workflow_gets_its_own_run_with_its_encodes_and_rows(tmp_path):
    """bench.pipeline.workflow=fl2va / ref2va: diffusers' auto blocks with the seeded keyframes / reference, the one
    partition the workflow runs; S counts the conditioning rows (2 keyframes / 1 image reference at the 32 px
    canvas: 16 rows each), the lossless plan bitwise against its reference, its AdaLN tables hit on every forward."""
    runs = [{"overrides": ["levers.attention=sdpa", "levers.adaln_table=on"], "pipeline": dict(FAST, workflow=w)}
            for w in ("fl2va", "ref2va")]
    res = _bench(tmp_path, *runs)
    assert res.returncode == 0 and res.stdout.count("RC 0") == 2, res.stdout[-2000:] + res.stderr[-3000:]
    assert "[transformer_ref] skipped: not loaded" in res.stdout and "[transformer] skipped: not loaded" in res.stdout
    doc = json.loads((tmp_path / "pipeline-cpu.json").read_text())
    t2va_rows = 110 + 414 + 37 * 16
    for run, (workflow, extra) in zip(doc["runs"], (("fl2va", 2 * 16), ("ref2va", 16))):
        recs = [r for r in doc["records"] if r["run"] == run["run"]]
        assert [r["setting"] for r in recs] == ["eager", "best", "reference", "plan"]
        assert {r["workflow"] for r in recs} == {workflow} and {r["S"] for r in recs} == {t2va_rows + extra}
        plan = recs[3]
        assert plan["frames"]["bitwise"] is True and plan["frames"]["against"].startswith("eager with")
        assert plan["counters"].get("adaln_table.fused") == 3 and not plan["counters"].get("adaln_table.fallback")
    md = (tmp_path / "pipeline-cpu.md").read_text()
    assert "ref2va 32x32x124" in md and "fl2va 32x32x124" in md


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
    from h3plan.actions.bench.pipeline import options
    from h3plan.errors import UsageError

    for cfg, msg in (({"bench": {"pipeline": {"steps": 0}}}, "bench.pipeline.steps=0: must be an integer >= 1"),
                     ({"bench": {"pipeline": {"vae": "fp64"}}},
                      "bench.pipeline.vae=fp64: auto or a list of fp32, fp16, bf16"),
                     ({"bench": {"pipeline": {"reference": "yes"}}}, "bench.pipeline.reference=yes: true or false"),
                     ({"video": "768x1344"}, "video='768x1344': expected HEIGHTxWIDTHxFRAMES"),
                     ({"bench": {"pipeline": {"workflow": "i2v"}}},
                      "bench.pipeline.workflow=i2v: one of t2va, fl2va, ref2va")):
        with pytest.raises(UsageError) as e:
            options(cfg)
        assert str(e.value).startswith(msg) and "\n" not in str(e.value)
    o = options({"video": "768x1344x124", "bench": {"out_dir": "x", "pipeline": {"vae": "fp16,fp32,fp16"}}})
    assert (o.video, o.steps, o.rounds, o.warmup, o.text_tokens, o.best, o.vae) == (
        "768x1344x124", 3, 1, 2, 110, True, ("fp16", "fp32"))


def test_warm_decode_latent_makes_the_requests_clip_shapes():
    """The untimed warm-up decode: the fewest latent frames with the same decoder clip lengths as the request."""
    from h3plan.actions.bench.pipeline import clip_lengths, warm_latent_frames

    class V:  # the released VAE's temporal chunking (AutoencoderKLMiniMaxH3: clip_length 17, token_drop 3)
        tokens_chunk_size, token_overlap = 5, 3

        class config:
            token_drop = 3

    assert clip_lengths(V, 37) == {8, 7} and warm_latent_frames(V, 37) < 37
    assert clip_lengths(V, warm_latent_frames(V, 37)) == clip_lengths(V, 37)
    for t in range(1, 70):
        assert clip_lengths(V, warm_latent_frames(V, t)) == clip_lengths(V, t)


def test_cpu_refuses_real_width_with_the_smoke_form():
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    import torch
    from omegaconf import OmegaConf

    from h3plan.actions.bench.pipeline import run
    from h3plan.planning.config import compose
    from h3plan.errors import UsageError
    from h3plan.planner import resolve

    if torch.cuda.is_available():
        pytest.skip("a GPU runs real width")
    c = compose([])
    cfg = OmegaConf.to_container(c, resolve=True, enum_to_str=True)
    with pytest.raises(UsageError) as e:
        run(cfg, resolve(c))
    from h3plan.actions.bench.pipeline import CPU_SMOKE

    assert "needs a CUDA GPU" in str(e.value) and str(e.value).endswith(CPU_SMOKE)


def test_the_cpu_smoke_form_composes_to_the_tiny_request():
    """The hint's command is valid CLI input: it plans, and the pipeline bench reads a 32x32x124 request from it."""
    import shlex

    from h3plan.actions.bench.pipeline import CPU_SMOKE, options
    from h3plan.planning.config import compose
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
    from h3plan.actions.bench.pipeline import CPU_SMOKE

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
    row is recorded as failed and says why (rank 0 writes the files)."""
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           os.path.join(ROOT, "benchmarks", "pipeline.py"), "model=h3_tiny", "vae=h3_tiny_pipe", "parallel=u2",
           "levers.attention=sdpa", "--video", "32x32x124", "--out", str(tmp_path), "--rounds", "1", "--warmup", "0",
           "--decode-warmup", "0", "--compile-backend", "eager", "--cp-backend", "native"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    rows = json.loads((tmp_path / "pipeline-cpu.json").read_text())["records"]
    plan = next(r for r in rows if r["setting"] == "plan")
    assert plan["gpus"] == 2 and plan["label"] == "sm90/bf16/u2 +attention=sdpa" and plan["error"] is None
    assert plan["frames"]["bitwise"] is True and plan["speedup_vs_best"] is None
    best = next(r for r in rows if r["setting"] == "best")
    assert best["error"].startswith("RuntimeError: diffusers' enable_parallelism needs an accelerator")
    assert [r["setting"] for r in rows][-1] == "best"  # context parallelism cannot be undone: last


@pytest.mark.slow
def test_step_cache_row_times_the_whole_call(tmp_path):
    """A step-cache plan's row: one untimed short call, then the whole call of e2e_steps forwards, timed end
    to end; forward_s is the median of the computed forwards only, the overhead check and the computed count are in
    its notes and counters; its plan decodes in fp16 beside the fp32 eager / best anchors (no fp16 rows of their
    own)."""
    over = ["pipeline.num_inference_steps=6", "recipe.vae=fp16", "levers.step_cache=fixed", "levers.attention=sdpa",
            "recipe.cache={psnr_db_min:28,ssim_min:0.93,computed:3,warmup:1,final:1,unmeasured:true}"]
    res = _bench(tmp_path, {"overrides": over, "pipeline": dict(FAST, e2e_steps=5, vae=["fp32"], reference=False)})
    assert res.returncode == 0 and "RC 0" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
    doc = json.loads((tmp_path / "pipeline-cpu.json").read_text())
    rows = {r["setting"]: r for r in doc["records"]}
    assert set(rows) == {"eager", "best", "plan"} and rows["plan"]["vae"] == "fp16"
    p = rows["plan"]
    assert p["label"].endswith("+step_cache=fixed +vae=fp16") and p["steps_e2e"] == 5
    assert len(p["forwards_s"]) == 3 and p["e2e_s"] == p["wall_s"]
    assert p["counters"]["step_cache.computed"] == 3 and p["counters"]["step_cache.skipped"] == 2
    assert any("3 of 5 forwards computed" in n for n in p["notes"])
    assert [(c["name"], c["result"] in ("PASS", "FAIL")) for c in p["checks"]] == [("overhead", True)]
    # every forward of the whole call kept, computed and skipped, with what the cache did with each
    assert len(p["call_forwards_s"]) == 5 and p["call_computed"].count(True) == 3 and p["whole_call"]
    assert sorted(p["forwards_s"]) == sorted(x for x, c in zip(p["call_forwards_s"], p["call_computed"]) if c)
    assert p["speedup_vs_best_fp32"] is not None
    # the plan's own time line against the row: printed in the notes of every plan row
    assert any(n.startswith("predicted: forward") and "against the measured" in n for n in p["notes"]), p["notes"]


@pytest.mark.slow
def test_the_tier_on_a_fixed_schedule_keeps_its_dense_sparse_and_skipped_forwards_apart(tmp_path):
    """benchmarks/pipeline_h200.sh whole-tier-fixed, on the tiny pipeline: the tier with the fixed schedule in place of
    its adaptive policy (policy:null drops it). Its row is labelled apart from the adaptive tier's (its declared
    figures are checked against it alone), the forwards it computes are dense ones and sparse ones, each kind with its
    own median in the overhead check, and every forward of the call is kept, computed and skipped."""
    over = ["tier=quality", "pipeline.num_inference_steps=14", "levers.step_cache=fixed",
            "recipe.sparse.dense_forwards=4",
            "recipe.cache={policy:null,psnr_db_min:28,ssim_min:0.93,computed:8,warmup:1,final:1,unmeasured:true}"]
    res = _bench(tmp_path, {"overrides": over, "pipeline": dict(FAST, e2e_steps=13, vae=["fp16"], reference=False,
                                                                 eager=False, best=False)})
    assert res.returncode == 0 and "RC 0" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
    (p,) = json.loads((tmp_path / "pipeline-cpu.json").read_text())["records"]
    assert p["label"] == "sm90/fp8/u1 tier=quality +step_cache=fixed +vae=fp16" and p["whole_call"]
    c = p["counters"]
    assert (c["step_cache.computed"], c["step_cache.skipped"]) == (8, 5)
    # the first 4 forwards dense (3 of them computed: the fixed schedule skips forward 3), the other 5 computed sparse
    assert (c["sparse_attention.dense"], c["sparse_attention.sparse"]) == (3, 5)
    assert p["call_computed"] == [True, True, True, False, True, False, True, False, True, False, True, False, True]
    assert len(p["call_forwards_s"]) == 13 and len(p["forwards_s"]) == 8
    (check,) = p["checks"]
    assert check["name"] == "overhead" and check["result"] in ("PASS", "FAIL")
    assert re.search(r"\(3 x [0-9.]+ s \+ 5 x [0-9.]+ s \+ rest", check["detail"]), check["detail"]


@pytest.mark.slow
def test_whole_calls_in_separate_runs_meet_each_others_baseline_and_frames(tmp_path):
    """bench.pipeline.whole, the GPU lane's phases in three runs (processes there): the lossless plan alone, diffusers'
    compile with its VAE in fp16 alone, the fp8 plan alone. Every row times a short call, then one whole call of
    e2e_steps forwards end to end (E2E; every forward kept; the extrapolation check PASS or FAIL). The fp8 row takes
    its ratio from the earlier run's compile at its own VAE precision (best_run names it), and its frames meet that
    compile's and the lossless plan's, kept in frames_dir."""
    frames = str(tmp_path / "frames")
    whole = dict(FAST, whole=True, e2e_steps=4, reference=False, frames_dir=frames)
    res = _bench(tmp_path, {"overrides": [], "pipeline": dict(whole, eager=False, best=False, vae=["fp32"])},
                 {"overrides": [], "pipeline": dict(whole, eager=False, plan=False, vae=["fp16"])},
                 {"overrides": ["recipe=fp8"], "pipeline": dict(whole, eager=False, best=False, vae=["fp16"])})
    assert res.returncode == 0 and res.stdout.count("RC 0") == 3, res.stdout[-2000:] + res.stderr[-3000:]
    doc = json.loads((tmp_path / "pipeline-cpu.json").read_text())
    lossless, best, fp8 = ([r for r in doc["records"] if r["run"] == run["run"]] for run in doc["runs"])
    assert [r["setting"] for r in lossless + best + fp8] == ["plan", "best", "plan"]
    for r in lossless + best + fp8:
        assert r["whole_call"] and r["steps_e2e"] == 4 and r["e2e_s"] == r["wall_s"] and len(r["call_forwards_s"]) == 4
        assert r["forwards_s"] == r["call_forwards_s"] and r["forward_s"] == statistics.median(r["forwards_s"])
        assert math.isclose(r["rest_s"], r["e2e_s"] - sum(r["call_forwards_s"]))
        assert r["short_call"]["forwards_per_call"] == 1 and len(r["short_call"]["forwards_s"]) == 1
        (check,) = [c for c in r["checks"] if c["name"] == "extrapolation"]
        assert check["result"] in ("PASS", "FAIL") and check["detail"].startswith("4 x ")
    (p,) = fp8
    assert p["best_run"] == best[0]["run"] and math.isclose(p["speedup_vs_best"], best[0]["e2e_s"] / p["e2e_s"])
    assert p["frames"]["against"].endswith("(fp16 VAE)") and p["frames"]["against"].startswith("diffusers transformer.")
    assert p["frames"]["from"] == f"run {best[0]['run']} (bench.pipeline.frames_dir)" and p["frames"]["bitwise"] is None
    vs = p["frames_vs_lossless"]
    assert vs["against"] == "sm90/bf16/u1 (fp32 VAE)"
    assert vs["from"] == f"run {lossless[0]['run']} (bench.pipeline.frames_dir)"
    assert vs["bitwise"] is False and vs["psnr_db"] > 10
    assert len(os.listdir(frames)) == 3


def test_workflow_pipeline_default_request_is_the_t2va_layouts():
    """diffusers' auto denoise step declares no num_frames default (its branches do): the bench's default request
    reads the t2va branch's, 124 frames, on the pipeline's own 16:9 canvas."""
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    from omegaconf import OmegaConf

    from h3plan.actions.pipeline_build import Request, build_pipeline, default_request, denoiser, workflow_blocks

    cfg = [OmegaConf.load(os.path.join(ROOT, f)).diffusers_config
           for f in ("conf/model/h3_tiny.yaml", "conf/vae/h3_tiny_pipe.yaml")]
    pipe = build_pipeline(*cfg, vae_name="h3_tiny_pipe", layers=1, blocks=workflow_blocks(),
                          partitions=("transformer_ref",))
    assert pipe.transformer is None and denoiser(pipe) is pipe.transformer_ref is denoiser(pipe, "ref2va")
    assert default_request(pipe) == Request(760, 1352, 124)  # 768 x 1344 rounded to the tiny canvas multiple 8


@pytest.mark.slow
@pytest.mark.parametrize("workflow,placement,sets", [("t2va", "offload_after", None), ("fl2va", "host", 1)])
def test_prompt_runs_through_the_seeded_text_encoder(tmp_path, workflow, placement, sets):
    """bench.pipeline.prompt=true: pipe(prompt=...) through diffusers' text encoder step and the tiny seeded Qwen3-VL
    (model.text_encoder_default), placed as the plan says; 110 prompt bytes make the 110 text rows of the
    prompt_embeds run, the plan bitwise against its reference, every row noting the encode; with
    text_encoder_weight_sets, every row records the sharing and says what it leaves out of the peak."""
    res = _bench(tmp_path, {"overrides": ["levers.attention=sdpa", f"memory.text_encoder={placement}"],
                            "pipeline": dict(FAST, prompt=True, workflow=workflow, best=False,
                                             text_encoder_weight_sets=sets)})
    assert res.returncode == 0 and res.stdout.count("RC 0") == 1, res.stdout[-2000:] + res.stderr[-3000:]
    assert f"{placement} (the plan's memory.text_encoder)" in res.stdout + res.stderr
    doc = json.loads((tmp_path / "pipeline-cpu.json").read_text())
    rows = {r["setting"]: r for r in doc["records"]}
    assert [(r["setting"], r["vae"]) for r in doc["records"]] == [
        ("eager", "fp32"), ("reference", "fp32"), ("plan", "fp32")]
    for r in doc["records"]:
        assert (r["error"] is None and r["workflow"] == workflow
                and any(n.startswith("prompt: a 110-byte") for n in r["notes"]))
        assert r["text_encoder_weight_sets"] == sets
        shared = f"its decoder layers share {sets} layers' weights"
        assert any(shared in n for n in r["notes"]) == (sets is not None)
    if workflow == "t2va":  # the prompt's 110 bytes are the 110 text rows of the prompt_embeds form
        _check(rows["eager"])
    assert rows["plan"]["frames"]["bitwise"] is True and rows["reference"]["frames"]["bitwise"] is True
    # the rest of the call in parts: one encode of the prompt, the keyframes' VAE encodes (fl2va), one decode
    for r in doc["records"]:
        parts = r["rest_parts"]
        assert set(parts) == {"text_encoder", "vae_encode", "vae_decode"} and parts["text_encoder"] > 0
        assert parts["vae_decode"] > 0 and (parts["vae_encode"] > 0) == (workflow == "fl2va")
        assert sum(parts.values()) <= r["rest_s"]
    note = next(n for n in rows["plan"]["notes"] if n.startswith("rest: "))
    assert "text encoder" in note and "(planned " in note and "everything else" in note


def test_weight_sets_need_a_prompt_and_a_count():
    """bench.pipeline.text_encoder_weight_sets builds no conditioner by itself: without prompt=true, or not a
    positive integer, one line naming the key."""
    from h3plan.actions.bench.pipeline import options
    from h3plan.errors import UsageError

    with pytest.raises(UsageError, match=r"^bench.pipeline.text_encoder_weight_sets=2: only with "
                                         r"bench.pipeline.prompt=true"):
        options({"bench": {"pipeline": {"text_encoder_weight_sets": 2}}})
    for bad in (0, "two", True):
        with pytest.raises(UsageError, match=rf"^bench.pipeline.text_encoder_weight_sets={bad}: must be null or an "
                                             r"integer >= 1$"):
            options({"bench": {"pipeline": {"text_encoder_weight_sets": bad, "prompt": True}}})
    opts = options({"bench": {"pipeline": {"text_encoder_weight_sets": 2, "prompt": True}}})
    assert opts.text_encoder_weight_sets == 2


def test_prompt_needs_a_placed_text_encoder():
    """A plan that places no conditioner (memory.text_encoder=auto without model.path: prompt_embeds given) cannot
    run a prompt: one line naming the setting to add."""
    from h3plan import resolve_config
    from h3plan.actions.bench.pipeline import conditioner_setting
    from h3plan.errors import UsageError

    with pytest.raises(UsageError, match=r"^bench.pipeline.prompt=true: the plan places no text encoder "
                                         r".*memory.text_encoder="):
        conditioner_setting(resolve_config(model="h3_tiny", vae="h3_tiny_pipe"))
    assert conditioner_setting(resolve_config(model="h3_tiny", vae="h3_tiny_pipe",
                                              **{"memory.text_encoder": "host"})) == "host"


def test_a_run_that_fails_in_setup_records_each_row_failed(tmp_path, monkeypatch):
    """A run that fails before its pipeline exists (the tier's fl2va on the H200 ran out of device memory building
    it) writes one record per row it would have run, each with the error: the rows a check was declared for read
    "failed" in the results, not "not run". The run still returns 1."""
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    from omegaconf import OmegaConf

    from h3plan.actions.bench import pipeline
    from h3plan.planner import resolve
    from h3plan.planning.config import compose

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 250.00 MiB")

    monkeypatch.setattr(pipeline, "build_pipeline", out_of_memory)
    c = compose(["model=h3_tiny", "vae=h3_tiny_pipe", "levers.attention=sdpa"])
    plan = resolve(c)
    cfg = OmegaConf.to_container(c, resolve=True, enum_to_str=True)
    cfg.update(video="32x32x124")
    cfg["bench"].update(target="pipeline", out_dir=str(tmp_path), tag="cpu",
                        pipeline=dict(FAST, whole=True, plans=["levers.attention=sdpa recipe.vae=fp16"]))
    assert pipeline.run(cfg, plan) == 1
    doc = json.loads((tmp_path / "pipeline-cpu.json").read_text())
    specs = pipeline.row_specs([plan] + pipeline.extra_plans(cfg, pipeline.options(cfg, plan)),
                               pipeline.options(cfg, plan), 1)
    assert [(r["setting"], r["vae"]) for r in doc["records"]] == [(k, v) for k, v, _ in specs]
    labels = {r["setting"]: r["label"] for r in doc["records"] if r["vae"] == "fp32"}
    assert labels["eager"] == "diffusers eager" and labels["best"].startswith("diffusers transformer.compile")
    assert labels["reference"] == f"eager with {labels['plan']}'s attention"
    for r in doc["records"]:
        assert r["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 250.00 MiB", r["error"]
        assert r["e2e_s"] is None and r["video"] == "32x32x124" and r["whole_call"] and r["S"] > 0
    plans = [r for r in doc["records"] if r["setting"] == "plan"]
    assert all(r["request"] is not None and "recipe_overrides" in r for r in plans)
    md = (tmp_path / "pipeline-cpu.md").read_text()
    assert md.count("failed: RuntimeError: CUDA out of memory") == len(doc["records"])
