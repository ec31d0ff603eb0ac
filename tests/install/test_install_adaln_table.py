"""adaln_table=on on the tiny model (CPU): keys from diffusers' schedulers, entries bitwise equal to the eager
linears, the counted exact miss, weights changed after install, grad mode, prepare(), the uninstall round trip
and the state dict while installed."""

import copy

import pytest
import torch
from install_helpers import LEVERS, LOSSLESS, forward, plan, tiny_inputs, tiny_model

from h3plan.install import install, uninstall
from h3plan.install import adaln_table as A
from h3plan.levers import REGISTRY
from h3plan.levers import adaln_table as lever
from h3plan.planner import make_plan
from h3plan.facts.decision import make_decision
from h3plan.runtime.counters import counters, fallback_reasons, reset_counters

REG = dict(LEVERS, adaln_table=REGISTRY["adaln_table"].install)
SPEC = dict(video_shift=12.0, audio_shift=3.0, keyframe_noise_aug=0.999, audio=True, condition_video=False,
            condition_audio=False)


def table_plan(steps=(5,), others=None, **spec):
    base = plan(**(LOSSLESS if others is None else others))
    d = make_decision("adaln_table", "on", True, ["test"], params={**SPEC, **spec, "steps": list(steps)})
    return make_plan(dict(base.config), {}, [d, *base.decisions])


def with_timestep(inputs, ts):
    """The tiny inputs with `timestep` = ts (rows' indices folded into its length)."""
    out = dict(inputs)
    out["timestep"] = ts.clone()
    out["timestep_indices"] = inputs["timestep_indices"].clamp(max=ts.numel() - 1)
    return out


@pytest.fixture
def pair():
    """(eager model, tabled copy of it, inputs)."""
    model = tiny_model()
    return model, copy.deepcopy(model), tiny_inputs(16)


# ---- keys ---------------------------------------------------------------------------------------------------

REQUESTS = [dict(steps=[2]), dict(steps=[3]), dict(steps=[10]), dict(steps=[50]), dict(steps=[50, 30]),
            dict(steps=[20], audio=False), dict(steps=[20], condition_video=True),
            dict(steps=[20], condition_audio=True), dict(steps=[12], condition_video=True, condition_audio=True)]


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: "-".join(f"{k}={v}" for k, v in r.items()))
def test_keys_come_from_diffusers_schedulers(req):
    """The installer's vectors are diffusers' MiniMaxH3Scheduler timesteps through the pipeline's own row plan,
    checked here against that plan on a realistic layout (many rows of each kind), and the planner's torch-free
    count agrees."""
    from diffusers import MiniMaxH3Scheduler
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3SetTimestepsStep

    kw = {**SPEC, **{k: v for k, v in req.items() if k != "steps"}}
    got = A.timestep_vectors(req["steps"], **kw)
    cv, ca = 7 * kw["condition_video"], 5 * kw["condition_audio"] if kw["audio"] else 0
    video, audio = torch.arange(10, 60), torch.arange(60, 90 if kw["audio"] else 60)  # text rows 0-9
    want = {}
    for n in req["steps"]:
        v, a = MiniMaxH3Scheduler(shift=12.0), MiniMaxH3Scheduler(shift=3.0)
        v.set_timesteps(n)
        a.set_timesteps(n)
        for t, ta in zip(v.timesteps, a.timesteps):
            ts, idx = MiniMaxH3SetTimestepsStep.build_row_timesteps(video, audio, cv, ca, 10, float(t), float(ta),
                                                                    max(float(t), 0.999), 1.0)
            want.setdefault(ts.numpy().tobytes(), ts)
    assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want.values()))
    assert all(g.dtype == torch.float32 for g in got)
    plan_vs = lever.vectors(req["steps"], 12.0, 3.0, 0.999,
                            **{k: kw[k] for k in ("audio", "condition_video", "condition_audio")})
    assert [len(v) for v in plan_vs] == [g.numel() for g in got]  # the plan's vectors and rows
    assert all(abs(x - y) < 1e-6 for pv, g in zip(plan_vs, got) for x, y in zip(pv, g.tolist()))


def test_default_request_table_size():
    """50 steps of the t2va request: 49 vectors, the first (t = 0 on both schedules) one row, the rest two."""
    vs = A.timestep_vectors([50], **SPEC)
    assert len(vs) == 49 and [v.numel() for v in vs] == [1] + [2] * 48


# ---- entries against eager ---------------------------------------------------------------------------------


def test_every_entry_is_the_eager_linear_bitwise(pair):
    eager, model, inputs = pair
    report = install(model, table_plan(steps=(5, 4, 3)), registry=REG)
    tables = A.tables_of(model)
    # 4 and 5 steps share only the first vector (t = 0); 3 steps' grid (1, 0.5, 0) lies on the 5-step grid
    assert len(tables.vectors) == 4 + 3 - 1 and len(tables.slots) == 3
    assert sum(s.lever == "adaln_table" for s in report.swaps) == 3
    mods = [b.adaln_proj.linear for b in eager.transformer_blocks] + [eager.norm_out.linear]
    with torch.no_grad():
        for ts in A.timestep_vectors([5, 4, 3], **SPEC):
            temb = eager.time_embedder(eager.time_proj(ts))
            key, kid = tables.lookup(temb)
            for slot, lin in zip(tables.slots, mods):
                want = lin(torch.nn.functional.silu(temb).to(lin.weight.dtype))
                got = slot.entries[kid]
                assert got.dtype == want.dtype == torch.bfloat16 and torch.equal(got, want)


