"""step_cache under diffusers' regional compile (compile_repeated_blocks, fullgraph, aot_eager): two generations of a
cached plan run without a recompile (recompiles raise), count exactly as uncompiled, and give the uncompiled bits: the
cache's decisions run in the transformer's eager forward, its state lives on the hook, nothing global is guarded."""

import pytest
import torch
import torch._dynamo
from install_helpers import tiny_inputs, tiny_model

import h3plan
from h3plan.actions.verify_step_cache import pairs
from h3plan.runtime.levers.step_cache import STATE
from h3plan.install import install, uninstall
from h3plan.runtime.counters import counters, reset_counters

pytestmark = pytest.mark.slow
EAGER = {"levers.attention": "sdpa", "levers.qk_norm_rope": "eager", "levers.modulation": "eager",
         "levers.gated_residual": "off", "levers.swiglu": "off", "pipeline.num_inference_steps": 6}


def _generation(model, inputs, vectors):
    st = model.__dict__[STATE]
    st.index = {v.numpy().tobytes(): (i, len(vectors)) for i, v in enumerate(vectors)}
    outs = []
    with torch.no_grad():
        for v in vectors:
            o = model(**{**inputs, "timestep": v})
            outs.append((o.sample, o.audio_sample))
    return outs


@pytest.mark.parametrize("setting,cache", [("fixed", {"computed": 3}), ("first_block", {"threshold": 10.0})])
def test_regional_compile_never_recompiles(setting, cache):
    plan = h3plan.resolve_config(model="h3_tiny", **EAGER, **{
        "levers.step_cache": setting,
        "recipe.cache": {"psnr_db_min": 28.0, "ssim_min": 0.93, "warmup": 1, "final": 1, "unmeasured": True, **cache}})
    model, inputs = tiny_model(), tiny_inputs(16)
    vectors = pairs(5, inputs["timestep"])
    install(model, plan)
    h3plan.prepare(model, timesteps=vectors)
    reset_counters()
    ref = _generation(model, inputs, vectors)
    expected = dict(counters())
    assert expected["step_cache.skipped"] >= 1 and expected["step_cache.calls"] == 1
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        model.compile_repeated_blocks(fullgraph=True, backend="aot_eager")
        for _ in range(2):
            reset_counters()
            out = _generation(model, inputs, vectors)
            assert dict(counters()) == expected
            assert all(torch.equal(a, b) for x, y in zip(out, ref) for a, b in zip(x, y))
    torch._dynamo.reset()
    uninstall(model)
