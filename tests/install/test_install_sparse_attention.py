"""sparse_attention installed on the tiny model (CPU: the router in Triton's interpreter, attention through the torch
reference of the block mask, since FA4 needs a GPU; the dense calls through diffusers' attention).

Contract: a dense forward (the first `dense_forwards` of a generation, or a timestep vector the plan does not know) and
keep = 1.0 are rtol=0, atol=0 the plan without the lever (the processor runs exactly its dense path); a sparse forward
runs the router and the mask on every block (counted, with the reason it ran the torch reference), and differs from
the dense output; the hook finds the target-video rows (the trailing video run at the last row's timestep) on the
device; uninstall removes the hook by name. The gloo pair: Ulysses degree 2 (the router on each rank's heads after
the exchange, the query rows padded or not) against degree 1 within 2^-8 (one bf16 rounding of the attention output
through two blocks), while the dense output lies further off than that.
"""

import json
import os
import tempfile

import pytest
import torch
from gloo_spawn import spawn

import sparse_attention_worker as W
from install_helpers import forward, tiny_model

from h3plan.install import counters, fallback_reasons, reset_counters, uninstall
from h3plan.runtime.levers.sparse_attention import HOOK, STATE, SparseState, calls
from h3plan.planner import make_plan

S = 300  # 8 text + 40 audio + 252 video rows: query blocks 2..9 of 32 rows are pure video


def _out(keep=0.5, index=3, sparse=True):
    from h3plan.facts.decision import make_decision

    ds = W.sparse_decisions(keep=keep) if sparse else [make_decision("attention", "fa4", True, ["t"])]
    model = tiny_model()
    out, c = W.run(model, make_plan({}, {}, ds), W.registry(), W.inputs(S, index))
    return model, out, c, fallback_reasons()


@pytest.fixture(scope="module")
def dense3():
    return _out(sparse=False)[1]


@pytest.mark.slow
def test_dense_forwards_and_keep_all_are_the_plan_without_it(dense3):
    for keep, index in ((0.5, 1), (1.0, 3)):
        model, out, c, _ = _out(keep=keep, index=index)
        ref = dense3 if index == 3 else _out(sparse=False, index=index)[1]
        for a, b in zip(out, ref):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert "sparse_attention.fused" not in c and "sparse_attention.fallback" not in c, c
        assert c["sparse_attention.dense"] == 1 and "sparse_attention.sparse" not in c, c
        assert model.__dict__[STATE].active is False


@pytest.mark.slow
def test_sparse_forward_runs_the_mask_on_every_block(dense3):
    model, out, c, reasons = _out()
    assert c["sparse_attention.sparse"] == 1 and c["sparse_attention.fallback"] == 2, c  # two blocks
    assert "attention.fallback" not in c and "attention.fused" not in c, c  # no dense call
    (why,) = reasons["sparse_attention"]
    assert "FA4 block-sparse needs a CUDA device" in why and "torch reference of the same mask" in why
    gap = max(float((a.float() - b.float()).abs().max()) for a, b in zip(out, dense3))
    assert gap > 1e-2, "the routed rows attend fewer keys than dense"
    assert all(torch.isfinite(a).all() for a in out)
    st = model.__dict__[STATE]
    assert int(st.video_start) == 48 and st.active is False  # cleared after the call
    reg = model._diffusers_hook
    assert reg.get_hook(HOOK) is not None
    uninstall(model)
    assert getattr(model, "_diffusers_hook", None) is None and STATE not in model.__dict__


@pytest.mark.slow
def test_unplanned_timestep_runs_dense_counted(dense3):
    model = tiny_model()
    W.run(model, make_plan({}, {}, W.sparse_decisions()), W.registry(), W.inputs(S, 3))
    x = W.inputs(S, 3)
    x["timestep"] = x["timestep"] + 1e-3
    reset_counters()
    forward(model, x)
    c = counters()
    assert c["sparse_attention.fallback"] == 1 and "sparse_attention.sparse" not in c, c
    assert "not in the planned schedules" in next(iter(fallback_reasons()["sparse_attention"]))


