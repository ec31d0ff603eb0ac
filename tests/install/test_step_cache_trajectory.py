"""What a skipped forward returns, on a real trajectory: diffusers' own denoise loop of the tiny
MiniMaxH3ModularPipeline (CPU), whose latents and timesteps change every step, with the plan installed. Every
transformer call's inputs and outputs, and the first and last blocks' tensors, are recorded by module hooks; each
skipped forward's output must be, bit for bit (rtol=0, atol=0, video and audio), what its mode defines:
- fixed: the last computed forward's velocity;
- taylor: the first-order extrapolation in forward index from the last two computed velocities (where one only:
  the last);
- first_block (threshold above 0): diffusers' forward with the blocks after the first replaced by the cached residual
  (last block out - first block out of the last computed forward) added to the first block's output; and which
  forwards skip follows Cache-DiT's statistic on the first block's residual, sum |r - r_prev| / sum |r_prev| against
  the last computed forward's.
Each test also checks the skipped forwards differ from what diffusers computes uncached there, so a cache that
computes anyway (or returns zeros, or a stale or missing residual) fails.
"""

import pytest
import torch

pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")

import h3plan  # noqa: E402
from h3plan.install import uninstall  # noqa: E402
from h3plan.runtime.levers.step_cache import STATE  # noqa: E402
from h3plan.levers.step_cache import computed_mask  # noqa: E402
from test_install_pipeline import _cfg  # noqa: E402
from test_install_step_cache import EAGER  # noqa: E402

pytestmark = pytest.mark.slow


def _pipe():
    from h3plan.actions.pipeline_build import build_pipeline

    return build_pipeline(_cfg("conf/model/h3_tiny.yaml"), _cfg("conf/vae/h3_tiny_pipe.yaml"), vae_name="h3_tiny_pipe",
                          layers=2, vae_dtype=torch.float32)


def _plan(setting, steps, **cache):
    return h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe", **EAGER, **{
        "video.num_inference_steps": steps, "levers.step_cache": setting,
        "recipe.cache": {"psnr_db_min": 28.0, "ssim_min": 0.93, "unmeasured": True, **cache}})


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


class Trace:
    """Per transformer call: its kwargs and outputs; per first-block call: its input and output; per last-block call:
    its output (keyed by the call's forward index)."""

    def __init__(self, t):
        self.kwargs, self.outs, self.first, self.last = [], [], {}, {}
        blocks = t.transformer_blocks
        self.handles = [
            t.register_forward_pre_hook(lambda m, a, kw: self.kwargs.append(_clone(kw)), with_kwargs=True),
            t.register_forward_hook(lambda m, a, out: self.outs.append(_clone(tuple(out)))),
            blocks[0].register_forward_hook(lambda m, a, out: self.first.__setitem__(len(self.kwargs) - 1,
                                                                                      (_clone(a[0]), _clone(out)))),
            blocks[-1].register_forward_hook(lambda m, a, out: self.last.__setitem__(len(self.kwargs) - 1,
                                                                                     _clone(out))),
        ]

    def remove(self):
        for h in self.handles:
            h.remove()


def _trajectory(pipe, plan, steps):
    """Install `plan`, run diffusers' denoise loop once; (trace, what each forward did)."""
    from h3plan.actions.pipeline_build import prompt_inputs, run_block

    h3plan.install(pipe, plan)
    trace = Trace(pipe.transformer)
    try:
        run_block(pipe, "denoise", **prompt_inputs(pipe, 4, seed=0), height=32, width=32, num_frames=124,
                  num_inference_steps=steps, generator=torch.Generator("cpu").manual_seed(0))
        done = list(pipe.transformer.__dict__[STATE].done)
    finally:
        trace.remove()
        uninstall(pipe)
    assert len(trace.outs) == steps - 1 == len(done)
    return trace, done


def _uncached(pipe, kwargs):
    """diffusers' own forward (nothing installed) on one recorded call's inputs."""
    with torch.no_grad():
        return tuple(pipe.transformer(**kwargs))


def _equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def pipe():
    return _pipe()


