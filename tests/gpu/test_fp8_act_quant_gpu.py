"""H200 suite for fp8_act_quant=row installed (runtime/levers/fp8_act_quant.py: its input step and block sites).

Contracts:
- tiny model on the GPU: the installed row block equals the reference chain (bf16 producer kernels ->
  `rows_to_e4m3_ref` -> the same rowwise `torch._scaled_mm` through fp8_linear_codes -> diffusers' attention
  pieces) bit for bit (rtol=0, atol=0): the producers' codes are their references'
  (tests/gpu/test_fp8_producers_gpu.py);
- real width (one block, S = 19,000), the resolved sm90 fp8 plan with row against the same plan with tensor:
  every producer fused (fp8_act_quant fused 4, fallback 0; gemm_quant fused 6), relative error against eager
  at most 1.25x tensor's (the probe's rowwise_block_forward: 1.29e-3 vs 1.25e-3,
  benchmarks/results/probes/fp8-producers-h200.json).

    python -m pytest tests/gpu/test_fp8_act_quant_gpu.py -m gpu -q -s
"""

import copy
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "install"))

pytestmark = pytest.mark.gpu


def test_tiny_row_block_equals_the_reference_chain_with_scaled_mm():
    import test_install_fp8_rows as t
    from install_helpers import LEVERS, plan

    from h3plan.actions.bench.measure import capture_block_inputs
    from h3plan.actions.inputs import build_model, packed_inputs
    from h3plan.install import counters, install, reset_counters
    from h3plan.runtime.quant.fp8_rowwise import fp8_linear_codes

    model = build_model(t.TINY, device="cuda", dtype="bf16", seed=0)
    block_in = capture_block_inputs(torch, model, packed_inputs(t.TINY, 48, device="cuda"))
    install(model, plan(**t.ROW), registry=LEVERS)
    blk = model.transformer_blocks[0]

    def gemm(x, lin):
        c, d = t.rows_to_e4m3_ref(x)
        return fp8_linear_codes(c, d, lin)

    reset_counters()
    with torch.no_grad():
        got = blk(*block_in)
        c = counters()
        ref = t.reference_block(blk, *block_in, linear_rows=gemm)
    assert c["fp8_act_quant.fused"] == 4 and "fp8_act_quant.fallback" not in c and "gemm_quant.fallback" not in c
    t._bitwise(got, ref)
    print(f"tiny row block == reference chain (torch._scaled_mm), counters {dict(c)}")


def test_real_width_row_plan_fused_and_within_tensor_error():
    from h3plan.actions import inputs
    from h3plan.actions.bench.measure import capture_block_inputs, rel_error, run_stack
    from h3plan.planning.config import compose
    from h3plan.install import counters, install, reset_counters
    from h3plan.planner import resolve

    S, base = 19000, ["hardware=sm90", "parallel=u1", "recipe=fp8", "parallel.seq_len=19000"]
    cfg = compose(base)
    eager = inputs.build_model(cfg["model"]["diffusers_config"], blocks=1, device="cuda", dtype="bf16", seed=0)
    block_in = capture_block_inputs(torch, eager,
                                    inputs.packed_inputs(cfg["model"]["diffusers_config"], S, device="cuda"))
    err, seen = {}, {}
    with torch.no_grad():
        ref = run_stack(eager.transformer_blocks, *block_in)
        for arm in ("tensor", "row"):
            model = copy.deepcopy(eager)
            install(model, resolve(compose(base + [f"levers.fp8_act_quant={arm}"])))
            reset_counters()
            out = model.transformer_blocks[0](*block_in)
            seen[arm] = dict(counters())
            err[arm] = rel_error(torch, out, ref)[0]
            del model, out
    assert seen["row"]["fp8_act_quant.fused"] == 4 and "fp8_act_quant.fallback" not in seen["row"]
    assert seen["row"]["gemm_quant.fused"] == 6 and "gemm_quant.fallback" not in seen["row"]
    assert 0 < err["row"] <= 1.25 * err["tensor"] < 1e-2, err
    print(f"S={S}: rel error vs eager row {err['row']:.3e}, tensor {err['tensor']:.3e}; counters row {seen['row']}")
