"""adaln_table's timestep embedding as opaque ops (install/adaln_temb.py), on the tiny model (CPU): eager calls give
diffusers' bits, a whole-model compile traces the ops as single nodes (no sin / cos / linear of its own, which is what
made Inductor's temb miss the table on the H200), the table hits under it, uninstall restores the forwards, and a
model whose embedding is another form keeps its forwards with the reason in the report."""

import pytest
import torch
import torch._dynamo
from install_helpers import forward, tiny_inputs, tiny_model
from test_install_adaln_table import REG, table_plan, with_timestep

from h3plan.install import install, uninstall
from h3plan.install import adaln_temb
from h3plan.runtime.counters import counters, reset_counters

TS = torch.tensor([1000.0, 937.5, 3.25, 0.0])


def _original(mod, *args):
    return type(mod).forward(mod, *args)


def test_the_ops_give_diffusers_bits():
    model = tiny_model()
    install(model, table_plan(), registry=REG)
    assert "forward" in model.time_proj.__dict__ and "forward" in model.time_embedder.__dict__
    with torch.no_grad():
        sin = model.time_proj(TS)
        assert torch.equal(sin, _original(model.time_proj, TS)) and sin.dtype == torch.float32
        temb = model.time_embedder(sin)
        assert torch.equal(temb, _original(model.time_embedder, sin))
    uninstall(model)
    assert "forward" not in model.time_proj.__dict__ and "forward" not in model.time_embedder.__dict__


def test_grad_mode_runs_the_modules_own_forward():
    model = tiny_model()
    install(model, table_plan(), registry=REG)
    x = model.time_proj(TS).requires_grad_(True)
    out = model.time_embedder(x)  # grad enabled with a tensor that needs it: diffusers' forward, autograd intact
    out.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.slow  # dynamo traces the whole tiny model (~20 s)
def test_whole_model_compile_traces_the_embedding_as_ops_and_hits_the_table():
    model, inputs = tiny_model(), tiny_inputs(16)
    install(model, table_plan(), registry=REG)
    inputs = with_timestep(inputs, torch.tensor(model._h3plan_adaln.vectors[0]))  # a tabled timestep vector
    reset_counters()
    ref = forward(model, inputs)
    expected = dict(counters())
    assert expected.get("adaln_table.fused") and "adaln_table.fallback" not in expected, expected
    targets = []

    def backend(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, fullgraph=True, backend=backend)
        for _ in range(2):
            reset_counters()
            out = forward(compiled, inputs)
            assert dict(counters()) == expected
            assert all(torch.equal(a, b) for a, b in zip(out, ref))
    finally:
        torch._dynamo.reset()
    assert any("h3plan.timestep_sinusoid" in t for t in targets) and any("h3plan.timestep_mlp" in t for t in targets)
    trig = [t for t in targets if ("sin" in t or "cos" in t or "exp" in t) and "h3plan" not in t]
    assert not trig, trig  # no sinusoid of dynamo's own: Inductor would generate it with other bits


def test_another_embedding_form_keeps_its_forward_with_the_reason():
    model = tiny_model()
    model.time_embedder.act = torch.nn.GELU()
    report = install(model, table_plan(), registry=REG)
    assert "forward" not in model.time_embedder.__dict__ and "forward" not in model.time_proj.__dict__
    assert adaln_temb.why_not(model).startswith("time_embedder has a condition projection")
    assert any("the timestep embedding keeps its forward (time_embedder has" in n for n in report.notes), report.notes
    uninstall(model)