def test_boundary_is_the_trailing_target_video_run():
    st = SparseState({"keep": 0.25, "dense_forwards": 1, "block_q": 128, "block_k": 128, "video_only": True}, {})
    # [text 3 | condition video 4 (own timestep) | audio 2 | target video 5]
    tags = torch.tensor([1, 1, 0] + [0] * 4 + [2] * 2 + [0] * 5)  # a text row tagged video (a vision block) too
    tidx = torch.tensor([0, 0, 0] + [2] * 4 + [1] * 2 + [0] * 5)
    assert int(st.boundary(tags, tidx)) == 9
    buf = st.video_start
    # without audio the text rows bound the run; the buffer is the same tensor (a compiled block sees one input)
    assert int(st.boundary(torch.tensor([1, 1, 0, 0, 0]), torch.zeros(5, dtype=torch.long))) == 2
    assert st.video_start is buf
    assert int(st.boundary(torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long))) == 0


def test_calls_lists_each_generation():
    st = SparseState({"keep": 0.25, "dense_forwards": 2, "block_q": 128, "block_k": 128, "video_only": True}, {})
    for i in range(5):
        st.place(i, 5)
    assert st.history == [{"forwards": 5, "dense": 2, "sparse": 3}]
    assert calls(tiny_model()) == []


@pytest.mark.slow
@pytest.mark.parametrize("S_", [300, 301])  # 301: the last shard padded (query rows past S)
def test_ulysses_pair_matches_degree_1(S_):
    outdir = tempfile.mkdtemp(prefix="h3plan_sparse_u2_")
    spawn(W.worker, 2, outdir, S_, timeout_s=600)
    for rank in (0, 1):
        with open(os.path.join(outdir, f"rank{rank}.json")) as f:
            r = json.load(f)
        assert r["padding"] == ("padded" if S_ % 2 else "none")
        c = r["counters"]
        assert c["sparse_attention.fallback"] == 2 and c["sparse_attention.sparse"] == 1, c
        assert r["max_abs"] <= 2**-8 * 4 and r["dense_gap"] > 4 * max(r["max_abs"], 2**-8), r


@pytest.mark.slow
def test_regional_compile_runs_the_sparse_forward_without_recompiling():
    """diffusers' compile_repeated_blocks (fullgraph, aot_eager): the router and FA4 (or its reference) are one opaque
    op, `video_start` one persistent buffer; sparse forward after sparse forward compiles once and keeps the bits."""
    import torch._dynamo

    model = tiny_model()
    W.run(model, make_plan({}, {}, W.sparse_decisions()), W.registry(), W.inputs(S, 3))
    x = W.inputs(S, 3)
    ref = forward(model, x)
    torch._dynamo.reset()
    try:
        model.compile_repeated_blocks(fullgraph=True, backend="aot_eager")
        with torch._dynamo.config.patch(error_on_recompile=True):
            for i in (3, 4, 3):
                reset_counters()
                out = forward(model, W.inputs(S, i))
                assert counters()["sparse_attention.fallback"] == 2
                if i == 3:
                    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    finally:
        torch._dynamo.reset()


def test_verify_prints_the_error_per_keep_and_checks_the_router(capsys):
    from h3plan.actions.verify import Report
    from h3plan.actions.verify_sparse_attention import check

    (d,) = [x for x in W.sparse_decisions() if x.lever == "sparse_attention"]
    rep = Report()
    check(tiny_model(), W.inputs(S, 3), d, rep)
    ((name, ok, verdict),) = rep.results
    assert ok and name == "sparse_attention=block_sparse"
    assert "not a quality claim" in verdict and "router kernels keep the reference's blocks" in verdict
    assert all(f"keep {k}:" in verdict for k in ("0.5", "0.25", "0.1"))
    rep = Report()
    check(tiny_model(), W.inputs(60, 3), d, rep)  # 60 rows, video from 48: no query block of 32 is all video
    assert "nothing to route" in rep.results[0][2]
