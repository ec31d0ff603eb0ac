"""H200: step_cache at real width (4 blocks + heads). Each plan runs one generation of 49 forwards of one
packed input at rising timestep pairs (h3plan/actions/verify_step_cache.pairs), cached and uncached:
- fixed computing all 49 forwards, and first_block at threshold 0: bitwise the plan without the cache, every forward;
- fixed computing 34 of 49 (bf16 and fp8 plans): the computed forwards bitwise the uncached ones, 15 skipped, counted;
- regional torch.compile (inductor) over the cached bf16 plan: a second generation without a recompile, same bits;
- first_block on the bf16 plan: a skipped forward is the first block's output plus the cached residual, bit for bit.

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
    from h3plan.runtime.levers.step_cache import STATE
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


class _AddResidual(torch.nn.Module):
    def __init__(self, r):
        super().__init__()
        self.r = r

    def forward(self, h, *args):
        return h + self.r


def test_first_block_skips_add_the_cached_residual(setup):
    """first_block on the bf16 plan (fused kernels), warm-up 4, 1 in a row, a threshold every forward passes: each
    skipped forward is, bit for bit, the first block's output plus the last computed forward's residual (the plan
    without the cache, its blocks after the first replaced by that residual), and not the uncached forward."""
    import h3plan
    from h3plan.install import install, uninstall

    model, inputs = setup
    vectors = pairs(N, inputs["timestep"])
    first, last, outs = {}, {}, []
    blocks = model.transformer_blocks
    hooks = [blocks[0].register_forward_hook(lambda m, a, o: first.__setitem__(len(outs), (a[0].clone(), o.clone()))),
             blocks[-1].register_forward_hook(lambda m, a, o: last.__setitem__(len(outs), o.clone()))]
    install(model, _plan("bf16", "first_block", threshold=10.0, warmup=4, final=0, max_skip=1))
    try:
        h3plan.prepare(model, timesteps=vectors)
        from h3plan.runtime.levers.step_cache import STATE

        model.__dict__[STATE].index = {v.cpu().numpy().tobytes(): (i, N) for i, v in enumerate(vectors)}
        with torch.no_grad():
            for v in vectors:
                o = model(**{**inputs, "timestep": v})
                outs.append((o.sample.clone(), o.audio_sample.clone()))
    finally:
        for h in hooks:
            h.remove()
        uninstall(model)
    skipped = [i for i in range(N) if i not in last]
    assert skipped == list(range(4, N, 2))  # every forward it may skip: after the warm-up, one in a row
    install(model, _plan("bf16", "off"))
    try:
        h3plan.prepare(model, timesteps=vectors)
        for i in skipped[:3]:
            j = i - 1
            cached = last[j] - first[j][1]
            model.transformer_blocks = torch.nn.ModuleList([blocks[0], _AddResidual(cached)])
            try:
                with torch.no_grad():
                    o = model(**{**inputs, "timestep": vectors[i]})
            finally:
                model.transformer_blocks = blocks
            assert _same(outs[i], (o.sample, o.audio_sample)), f"forward {i}"
            with torch.no_grad():
                u = model(**{**inputs, "timestep": vectors[i]})
            assert not _same(outs[i], (u.sample, u.audio_sample))
    finally:
        uninstall(model)
