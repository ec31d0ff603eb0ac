"""The quality tier's two lossy schedules in one call: step_cache (first_block) and sparse_attention installed together
into the tiny MiniMaxH3ModularPipeline (CPU), through diffusers' own `pipe(...)`.

Contract: each keeps its own schedule (the cache computes and skips what its statistic says; sparse attention runs
on every attention call of a sparse forward, the first block of a skipped forward included, and dense on the dense
forwards); keep = 1.0 under the cache is rtol=0, atol=0 the cache alone (the sparse lever changes nothing it does not
drop); keep 0.25 differs from it (the lever is not a no-op inside the stack)."""

import pytest
import torch

pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")

import h3plan  # noqa: E402
from h3plan.install import counters, reset_counters, uninstall  # noqa: E402
from h3plan.runtime.levers.step_cache import STATE  # noqa: E402
from test_install_step_cache import EAGER, _call, _pipe  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 7  # 6 forwards
LAYERS = 2


def _plan(keep: float | None):
    """tier=quality on the bf16 recipe (the CPU has no FP8 GEMMs), the cache's knobs shortened to the tiny schedule
    (threshold high: it skips wherever it may), the sparse lever at `keep` (None: off) on 32-row blocks; attention fa4
    in both (the CPU runs its dense calls through diffusers' attention, its sparse ones through the mask's
    reference)."""
    over = {"recipe": "bf16", "video.num_inference_steps": STEPS, **EAGER, "levers.attention": "fa4",
            "levers.step_cache": "first_block",
            "recipe.cache": {"policy": None, "threshold": 1e9, "warmup": 1, "final": 1, "max_skip": 1}}
    if keep is None:
        over["levers.sparse_attention"] = "off"
    else:
        over.update({"levers.sparse_attention": "block_sparse", "recipe.sparse.keep": keep,
                     "recipe.sparse.dense_forwards": 2, "hardware.fa4.block_sparse": [32, 32]})
    return h3plan.resolve_config(tier="quality", model="h3_tiny", vae="h3_tiny_pipe", **over)


def _run(keep):
    pipe = _pipe()
    plan = _plan(keep)
    h3plan.install(pipe, plan)
    reset_counters()
    out = _call(pipe, STEPS)
    c, done = counters(), list(pipe.transformer.__dict__[STATE].done)
    uninstall(pipe)
    return plan, out, c, done


@pytest.fixture(scope="module")
def cache_alone():
    return _run(None)


def test_both_schedules_hold_in_one_call(cache_alone):
    plan, out, c, done = _run(0.25)
    assert plan.decision("sparse_attention").setting == "block_sparse"
    assert done == cache_alone[3] and done.count(False) >= 2  # the cache's own schedule, unchanged by the lever
    skipped_sparse = sum(1 for i, d in enumerate(done) if not d and i >= 2)
    computed_sparse = sum(1 for i, d in enumerate(done) if d and i >= 2)
    # the hook places every forward (skipped ones too: their first block still attends): 2 dense, the rest sparse
    assert (c["sparse_attention.dense"], c["sparse_attention.sparse"]) == (2, len(done) - 2), c
    # every attention call of a computed sparse forward and the first block's of a skipped one ran the mask (on the
    # CPU through its torch reference, counted as the fallback from FA4)
    assert c["sparse_attention.fallback"] == LAYERS * computed_sparse + skipped_sparse, c
    assert c["step_cache.skipped"] == done.count(False)
    assert not torch.equal(out, cache_alone[1])


def test_keep_all_under_the_cache_is_the_cache_alone(cache_alone):
    plan, out, c, done = _run(1.0)
    assert done == cache_alone[3]
    assert torch.equal(out, cache_alone[1])
