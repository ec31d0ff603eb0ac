"""plan_for and export on the H200: a plan read from a real-width model (hardware from the device), installed,
then `torch.export.export` (non-strict, as diffusers' test_compile_works_with_aot), functionalization, and an
AOTInductor package.

Contracts: plan_for detects sm90 and the device's memory; the exported program and its functionalized form
(no decomposition) run the eager plan's ops, so rtol=0, atol=0 and the same counts; the AOTInductor package
counts exactly and stays within 1e-2 relative (Frobenius) of the eager plan, the bound of test_compile_gpu.py
(Inductor fuses and rounds the ops around h3plan's kernels; diffusers' own compiled block drifts 2.7e-3).
"""

import os

import pytest
import torch

pytestmark = pytest.mark.gpu
S, BLOCKS, BOUND = 4096, 2, 1e-2


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def _installed(recipe):
    import h3plan
    from h3plan.actions.inputs import build_model, packed_inputs

    dc = h3plan.resolve_config().get("model")["diffusers_config"]
    model = build_model(dc, blocks=BLOCKS, device="cuda", dtype="bf16", seed=0)
    plan = h3plan.plan_for(model, recipe=recipe, **{"parallel.seq_len": S})
    hw = plan.get("hardware")
    assert hw["name"] == "sm90"
    assert hw["device"]["memory_gb"] == round(torch.cuda.get_device_properties(0).total_memory / 1e9, 1)
    x = packed_inputs(dc, S, seed=1, device="cuda")
    h3plan.install(model, plan)
    with torch.no_grad():
        model(**x)  # the inputs' random timestep is an adaln_table miss: served, counted, then tabled
        h3plan.reset_counters()
        ref = (model(**x).sample, dict(h3plan.counters()))
    assert ref[1].get("attention.fused") == BLOCKS and "adaln_table.fallback" not in ref[1], ref[1]
    return h3plan, model, x, ref


@pytest.mark.parametrize("recipe", ["bf16", "fp8"])
def test_exported_plan_is_bitwise_and_counts_exactly(recipe):
    h3plan, model, x, (ref, expected) = _installed(recipe)
    ep = torch.export.export(model, args=(), kwargs=x)
    for program in (ep, ep.run_decompositions({})):
        with torch.no_grad():
            h3plan.reset_counters()
            out = program.module()(**x).sample
        assert dict(h3plan.counters()) == expected and torch.equal(out, ref)


def test_aoti_package_of_a_plan(tmp_path):
    from torch._inductor.package import load_package

    h3plan, model, x, (ref, expected) = _installed("bf16")
    ep = torch.export.export(model, args=(), kwargs=x)
    path = torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(tmp_path, "h3.pt2"))
    model.forward = load_package(path, run_single_threaded=True)
    # The package holds the AdaLN linears' weights as its own constants: the table op sees weights it did not
    # table, so each of its calls is a counted miss served by the exact GEMM.
    expected = {k: v for k, v in expected.items() if not k.startswith("adaln_table.")}
    expected["adaln_table.fallback"] = BLOCKS + 1
    for i in range(2):
        with torch.no_grad():
            h3plan.reset_counters()
            out = model(**x).sample
        rel = _rel(out, ref)
        print(f"AOTI call {i}: rel vs eager plan {rel:.2e}")
        assert dict(h3plan.counters()) == expected and rel < BOUND
