"""The pipeline bench on one GPU at real width, cut to two transformer layers and a small canvas (the full
request is benchmarks/pipeline_h200.sh): every setting runs, the fused transformer paths engage (no guarded
fallback), the lossless plan's frames equal diffusers eager's with the plan's attention backend bit for bit, an
FP8 plan's frames stay close (PSNR / SSIM against eager), and diffusers' regional compile runs as the best setting.
"""

import pytest

pytestmark = pytest.mark.gpu

TRANSFORMER_LEVERS = ("attention", "qk_norm_rope", "modulation", "gated_residual", "swiglu", "gemm_quant")


# the conditioning rows of each workflow's seeded media at 256x448: fl2va two keyframes (8 x 14 patches each);
# ref2va one image reference at the pipeline's 2048 px short edge (2048 x 3584 -> 128 x 224 latents -> 64 x 112)
EXTRA_ROWS = {"t2va": 0, "fl2va": 2 * 8 * 14, "ref2va": 64 * 112}


def _run(tmp_path, recipe, extra=(), workflow="t2va"):
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    import json

    from omegaconf import OmegaConf

    from h3plan.actions.bench.pipeline import run
    from h3plan.planning.config import compose
    from h3plan.planner import resolve

    c = compose(["hardware=sm90", f"recipe={recipe}", *extra])
    cfg = OmegaConf.to_container(c, resolve=True, enum_to_str=True)
    # 110 text + 414 audio rows + 37 frames x 8 x 14 patches = 4,668 tokens
    cfg.update(video="256x448x124")
    cfg["bench"].update(target="pipeline", out_dir=str(tmp_path), tag="gpu-test",
                        pipeline={"layers": 2, "rounds": 1, "warmup": 2, "steps": 1, "workflow": workflow})
    assert run(cfg, resolve(c)) == 0
    rows = json.loads((tmp_path / "pipeline-gpu-test.json").read_text())["records"]
    for r in rows:
        assert r["error"] is None and r["S"] == 4668 + EXTRA_ROWS[workflow] and r["layers"] == 2, r
        assert r["timing"] == "cuda-events" and r["workflow"] == workflow, r
        assert r["forward_s"] > 0 and r["rest_s"] > 0, r
    (plan,) = [r for r in rows if r["setting"] == "plan"]
    fallbacks = {k: v for k, v in plan["counters"].items() if k.endswith(".fallback")}
    assert not fallbacks, fallbacks  # every guarded path of the user's call ran fused (the VAE's too)
    assert plan["counters"].get("vae_graphs.fused", 0) > 0, plan["counters"]
    assert {r["setting"] for r in rows} >= {"eager", "best", "plan"}
    return plan, rows


def test_bf16_plan_frames_bitwise_on_gpu(tmp_path):
    plan, rows = _run(tmp_path, "bf16")
    assert plan["lossless"] and plan["vae"] == "fp32" and plan["frames"]["bitwise"] is True, plan["frames"]
    assert plan["frames"]["against"].startswith("eager with")


@pytest.mark.parametrize("workflow", ["fl2va", "ref2va"])
def test_each_workflow_bf16_plan_frames_bitwise_on_gpu(tmp_path, workflow):
    """fl2va (keyframe encodes) and ref2va (reference encode, transformer_ref with its clean reference rows): the
    lossless plan bitwise, every guarded path fused, the AdaLN tables hit on every forward."""
    plan, rows = _run(tmp_path, "bf16", workflow=workflow)
    assert plan["lossless"] and plan["frames"]["bitwise"] is True, plan["frames"]
    assert plan["counters"].get("adaln_table.fused", 0) > 0, plan["counters"]


def test_fp16_decode_plan_frames_bitwise_on_gpu(tmp_path):
    plan, rows = _run(tmp_path, "bf16", ["recipe.vae=fp16"])
    assert plan["vae"] == "fp16" and plan["frames"]["bitwise"] is True, plan["frames"]
    e16 = next(r for r in rows if r["setting"] == "eager" and r["vae"] == "fp16")
    assert e16["frames"]["psnr_db"] is None or e16["frames"]["psnr_db"] > 40, e16["frames"]  # fp16 vs fp32 decode


def test_fp8_plan_frames_close_on_gpu(tmp_path):
    plan, rows = _run(tmp_path, "fp8")
    assert not plan["lossless"] and plan["frames"]["bitwise"] is None
    # loose: seeded random weights and two steps (noise frames); the recipe budget (34 dB) is for real weights
    assert plan["frames"]["psnr_db"] is None or plan["frames"]["psnr_db"] > 25, plan["frames"]
