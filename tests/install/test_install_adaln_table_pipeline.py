"""adaln_table inside diffusers' own t2va denoise loop (tiny MiniMaxH3ModularPipeline, CPU): every timestep vector
the pipeline passes is a table hit, and the latents are bitwise those of the same pipeline without tables."""

import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")

import h3plan  # noqa: E402
from h3plan.install import adaln_table as A  # noqa: E402
from h3plan.runtime.counters import counters, reset_counters  # noqa: E402

from install_helpers import ROOT  # noqa: E402
from test_install_adaln_table import REG, SPEC, table_plan  # noqa: E402


@pytest.fixture(scope="module")
def pipe():
    from h3plan.actions.pipeline_build import build_pipeline

    cfg = lambda name: OmegaConf.load(ROOT / name).diffusers_config  # noqa: E731
    return build_pipeline(cfg("conf/model/h3_tiny.yaml"), cfg("conf/vae/h3_tiny_pipe.yaml"), vae_name="h3_tiny_pipe")


def _denoise(pipe, steps):
    from h3plan.actions.pipeline_build import prompt_inputs, run_block

    seen = []
    hook = pipe.transformer.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["timestep"].clone()),
                                                      with_kwargs=True)
    try:
        st = run_block(pipe, "denoise", **prompt_inputs(pipe, 6), height=32, width=32, num_frames=124,
                       num_inference_steps=steps, generator=torch.Generator("cpu").manual_seed(0))
    finally:
        hook.remove()
    return st.get("latents"), st.get("audio_latents"), seen


@pytest.mark.parametrize("planned,asked", [(4, 4), (50, 4)], ids=["planned-steps", "prepared-steps"])
def test_pipeline_calls_hit_the_table_and_keep_the_bits(pipe, planned, asked):
    want_v, want_a, _ = _denoise(pipe, asked)
    h3plan.install(pipe, table_plan(steps=(planned,), others={}), registry=REG)
    try:
        if planned != asked:
            assert h3plan.prepare(pipe, num_inference_steps=asked) > 0
        tables = A.tables_of(pipe.transformer)
        reset_counters()
        got_v, got_a, seen = _denoise(pipe, asked)
        c = counters()
        assert (len(seen) == asked - 1 and c.get("adaln_table.fused") == 3 * len(seen)
                and not c.get("adaln_table.fallback")), c
        assert {tuple(t.tolist()) for t in seen} <= set(tables.vectors)
        assert {tuple(t.tolist()) for t in seen} == {tuple(v.tolist()) for v in A.timestep_vectors([asked], **SPEC)}
        assert torch.equal(got_v, want_v) and torch.equal(got_a, want_a)
    finally:
        h3plan.uninstall(pipe)
