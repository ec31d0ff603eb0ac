"""The installer at Ulysses degree 2 over gloo (CPU, Triton interpreter): each rank runs the block stack on
its sequence shard (install/shard.py) and attention through h3plan.runtime.parallel.ulysses; the gathered
outputs equal the single-process eager forward.

Contract: bitwise on these shapes (rtol=0, atol=0): every op is per row or per head, and the shards
only change how many rows a call sees. S = 47 makes the last shard padded (47 = 24 + 23). FP8 linears
too, against the degree-1 model with the same FP8 linears: their per-tensor activation amax covers the
whole sequence (padding rows excluded), so every rank casts with degree 1's scale. FP8 attention too
(tests/install/fp8_attention_standin.py: cuDNN FP8's scale bookkeeping, emulated attention): BF16 on the wire
with the cast after the exchange, and e4m3 codes on the wire; the dynamic q/k/v scales are the whole
sequence's over every head, as at degree 1 (with each rank's own heads' amax, no code matched degree 1:
what the H200s showed and the CPU test did not, as long as FP8 attention never ran on the CPU).
"""

import json
import os
import tempfile

import pytest
from gloo_spawn import spawn

import install_ulysses_worker as W

TIMEOUT_S = 300


@pytest.mark.slow
def test_ulysses_degree_2_matches_single_process():
    outdir = tempfile.mkdtemp(prefix="h3plan_install_u2_")
    spawn(W.worker, 2, outdir, 47, timeout_s=TIMEOUT_S)
    for rank in (0, 1):
        with open(os.path.join(outdir, f"rank{rank}.json")) as f:
            res = json.load(f)
        assert sorted(res) == ["fixed_valid-eager", "fp8-fixed_valid", "fp8-padded", "fp8att-fused", "fp8att-fused_fp8",
                               "fp8att-fused_fp8-codes", "padded-fused", "projection-fixed_valid", "projection-padded",
                               "projection-refused", "projection_split-padded"]
        for case, r in res.items():
            assert r["bitwise"], (rank, case, r)
            c = r["counters"]
            # one attention call per block (per destination's query rows with the split output exchange)
            assert c["attention.fused"] == (4 if case.startswith("projection_split") else 2), (rank, case, c)
            if case == "projection-refused":
                assert c["ulysses_exchange.fallback"] == 2 and "ulysses_exchange.fused" not in c, (rank, case, c)
                assert list(r["reasons"]) == ["to_q/to_k/to_v are not plain nn.Linear (a quantised linear is not "
                                              "sliced per destination)"], r
                continue
            if case.startswith("projection"):  # every call took the projection exchange
                assert c["ulysses_exchange.fused"] == 2 and "ulysses_exchange.fallback" not in c, (rank, case, c)
                assert c["qk_norm_rope.fused"] == 2, (rank, case, c)
                continue
            if case.startswith("fp8att"):  # the cuDNN FP8 stand-in ran every call
                assert c["qk_norm_rope.fused"] == 2 and "attention.fallback" not in c, (rank, case, c)
                continue
            if case.startswith("fp8"):  # CPU: the FP8 GEMM's counted emulation, same codes and scales
                assert c["gemm_quant.fallback"] == 2 * 6 and "gemm_quant.fused" not in c, (rank, case, c)
                continue
            assert c["modulation.fused"] == 4, (rank, case, c)
            # norm_out and both output heads ran on this rank's 24 rows (47 = 24 + 23, padded), not all 47;
            # uninstall put their forwards back
            assert r["head_rows"] == [24, 24, 24] and r["restored"] and r["after_uninstall_bitwise"], (rank, case, r)
            assert c.get("qk_norm_rope.fused", 0) == (2 if case.endswith("fused") else 0), (rank, case, c)
