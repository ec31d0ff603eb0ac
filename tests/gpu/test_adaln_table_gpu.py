"""H200: adaln_table at real width (4 blocks + norm_out): every entry bitwise against the eager linears, the
installed forward bitwise against the same plan without tables (a hit and a streamed miss), the device memory it
frees against the estimate's count, the weights in pinned host memory, the uninstall round trip, and regional
torch.compile (inductor) over it without a recompile.

    . /tmp/h3site/env.sh && python -m pytest tests/gpu/test_adaln_table_gpu.py -m gpu -q -rA -s
"""

import copy

import pytest
import torch

from h3plan.levers import adaln_table as L

pytestmark = pytest.mark.gpu
BLOCKS, S = 4, 4096
GiB = 2**30


@pytest.fixture(scope="module")
def setup():
    import h3plan
    from h3plan.actions.inputs import build_model, packed_inputs
    from h3plan.planning.config import compose
    from omegaconf import OmegaConf

    dc = OmegaConf.to_container(compose([]).model.diffusers_config)
    eager = build_model(dc, blocks=BLOCKS, device="cuda", seed=0)
    on = h3plan.resolve_config(hardware="sm90", recipe="bf16", parallel="u1", **{"parallel.seq_len": S})
    off = h3plan.resolve_config(hardware="sm90", recipe="bf16", parallel="u1", **{"parallel.seq_len": S,
                                                                                  "levers.adaln_table": "off"})
    assert on.decision("adaln_table").setting == "on"
    return dc, eager, on, off, packed_inputs(dc, S, seed=0, device="cuda")


def _with(inputs, ts):
    out = dict(inputs)
    out["timestep"] = ts.to(inputs["timestep"].device)
    out["timestep_indices"] = inputs["timestep_indices"].clamp(max=ts.numel() - 1)
    return out


def _forward(model, x):
    with torch.no_grad():
        out = model(**x)
    return out.sample, out.audio_sample


def test_entries_forward_memory_and_round_trip(setup):
    from h3plan.install import adaln_table as A
    from h3plan.install import install, uninstall
    from h3plan.runtime.counters import counters, fallback_reasons, reset_counters

    dc, eager, on, off, inputs = setup
    ref = copy.deepcopy(eager)
    install(ref, off)
    model = copy.deepcopy(eager)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    install(model, on)
    torch.cuda.synchronize()
    freed = start - torch.cuda.memory_allocated()
    tables = A.tables_of(model)
    p = L.table_plan({**dc, "num_layers": BLOCKS}, {"num_inference_steps": 50})
    print(f"adaln_table: {len(tables.vectors)} vectors, table {tables.nbytes / GiB:.3f} GiB, freed {freed / GiB:.3f} GiB "
          f"(estimate {(p['weight_bytes'] - p['table_bytes']) / GiB:.3f})", flush=True)
    assert tables.nbytes == p["table_bytes"] and len(tables.vectors) == p["vectors"] == 49
    assert abs(freed - (p["weight_bytes"] - p["table_bytes"])) < 64 * 2**20  # allocator rounding of the freed blocks
    assert all(s.linear.weight.device.type == "cpu" and s.linear.weight.is_pinned() for s in tables.slots)

    mods = [b.adaln_proj.linear for b in eager.transformer_blocks] + [eager.norm_out.linear]
    with torch.no_grad():
        for ts in A.timestep_vectors([50]):
            temb = eager.time_embedder(eager.time_proj(ts.cuda()))
            _, kid = tables.lookup(temb)
            for slot, lin in zip(tables.slots, mods):
                assert torch.equal(slot.entries[kid], lin(torch.nn.functional.silu(temb).to(lin.weight.dtype))), slot.fqn

    for ts, hit in ((A.timestep_vectors([50])[20], True), (torch.tensor([0.7, 0.3]), False)):
        x = _with(inputs, ts)
        want = _forward(ref, x)
        reset_counters()
        got = _forward(model, x)
        c = counters()
        assert c.get("adaln_table.fused" if hit else "adaln_table.fallback") == BLOCKS + 1, (c, fallback_reasons())
        assert all(torch.equal(a, b) for a, b in zip(got, want)), ts
    uninstall(model)
    after = model.state_dict()
    assert all(after[k].device == v.device and torch.equal(after[k], v) for k, v in before.items())
    assert torch.cuda.memory_allocated() - start < 64 * 2**20 + tables.nbytes  # the weights are back, the table dropped


def test_regional_compile_over_the_tables_never_recompiles(setup):
    import torch._dynamo

    from h3plan.install import adaln_table as A
    from h3plan.install import install
    from h3plan.runtime.counters import counters, reset_counters

    dc, eager, on, off, inputs = setup
    model = copy.deepcopy(eager)
    install(model, on)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        model.compile_repeated_blocks(fullgraph=True)
        for ts in A.timestep_vectors([50])[10:13]:
            reset_counters()
            _forward(model, _with(inputs, ts))
            assert counters().get("adaln_table.fused") == BLOCKS + 1 and not counters().get("adaln_table.fallback")
    torch._dynamo.reset()
