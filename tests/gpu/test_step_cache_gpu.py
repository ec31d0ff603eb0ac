"""H200: step_cache at real width (4 blocks + heads), issue 33. Each plan runs one generation of 49 forwards of one
packed input at rising timestep pairs (h3plan/actions/verify_step_cache.pairs), cached and uncached:
- fixed computing all 49 forwards, and first_block at threshold 0: bitwise the plan without the cache, every forward;
- fixed computing 34 of 49 (bf16 and fp8 plans): the computed forwards bitwise the uncached ones, 15 skipped, counted;
- regional torch.compile (inductor) over the cached bf16 plan: a second generation without a recompile, same bits.

    . /tmp/h3site/env.sh && python -m pytest tests/gpu/test_step_cache_gpu.py -m gpu -q -rA -s
"""

import pytest
import torch
import torch._dynamo

from h3plan.actions.verify_step_cache import pairs
from h3plan.levers.step_cache import computed_mask

pytestmark = pytest.mark.gpu
BLOCKS, S, N = 4, 4096, 49
BUDGET = {"psnr_db_min": 28.0, "ssim_min": 0.93, "unmeasured": True}  # seeded weights: no evidence applies


@pytest.fixture(scope="module")
def setup():
    from omegaconf import OmegaConf

    from h3plan.actions.inputs import build_model, packed_inputs
    from h3plan.planning.config import compose

    dc = OmegaConf.to_container(compose([]).model.diffusers_config)
    return build_model(dc, blocks=BLOCKS, device="cuda", seed=0), packed_inputs(dc, S, seed=0, device="cuda")


def _plan(recipe, setting, **cache):
    import h3plan

    over = {"parallel.seq_len": S, "levers.step_cache": setting}
    if setting != "off":
        over["recipe.cache"] = {**BUDGET, **cache}
    return h3plan.resolve_config(hardware="sm90", recipe=recipe, parallel="u1", **over)


def _generation(model, plan, inputs, compile_=False):
    import h3plan
    from h3plan.install import install, uninstall
    from h3plan.install.step_cache import STATE
    from h3plan.runtime.counters import counters, reset_counters

    vectors = pairs(N, inputs["timestep"])
    install(model, plan)
    try:
        h3plan.prepare(model, timesteps=vectors)
        st = model.__dict__.get(STATE)
        if st is not None:
            st.index = {v.cpu().numpy().tobytes(): (i, N) for i, v in enumerate(vectors)}
        if compile_:
            model.compile_repeated_blocks(fullgraph=True)
        runs = []
        for _ in range(2 if compile_ else 1):
            reset_counters()
            with torch.no_grad():
                outs = [model(**{**inputs, "timestep": v}) for v in vectors]
            runs.append(([(o.sample.clone(), o.audio_sample.clone()) for o in outs], dict(counters())))
        return runs
    finally:
        uninstall(model)
        if compile_:  # the module's model runs uncompiled for the other tests
            for b in model.transformer_blocks:
                b._compiled_call_impl = None


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("setting,cache", [("fixed", {"computed": N}), ("first_block", {"threshold": 0.0})])
def test_every_forward_computed_is_bitwise(setup, setting, cache):
    model, inputs = setup
    (ref, _), = _generation(model, _plan("bf16", "off"), inputs)
    (got, c), = _generation(model, _plan("bf16", setting, **cache), inputs)
    assert all(_same(g, r) for g, r in zip(got, ref))
    assert c["step_cache.computed"] == N and "step_cache.skipped" not in c


@pytest.mark.parametrize("recipe", ["bf16", "fp8"])
def test_34_of_49_computes_its_mask(setup, recipe):
    model, inputs = setup
    plan = _plan(recipe, "fixed", computed=34)
    d = plan.decision("step_cache")
    mask = computed_mask(N, 34, d.param("warmup"), d.param("final"))
    (ref, _), = _generation(model, _plan(recipe, "off"), inputs)
    (got, c), = _generation(model, plan, inputs)
    assert (c["step_cache.computed"], c["step_cache.skipped"], c["step_cache.calls"]) == (34, 15, 1)
    assert all(_same(got[i], ref[i]) for i in range(N) if mask[i])


def test_regional_compile_never_recompiles(setup):
    model, inputs = setup
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        (a, ca), (b, cb) = _generation(model, _plan("bf16", "fixed", computed=34), inputs, compile_=True)
    torch._dynamo.reset()
    assert ca == cb and all(_same(x, y) for x, y in zip(a, b))