# lossless-plan: ~29 s of interpreter
@pytest.mark.parametrize("others", [pytest.param(LOSSLESS, marks=pytest.mark.slow), {}],
                         ids=["lossless-plan", "tables-only"])
def test_forward_at_every_planned_vector_hits_and_is_bitwise(pair, others):
    eager, model, inputs = pair
    install(model, table_plan(steps=(6,), others=others), registry=REG)
    ref_model = copy.deepcopy(eager)
    install(ref_model, plan(**others), registry=LEVERS) if others else None
    for ts in A.timestep_vectors([6], **SPEC):
        x = with_timestep(inputs, ts)
        want = forward(ref_model, x)
        reset_counters()
        got = forward(model, x)
        c = counters()
        assert c.get("adaln_table.fused") == 3 and not c.get("adaln_table.fallback"), c
        assert all(torch.equal(a, b) for a, b in zip(got, want))


# ---- misses ---------------------------------------------------------------------------------------------------


@pytest.mark.slow  # three interpreter forwards of the tiny model (~6 s)
def test_miss_is_counted_exact_and_added(pair):
    eager, model, inputs = pair
    install(model, table_plan(), registry=REG)
    x = with_timestep(inputs, torch.tensor([0.3, 0.7]))  # no 5-step schedule passes it
    want = forward(eager, x)
    reset_counters()
    got = forward(model, x)
    assert counters().get("adaln_table.fallback") == 3 and not counters().get("adaln_table.fused")
    (reason, n), = fallback_reasons()["adaln_table"].items()
    assert n == 3 and reason.startswith("timestep vector not in the table (T=2)") and "streamed" in reason
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    reset_counters()
    again = forward(model, x)  # the miss added the entry
    assert counters().get("adaln_table.fused") == 3 and all(torch.equal(a, b) for a, b in zip(again, want))


@pytest.mark.slow  # interpreter forwards of the tiny model (~5 s)
def test_prepare_adds_step_counts_and_vectors(pair):
    import h3plan

    eager, model, inputs = pair
    with pytest.raises(h3plan.InstallError, match="no h3plan plan is installed"):  # an error, not a silent 0
        h3plan.prepare(model, num_inference_steps=4)
    install(model, table_plan(), registry=REG)
    n = len(A.tables_of(model).vectors)
    assert h3plan.prepare(model, num_inference_steps=[7]) == 4  # 6 vectors; t = 0 and the 0.5 grid point already there
    assert A.tables_of(model).spec["steps"] == [5, 7]
    assert h3plan.prepare(model, timesteps=[torch.tensor([0.25, 0.5])]) == 1
    assert len(A.tables_of(model).vectors) == n + 5
    for ts in (A.timestep_vectors([7], **SPEC)[-1], torch.tensor([0.25, 0.5])):
        x = with_timestep(inputs, ts)
        reset_counters()
        got = forward(model, x)
        assert counters().get("adaln_table.fused") == 3 and not counters().get("adaln_table.fallback")
        assert all(torch.equal(a, b) for a, b in zip(got, forward(eager, x)))
    with pytest.raises(ValueError, match="num_inference_steps"):
        h3plan.prepare(model, num_inference_steps=1)


@pytest.mark.slow  # interpreter forwards of the tiny model (~3 s)
def test_weights_changed_after_install_are_served_from_the_new_weights(pair):
    eager, model, inputs = pair
    install(model, table_plan(), registry=REG)
    x = with_timestep(inputs, A.timestep_vectors([5], **SPEC)[2])
    with torch.no_grad():
        for m in (eager, model):
            m.transformer_blocks[0].adaln_proj.linear.weight.mul_(0.5)
    reset_counters()
    got = forward(model, x)
    reasons = fallback_reasons()["adaln_table"]
    assert list(reasons) == ["transformer_blocks.0.adaln_proj.linear's weights changed since install: the table was "
                             "dropped"]
    assert counters()["adaln_table.fused"] == 2 and all(torch.equal(a, b) for a, b in zip(got, forward(eager, x)))


def test_grad_mode_runs_the_eager_expression(pair):
    eager, model, inputs = pair
    install(model, table_plan(), registry=REG)
    x = with_timestep(inputs, A.timestep_vectors([5], **SPEC)[1])
    for m in (eager, model):  # build_model leaves every parameter frozen
        for lin in [b.adaln_proj.linear for b in m.transformer_blocks] + [m.norm_out.linear]:
            lin.weight.requires_grad_(True)
    reset_counters()
    out = model(**x).sample
    assert (counters().get("adaln_table.fallback") == 3
            and "grad enabled" in next(iter(fallback_reasons()["adaln_table"])))
    out.float().sum().backward()
    assert model.transformer_blocks[0].adaln_proj.linear.weight.grad is not None
    assert torch.equal(out, eager(**x).sample)


