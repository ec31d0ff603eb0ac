"""H200: h3plan.planning.memory's transformer terms against torch.cuda.max_memory_allocated, one real-width block
(+ the 2 refiner blocks and the heads), eager and with the sm90 bf16 plan installed, S = 19,000 and 37,820.
Each test prints one line: the estimate, the measurement and their ratio.

    . /tmp/h3site/env.sh && python -m pytest tests/gpu/test_memory_gpu.py -m gpu -q -rA -s

Contracts: the weights of the built model within 1% of the estimate's count at num_layers=1; the forward's
peak above the weights and inputs within 35% of max(block_activations, stack_boundary) (the estimate
counts diffusers' eager liveness from the dims; this is its first calibration, so the bound is loose and
the printed ratio is the result to record in the memory module's docstring).
"""

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
@pytest.mark.parametrize("which", ("eager", pytest.param("sm90-bf16-u1", marks=pytest.mark.xfail(
    strict=False, reason="failed on the H200 on 2026-11-30 (benchmarks/results/logs/gpu-final-x2.log): the activation "
    "estimate counts eager's tensors, not the installed plan's; not yet calibrated for plans"))))
def test_transformer_memory_estimate(S, which):
    import h3plan
    from h3plan.install import install, uninstall

    dc1 = {**MODEL["diffusers_config"], "num_layers": 1}
    torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated()
    model = build_model(MODEL["diffusers_config"], blocks=1, device="cuda", seed=0)
    weights = (torch.cuda.memory_allocated() - start) / GiB
    settings = {}
    if which != "eager":
        plan = h3plan.resolve_config(hardware="sm90", recipe="bf16", parallel="u1", **{"parallel.seq_len": S})
        settings = {d.lever: d.setting for d in plan.decisions}
        install(model, plan)
    e = M.estimate({"model": {"diffusers_config": dc1}, "vae": VAE}, {"seq_len": S, "ulysses_degree": 1, "batch": 1}, settings)
    b = e["breakdown"]
    assert abs(weights - b["transformer_weights"]) / b["transformer_weights"] < 0.01, (weights, b["transformer_weights"])
    inputs = packed_inputs(MODEL["diffusers_config"], S, seed=0, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        out = model(**inputs)
    torch.cuda.synchronize()
    measured = (torch.cuda.max_memory_allocated() - before) / GiB
    expected = max(b["block_activations"], b["stack_boundary"])
    print(f"memory S={S} {which}: weights {weights:.3f} GiB (est {b['transformer_weights']:.3f}); forward peak over weights+inputs "
          f"{measured:.3f} GiB, est block {b['block_activations']:.3f} / boundary {b['stack_boundary']:.3f} -> ratio {measured / expected:.3f}",
          flush=True)
    del out
    if which != "eager":
        uninstall(model)
    assert 0.65 < measured / expected < 1.35, (measured, expected, e["basis"]["block_activations"])