@pytest.mark.parametrize("setting,computed", [("fixed", 3), ("taylor", 3), ("taylor", 2)])
def test_fixed_and_taylor_skipped_forwards_return_what_the_mode_defines(pipe, setting, computed):
    steps = 6  # 5 forwards; 3 computed: 11001 (taylor extrapolates from two), 2 computed: 10001 (one kept: reuse)
    mask = computed_mask(5, computed, 1, 1)
    trace, done = _trajectory(pipe, _plan(setting, steps, computed=computed, warmup=1, final=1), steps)
    assert done == list(mask) and not all(mask)
    kept = []
    for i, out in enumerate(trace.outs):
        if mask[i]:
            kept = (kept + [(i, out)])[-2:]
            continue
        (i1, v1) = kept[-1]
        if setting == "taylor" and len(kept) == 2:
            (i0, v0) = kept[0]
            w = (i - i1) / (i1 - i0)
            want = tuple((b.float() + w * (b.float() - a.float())).to(b.dtype) for a, b in zip(v0, v1))
            assert not _equal(want, v1)  # an extrapolation, not a reuse
        else:
            want = v1
        assert _equal(out, want), f"forward {i}"
        assert not _equal(out, _uncached(pipe, trace.kwargs[i])), f"forward {i} computed anyway"
        assert all(x.abs().max() > 0 for x in out)


class _AddResidual(torch.nn.Module):
    def __init__(self, r):
        super().__init__()
        self.r = r

    def forward(self, h, *args):
        return h + self.r


def _relative(r, prev):
    sums = torch.stack([(r.float() - prev.float()).abs().sum(), prev.float().abs().sum()])
    d, base = sums.double().tolist()
    return d / base


THRESHOLD, WARMUP, FINAL, MAX_SKIP = 0.04, 1, 1, 2


def test_first_block_skipped_forwards_add_the_cached_residual(pipe):
    steps = 11  # 10 forwards
    trace, done = _trajectory(pipe, _plan("first_block", steps, threshold=THRESHOLD, warmup=WARMUP, final=FINAL,
                                          max_skip=MAX_SKIP), steps)
    n = steps - 1
    never = computed_mask(n, 0, WARMUP, FINAL)
    # which forwards skip: Cache-DiT's statistic on the first block's residual (output less input), against the last
    # computed forward's residual; every forward ran the first block
    assert sorted(trace.first) == list(range(n))
    residual = {i: out - h for i, (h, out) in trace.first.items()}
    want, prev, run, by_threshold = [], None, 0, 0
    for i in range(n):
        if never[i] or prev is None or run >= MAX_SKIP:
            skip = False
        else:
            skip = _relative(residual[i], residual[prev]) < THRESHOLD
            by_threshold += not skip
        want.append(not skip)
        run = run + 1 if skip else 0
        prev = prev if skip else i
    assert done == want and not all(done) and by_threshold >= 1, (done, want)
    # what a skipped forward returns: the first block's output plus the last computed forward's cached residual
    t, checked = pipe.transformer, 0
    for i in range(n):
        if done[i]:
            assert i in trace.last
            continue
        assert i not in trace.last  # the other blocks did not run
        j = max(k for k in range(i) if done[k])
        cached = trace.last[j] - trace.first[j][1]
        blocks = t.transformer_blocks
        t.transformer_blocks = torch.nn.ModuleList([blocks[0], _AddResidual(cached)])
        try:
            with torch.no_grad():
                oracle = tuple(t(**trace.kwargs[i]))
        finally:
            t.transformer_blocks = blocks
        assert _equal(trace.outs[i], oracle), f"forward {i}"
        assert not _equal(trace.outs[i], _uncached(pipe, trace.kwargs[i])), f"forward {i} computed anyway"
        earlier = [k for k in range(j) if done[k]]
        if earlier:  # a residual older than the last computed forward's would give another output
            stale = trace.last[earlier[-1]] - trace.first[earlier[-1]][1]
            assert not torch.equal(stale, cached)
        checked += 1
    assert checked >= 1 and any(j > 0 for j in [max(k for k in range(i) if done[k]) for i in range(n) if not done[i]])
