"""The quality tier's block-sparse attention on the workflows with condition rows (fl2va's keyframes, ref2va's image
reference through the transformer_ref partition), installed into the tiny MiniMaxH3ModularPipeline holding both
partitions (CPU), through diffusers' own `pipe(...)`.

Contract, on the first sparse forward's first block: the attention output of every query row before the target
video (text, the keyframes' or reference's condition rows, audio) is rtol=0, atol=0 the same at keep 0.25 and at keep
0.5 (both attend every key block there: dense rows), while the target-video rows differ (each keep drops other
blocks); the boundary the hook found is the same in both and leaves rows before it."""

import pytest
import torch

pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")

import h3plan  # noqa: E402
from h3plan.install import counters, reset_counters, uninstall  # noqa: E402
from h3plan.install.sparse_attention import STATE  # noqa: E402
from test_pipeline_workflows import SIZE, _pipe  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 3  # 2 forwards: the first dense, the second sparse
PRESET = {"fl2va": {"video.task": "fl2va", "video.keyframes": ["first", "last"]},
          "ref2va": {"video": "ref2va_768x1344_5s"}}


def _plan(workflow: str, keep: float):
    return h3plan.resolve_config(
        tier="quality", model="h3_tiny", vae="h3_tiny_pipe",
        **{"recipe": "bf16", "video.num_inference_steps": STEPS, "levers.attention": "fa4", "levers.vae_graphs": "off",
           "levers.sparse_attention": "block_sparse", "recipe.sparse.keep": keep, "recipe.sparse.dense_forwards": 1,
           "hardware.fa4.block_sparse": [32, 32], **PRESET[workflow]})


def _first_sparse_attention(pipe, workflow: str, keep: float):
    """The first block's attention output on the second forward (the first sparse one), the boundary the sparse
    hook found, the counters and the call's video."""
    from h3plan.actions.pipeline_build import prompt_inputs, workflow_inputs

    model = pipe.transformer_ref if workflow == "ref2va" else pipe.transformer
    uninstall(pipe)
    h3plan.install(pipe, _plan(workflow, keep), num_inference_steps=STEPS)
    seen = []
    handle = model.transformer_blocks[0].attn.register_forward_hook(
        lambda _m, _a, out: seen.append((out[0] if isinstance(out, tuple) else out).detach().clone()))
    reset_counters()
    try:
        media = workflow_inputs(pipe, workflow, SIZE, SIZE, seed=1)
        video = pipe(**prompt_inputs(pipe, 4, seed=0), **media, height=SIZE, width=SIZE, num_frames=124,
                     num_inference_steps=STEPS, output_type="pt", output="videos",
                     generator=torch.Generator("cpu").manual_seed(0))
    finally:
        handle.remove()
    start = int(model.__dict__[STATE].video_start.item())
    c = dict(counters())
    uninstall(pipe)
    return seen[1], start, c, video


@pytest.fixture(scope="module")
def pipe():
    return _pipe()


@pytest.mark.parametrize("workflow", ["fl2va", "ref2va"])
def test_condition_rows_stay_dense_under_the_tier(pipe, workflow):
    plan = _plan(workflow, 0.25)
    assert plan.decision("sparse_attention").setting == "block_sparse"
    sparse, start, c, video = _first_sparse_attention(pipe, workflow, 0.25)
    other, start_other, _, _ = _first_sparse_attention(pipe, workflow, 0.5)
    assert start == start_other and 0 < start < sparse.shape[1]
    assert c.get("sparse_attention.sparse") == STEPS - 2 and c.get("sparse_attention.dense") == 1, c
    assert torch.isfinite(video).all()
    assert torch.equal(sparse[:, :start], other[:, :start])  # text, conditions and audio: every block, at any keep
    assert not torch.equal(sparse[:, start:], other[:, start:])  # the target video's rows: blocks dropped