def test_direct_call_of_a_parked_linear_is_counted_and_exact(pair):
    eager, model, _ = pair
    install(model, table_plan(), registry=REG)
    x = torch.randn(3, eager.config.time_embed_dim, dtype=torch.bfloat16)
    reset_counters()
    with torch.no_grad():
        got = model.norm_out.linear(x)
        want = eager.norm_out.linear(x)
    assert torch.equal(got, want) and "direct call" in next(iter(fallback_reasons()["adaln_table"]))


# ---- install / uninstall -----------------------------------------------------------------------------------------


def test_state_dict_while_installed_and_the_uninstall_round_trip(pair):
    _, model, inputs = pair
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = {n: p for n, p in model.named_parameters()}
    report = install(model, table_plan(), registry=REG)
    assert any("state_dict() shows those host copies" in n for n in report.notes)
    during = model.state_dict()
    assert list(during) == list(before)
    assert all(during[k].dtype == v.dtype and torch.equal(during[k], v) for k, v in before.items())
    assert "forward" in model.norm_out.__dict__ and "forward" in model.transformer_blocks[0].adaln_proj.__dict__
    ptrs = [s.stamp[0] for s in A.tables_of(model).slots]
    assert all(p in A._SLOTS for p in ptrs)
    assert uninstall(model)
    after = model.state_dict()
    assert list(after) == list(before) and all(after[k].dtype == v.dtype and torch.equal(after[k], v)
                                               for k, v in before.items())
    assert all(params[n] is p for n, p in model.named_parameters())  # the same Parameter objects
    assert A.tables_of(model) is None and not any(p in A._SLOTS for p in ptrs)
    for m in [model.norm_out, model.norm_out.linear] + [b.adaln_proj for b in model.transformer_blocks] + \
             [b.adaln_proj.linear for b in model.transformer_blocks]:
        assert "forward" not in m.__dict__
    reset_counters()
    forward(model, inputs)
    assert "adaln_table.fused" not in counters() and "adaln_table.fallback" not in counters()


def test_a_replaced_adaln_linear_is_refused_in_one_line(pair):
    _, model, _ = pair
    lin = model.norm_out.linear
    model.norm_out.linear = torch.nn.Sequential(lin)
    with pytest.raises(ValueError) as e:
        install(model, table_plan(), registry=REG)
    assert "adaln_table: norm_out.linear is Sequential" in str(e.value) and "\n" not in str(e.value)
    assert "forward" not in model.transformer_blocks[0].adaln_proj.__dict__  # nothing left half-installed


# ---- compile ---------------------------------------------------------------------------------------------------


@pytest.fixture
def no_recompiles():
    import torch._dynamo

    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["regional", "whole"])
def test_compiled_tables_hit_miss_and_never_recompile(pair, no_recompiles, how):
    """Under torch.compile (fullgraph, aot_eager) the op is opaque: hits, a miss and its added entry count as
    uncompiled, the bits are eager's, and a new timestep vector (other values, same T) does not recompile."""
    eager, model, inputs = pair
    install(model, table_plan(), registry=REG)
    if how == "regional":
        model.compile_repeated_blocks(fullgraph=True, backend="aot_eager")
        compiled = model
    else:
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    vs = [v for v in A.timestep_vectors([5], **SPEC) if v.numel() == 2]
    for ts, hit in [(vs[0], True), (vs[1], True), (torch.tensor([0.3, 0.7]), False), (torch.tensor([0.3, 0.7]), True)]:
        x = with_timestep(inputs, ts)
        reset_counters()
        got = forward(compiled, x)
        c = counters()
        assert c.get("adaln_table.fused" if hit else "adaln_table.fallback") == 3, (ts, c)
        assert all(torch.equal(a, b) for a, b in zip(got, forward(eager, x)))


@pytest.mark.slow
def test_ulysses_degree_2_with_tables_matches_single_process():
    import json
    import os
    import tempfile

    import adaln_table_ulysses_worker as W
    from gloo_spawn import spawn

    outdir = tempfile.mkdtemp(prefix="h3plan_adaln_u2_")
    spawn(W.worker, 2, outdir, 47, timeout_s=300)
    for rank in (0, 1):
        with open(os.path.join(outdir, f"rank{rank}.json")) as f:
            r = json.load(f)
        c = r["counters"]
        assert r["bitwise"] and r["after_uninstall_bitwise"], (rank, r)
        assert c["adaln_table.fused"] == 3 and "adaln_table.fallback" not in c and c["attention.fused"] == 2, (rank, c)


def test_install_takes_more_step_counts(pair):
    _, model, _ = pair
    report = install(model, table_plan(), registry=REG, num_inference_steps=[7, 5])
    tables = A.tables_of(model)
    assert tables.spec["steps"] == [5, 7] and len(tables.vectors) == len(A.timestep_vectors([5, 7], **SPEC)) == 8
    assert any("num_inference_steps 5, 7" in n for n in report.notes)
