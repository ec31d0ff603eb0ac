"""The quality tier's block-sparse attention on the workflows with condition rows (fl2va's keyframes, ref2va's image
reference through the transformer_ref partition), installed into the tiny MiniMaxH3ModularPipeline holding both
partitions (CPU), through diffusers' own `pipe(...)`.

Contract, on the first sparse forward's first attention call (its q, k, v and the boundary the hook found, taken as
the pipeline ran them): the call ran block-sparse; run again at keep 0.25 and at keep 0.5, every query row before the
target video (text, the keyframes' or reference's condition rows, audio) is rtol=0, atol=0 the same at both keeps
(those rows attend every key block: dense), while the target-video rows differ (each keep drops other blocks)."""

import pytest
import torch

pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")

import h3plan  # noqa: E402
from h3plan.install import counters, reset_counters, uninstall  # noqa: E402
from h3plan.install.processor import H3PlanAttnProcessor  # noqa: E402
from test_install_step_cache import EAGER  # noqa: E402
from test_pipeline_workflows import SIZE, _pipe  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 3  # 2 forwards: the first dense, the second sparse (the call stops after it)
BLOCK = 32
PRESET = {"fl2va": {"video.task": "fl2va", "video.keyframes": ["first", "last"]},
          "ref2va": {"video": "ref2va_768x1344_5s"}}


class _Stop(Exception):
    pass


def _plan(workflow: str):
    """The tier on the bf16 recipe (the CPU has no FP8 GEMMs), the fused elementwise kernels off (the Triton
    interpreter is slow and they are other tests' business), FA4 as the attention the sparse lever needs (the CPU runs
    its sparse calls through the mask's reference), 32-row blocks for the tiny sequence."""
    return h3plan.resolve_config(
        tier="quality", model="h3_tiny", vae="h3_tiny_pipe",
        **{"recipe": "bf16", "video.num_inference_steps": STEPS, **EAGER, "levers.attention": "fa4",
           "levers.sparse_attention": "block_sparse", "recipe.sparse.keep": 0.25, "recipe.sparse.dense_forwards": 1,
           "hardware.fa4.block_sparse": [BLOCK, BLOCK], **PRESET[workflow]})


@pytest.fixture(scope="module")
def pipe():
    return _pipe()


@pytest.mark.parametrize("workflow", ["fl2va", "ref2va"])
def test_condition_rows_stay_dense_under_the_tier(pipe, workflow, monkeypatch):
    from h3plan.actions.pipeline_build import prompt_inputs, workflow_inputs

    plan = _plan(workflow)
    assert plan.decision("sparse_attention").setting == "block_sparse"
    taken, ran = [], []
    run = H3PlanAttnProcessor._taken

    def spy(self, q, k, v, out):
        if not taken:
            taken.append((q.clone(), k.clone(), v.clone(), self.override.video_start.clone()))
        o = run(self, q, k, v, out)
        if len(ran) < 1 and o is not None:
            ran.append(o.clone())
        return o

    monkeypatch.setattr(H3PlanAttnProcessor, "_taken", spy)
    model = pipe.transformer_ref if workflow == "ref2va" else pipe.transformer
    uninstall(pipe)
    h3plan.install(pipe, plan, num_inference_steps=STEPS)
    forwards = []

    def stop(_module, _args, _out):
        forwards.append(1)
        if len(forwards) == STEPS - 1:
            raise _Stop

    handle = model.register_forward_hook(stop)
    reset_counters()
    try:
        pipe(**prompt_inputs(pipe, 4, seed=0), **workflow_inputs(pipe, workflow, SIZE, SIZE, seed=1), height=SIZE,
             width=SIZE, num_frames=124, num_inference_steps=STEPS, output_type="pt", output="videos",
             generator=torch.Generator("cpu").manual_seed(0))
    except _Stop:
        pass
    finally:
        handle.remove()
        uninstall(pipe)
    c = dict(counters())
    assert (c.get("sparse_attention.dense"), c.get("sparse_attention.sparse")) == (1, 1), c
    q, k, v, start = taken[0]
    s = int(start.item())
    assert 0 < s < q.shape[1], (s, q.shape)
    o25, o50 = (torch.ops.h3plan.sparse_attention(q, k, v, start, keep, BLOCK, BLOCK, True, False)
                for keep in (0.25, 0.5))
    assert torch.equal(o25, ran[0])  # the call as the pipeline ran it
    assert torch.equal(o25[:, :s], o50[:, :s])  # text, conditions and audio: every key block, at any keep
    assert not torch.equal(o25[:, s:], o50[:, s:])  # the target video's rows: blocks dropped
