"""H200: adaln_table at real width (4 blocks + norm_out): every entry bitwise against the eager linears, the
installed forward bitwise against the same plan without tables (a hit and a streamed miss), the device memory it
frees against the estimate's count, the weights in pinned host memory, the uninstall round trip, and regional
torch.compile (inductor) over it without a recompile.

    . /tmp/h3site/env.sh && python -m pytest tests/gpu/test_adaln_table_gpu.py -m gpu -q -rA -s

test_host_loaded_install_streams_what_it_parks: the same at install(model, plan, device="cuda") of the model resting
on the host (bf16 and fp8 plans).
"""

import copy
import gc

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
    print(f"adaln_table: {len(tables.vectors)} vectors, table {tables.nbytes / GiB:.3f} GiB, freed {freed / GiB:.3f} "
          f"GiB (estimate {(p['weight_bytes'] - p['table_bytes']) / GiB:.3f})", flush=True)
    assert tables.nbytes == p["table_bytes"] and len(tables.vectors) == p["vectors"] == 49
    assert abs(freed - (p["weight_bytes"] - p["table_bytes"])) < 64 * 2**20  # allocator rounding of the freed blocks
    assert all(s.linear.weight.device.type == "cpu" and s.linear.weight.is_pinned() for s in tables.slots)

    mods = [b.adaln_proj.linear for b in eager.transformer_blocks] + [eager.norm_out.linear]
    with torch.no_grad():
        for ts in A.timestep_vectors([50]):
            temb = eager.time_embedder(eager.time_proj(ts.cuda()))
            _, kid = tables.lookup(temb)
            for slot, lin in zip(tables.slots, mods):
                assert torch.equal(slot.entries[kid],
                                   lin(torch.nn.functional.silu(temb).to(lin.weight.dtype))), slot.fqn

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


def _live_cuda_tensors(top=8) -> str:
    """The largest CUDA tensors Python still references (a failure's diagnosis)."""
    live = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]
    live.sort(key=lambda t: -t.untyped_storage().nbytes())
    return "; ".join(f"{tuple(t.shape)} {t.dtype} {t.untyped_storage().nbytes() / 2**20:.1f} MiB" for t in live[:top])


@pytest.mark.parametrize("recipe", ["bf16", "fp8"])
def test_host_loaded_install_streams_what_it_parks(setup, recipe):
    """install(model, plan, device="cuda") of the same weights resting on the host (what an 80 GB card does): the
    device peak is the installed footprint plus one staged tensor (the AdaLN linears and, for fp8, the bf16 block
    linears never reach the device whole), the AdaLN weights in pinned host memory, every other tensor on the
    device, the forward bitwise the same plan installed into the device-loaded model, and uninstall puts every
    tensor back on the host bit for bit."""
    import h3plan
    from h3plan.install import adaln_table as A
    from h3plan.install import install, uninstall
    from h3plan.runtime.counters import counters, reset_counters

    dc, eager, on, off, inputs = setup
    plan = on if recipe == "bf16" else h3plan.resolve_config(hardware="sm90", recipe="fp8", parallel="u1",
                                                             **{"parallel.seq_len": S})
    assert plan.decision("adaln_table").setting == "on"
    # earlier tests' cyclic garbage (a failed test's traceback holds its forward's activations until it is collected)
    # freed before `base`, not while the device-loaded install below is measured
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    ref = copy.deepcopy(eager)
    install(ref, plan)  # device-loaded
    torch.cuda.synchronize()
    ref_installed = torch.cuda.memory_allocated() - base
    want = _forward(ref, _with(inputs, A.timestep_vectors([50])[20]))
    uninstall(ref)
    del ref
    torch.cuda.empty_cache()
    host = copy.deepcopy(eager).to("cpu")
    before = {k: v.clone() for k, v in host.state_dict().items()}
    gc.collect()  # the device-loaded copy's cycles (installed hooks) freed before `start`, not during the test
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    report = install(host, plan, device="cuda")
    torch.cuda.synchronize()
    installed, peak = torch.cuda.memory_allocated() - start, torch.cuda.max_memory_allocated() - start
    one = 2 * 18 * dc["hidden_size"] * (dc["time_embed_dim"] + 1)  # one AdaLN linear, bf16
    big = dc["hidden_size"] * 2 * dc["ffn_dim"]  # ff.net.0.proj: bf16 staged + quantize_weight's two fp32 temporaries
    staged = max(one, 10 * big if recipe == "fp8" else 0)
    print(f"host-loaded install {recipe}: installed {installed / GiB:.3f} GiB (device-loaded "
          f"{ref_installed / GiB:.3f}), peak {peak / GiB:.3f} GiB, staged {(peak - installed) / GiB:.3f} GiB (bound "
          f"{staged / GiB:.3f}); {report.placement}", flush=True)
    assert abs(installed - ref_installed) < 64 * 2**20
    assert peak - installed <= staged + 64 * 2**20
    tables = A.tables_of(host)
    assert all(s.linear.weight.device.type == "cpu" and s.linear.weight.is_pinned() for s in tables.slots)
    assert all(t.device.type == "cuda" for n, t in host.state_dict().items()
               if not any(n.startswith(s.fqn) for s in tables.slots)), "a tensor stayed on the host"
    assert "adaln_table: the AdaLN linears (pinned)" in report.placement["host"]
    reset_counters()
    got = _forward(host, _with(inputs, A.timestep_vectors([50])[20]))
    assert counters().get("adaln_table.fused") == BLOCKS + 1
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    uninstall(host)
    after = host.state_dict()
    assert all(after[k].device.type == "cpu" and not after[k].is_pinned() and torch.equal(after[k], v)
               for k, v in before.items())
    del tables, got  # this test's own references: the table entries (on the device) and the forward's outputs
    gc.collect()
    left = torch.cuda.memory_allocated() - start
    print(f"host-loaded install {recipe}: {left / 2**20:.1f} MiB left on the device after uninstall", flush=True)
    assert left < 64 * 2**20, _live_cuda_tensors()
