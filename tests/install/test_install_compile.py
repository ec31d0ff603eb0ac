"""Compile safety: an installed model under torch.compile (diffusers' regional `compile_repeated_blocks` and
whole-model `torch.compile`, fullgraph) runs call after call without recompiling, counts every guarded call
exactly as the uncompiled plan does, and gives the uncompiled plan's bits (aot_eager: the compiled graph runs
the same ops; the kernels are opaque custom ops).

Recompiles raise here (`error_on_recompile`): before the counters went through `h3plan::count`, dynamo
guarded on the global count dicts and recompiled on every call.
"""

import pytest
import torch
import torch._dynamo
from install_helpers import LEVERS, LOSSLESS, forward, plan, tiny_inputs, tiny_model

from h3plan.install import install
from h3plan.runtime.counters import counters, reset_counters

pytestmark = pytest.mark.slow
FP8 = dict(LOSSLESS, gemm_quant="fp8")


@pytest.fixture
def no_recompiles():
    # config.patch, not monkeypatch: dynamo's config module is no plain attribute holder, and undoing a
    # monkeypatched entry deletes it under newer pytest (the later cases then fail on a missing attribute)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield
    torch._dynamo.reset()


@pytest.mark.parametrize("settings", [LOSSLESS, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("how", ["regional", "whole"])
def test_compiled_plan_counts_exactly_and_never_recompiles(no_recompiles, settings, how):
    model, inputs = tiny_model(), tiny_inputs(16)
    install(model, plan(**settings), registry=LEVERS)
    reset_counters()
    ref = forward(model, inputs)
    expected = dict(counters())
    assert expected.get("modulation.fused") and expected.get("attention.fused")
    if how == "regional":
        model.compile_repeated_blocks(fullgraph=True, backend="aot_eager")
        compiled = model
    else:
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for _ in range(3):
        reset_counters()
        out = forward(compiled, inputs)
        assert dict(counters()) == expected
        assert all(torch.equal(a, b) for a, b in zip(out, ref))
