"""H200: h3plan.planning.memory's transformer terms against torch.cuda.max_memory_allocated, one real-width block
(+ the 2 refiner blocks and the heads), eager and with the sm90 bf16 plan installed, S = 19,000 and 37,820.
Each test prints one line: the estimate, the measurement and their ratio.

    . /tmp/h3site/env.sh && python -m pytest tests/gpu/test_memory_gpu.py -m gpu -q -rA -s

Contracts (the estimate's own accounting, h3plan/planning/memory.py's denoise phase): the weights resident after
install (eager: as built; the plan: the AdaLN linears parked on the host, their tables on the device) within 1% of
`transformer_weights` + `adaln_tables`; the forward's whole peak (weights, inputs and the forward's own tensors) within
5% of the denoise phase's transformer items, `transformer_weights` + `adaln_tables` + `step_inputs` +
`block_activations` + `stack_boundary` (benchmarks/memory.py checks the pipeline's peak the same way). On the H200
eager's forward measured 0.947 of block_activations + stack_boundary at both lengths, about 0.96 of the phase total.
The weights are measured after install, where the estimate counts the linears parked.

And build_model's narrow build (an 80 GB card: the seeded model built in bf16 directly) against the float32 build
cast, on the device's own generator: equal tensors, the generator left where the float32 build leaves it.
"""

import gc
import os

import pytest
import torch
import yaml

from h3plan.planning import memory as M
from h3plan.actions.inputs import build_model, packed_inputs

pytestmark = pytest.mark.gpu
CONF = os.path.join(os.path.dirname(__file__), "..", "..", "conf")
MODEL = yaml.safe_load(open(os.path.join(CONF, "model", "h3.yaml")))
VAE = yaml.safe_load(open(os.path.join(CONF, "vae", "h3.yaml")))
GiB = 2**30


@pytest.mark.parametrize("S", (19000, 37820))
@pytest.mark.parametrize("which", ("eager", "sm90-bf16-u1"))
def test_transformer_memory_estimate(S, which):
    import h3plan
    from h3plan.install import install, uninstall

    dc1 = {**MODEL["diffusers_config"], "num_layers": 1}
    gc.collect()  # an earlier test's installed model (hooks make reference cycles) freed now, not inside this one
    torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated()
    model = build_model(MODEL["diffusers_config"], blocks=1, device="cuda", seed=0)
    settings = {}
    if which != "eager":
        plan = h3plan.resolve_config(hardware="sm90", recipe="bf16", parallel="u1", **{"parallel.seq_len": S})
        settings = {d.lever: d.setting for d in plan.decisions}
        install(model, plan)
    torch.cuda.synchronize()
    weights = (torch.cuda.memory_allocated() - start) / GiB
    e = M.estimate({"model": {"diffusers_config": dc1}, "vae": VAE},
                   {"seq_len": S, "ulysses_degree": 1, "batch": 1}, settings)
    b = e["breakdown"]
    est_w = b["transformer_weights"] + b.get("adaln_tables", 0.0)
    assert abs(weights - est_w) / est_w < 0.01, (weights, est_w)
    inputs = packed_inputs(MODEL["diffusers_config"], S, seed=0, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        out = model(**inputs)
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - start) / GiB
    measured = (torch.cuda.max_memory_allocated() - before) / GiB
    expected = b["block_activations"] + b["stack_boundary"]
    phase = est_w + b["step_inputs"] + expected
    print(f"memory S={S} {which}: weights {weights:.3f} GiB (est {est_w:.3f}); forward peak over weights+inputs "
          f"{measured:.3f} GiB, est block {b['block_activations']:.3f} + boundary {b['stack_boundary']:.3f} -> ratio "
          f"{measured / expected:.3f}; whole peak {peak:.3f} GiB, estimate {phase:.3f} -> ratio {peak / phase:.3f}",
          flush=True)
    del out
    if which != "eager":
        uninstall(model)
    assert 0.95 < peak / phase < 1.05, (peak, phase, measured, expected, e["basis"]["block_activations"])


def test_a_narrow_build_on_the_device_holds_the_float32_builds_values():
    """build_model's narrow build (the seeded model in bf16 directly, for a device the 123 GiB float32 build would not
    fit) against the float32 build cast, two real-width blocks on the GPU: every tensor equal, the device generator
    where the float32 build leaves it, and the narrow build's peak under the float32 build's."""
    dc2 = {**MODEL["diffusers_config"], "num_layers": 2}
    gc.collect()
    torch.cuda.empty_cache()
    peaks, tensors, after = [], [], []
    for narrow in (False, True):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()  # the earlier build's tensors, kept for the comparison
        m = build_model(dc2, device="cuda", dtype="bf16", seed=11, narrow=narrow)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        after.append(torch.rand(8, device="cuda"))
        tensors.append({**dict(m.named_parameters()), **{"b:" + k: v for k, v in m.named_buffers()}})
        del m
    a, b = tensors
    assert a.keys() == b.keys()
    differ = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
    assert not differ, differ
    assert torch.equal(after[0], after[1])
    print(f"narrow build: peak {peaks[1] / GiB:.2f} GiB against {peaks[0] / GiB:.2f} GiB in float32")
    assert peaks[1] < 0.7 * peaks[0]


def test_a_narrow_builds_tensors_moved_off_the_device_give_their_memory_back():
    """A plan moves tensors off the device (the bf16 plan's AdaLN linears, 24.3 GiB at real width). A build that puts
    its tensors inside freed float32 temporaries' segments leaves those bytes reserved, in holes between other tensors
    (docs/measurements.md, "The seeded real-width model on an 80 GB card": the lossless plan ran out of memory there on
    an H100). Built after one scratch, every tensor has its own allocation: the moved tensors' bytes leave the
    allocator's reserve."""
    dc2 = {**MODEL["diffusers_config"], "num_layers": 2}
    gc.collect()
    torch.cuda.empty_cache()
    m = build_model(dc2, device="cuda", dtype="bf16", seed=11, narrow=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    moved = 0
    for block in m.transformer_blocks:
        w = block.adaln_proj.linear.weight
        moved += w.numel() * w.element_size()
        w.data = w.data.cpu()
    torch.cuda.empty_cache()
    released = reserved - torch.cuda.memory_reserved()
    print(f"narrow build: {moved / GiB:.3f} GiB moved to the host, {released / GiB:.3f} GiB released")
    assert released >= 0.99 * moved
