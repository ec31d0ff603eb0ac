"""The installer at ring x Ulysses over gloo (CPU, Triton interpreter): every rank runs the block stack on its
world shard (rank g: rows g*S_loc ..) and attention through h3plan.runtime.parallel.ring.RingUlysses; the gathered
outputs match the degree-1 plan within ring_plan.NUMERICS.

Contract: not bitwise (the key blocks merge through their log-sum-exp, ring_plan.NUMERICS). On the CPU the
ring's blocks are the fp32 reference (sdpa_flash needs CUDA: counted `ring.fallback`), merged to ~5e-7 and
rounded once to bf16, while degree 1 runs CPU SDPA in bf16: per attention element the two differ by the
bf16 kernel's own error plus one bf16 rounding, each below the unit roundoff 2^-8 relative. The blocks' bf16
linears, norms and residuals carry that gap at the same relative size, so the relative Frobenius error of the
outputs stays below REL_BOUND = 2^-8 (measured 1.05e-3 at ring 2 x ulysses 1 and 2; printed with -s).
S = 47 leaves padding rows at the tail of the last world shard (and an incomplete last ring block).
"""

import json
import os
import re
import tempfile

import pytest
from gloo_spawn import spawn

import install_ring_worker as W

TIMEOUT_S = 300
REL_BOUND = 2**-8
LAYERS = 2  # h3_tiny num_layers: one ring call per layer and forward


@pytest.mark.slow
@pytest.mark.parametrize("world, R", [(2, 2), (4, 2)])
def test_ring_plan_matches_degree_1_within_numerics(world, R):
    outdir = tempfile.mkdtemp(prefix=f"h3plan_install_r{R}w{world}_")
    spawn(W.worker, world, outdir, 47, R, timeout_s=TIMEOUT_S)
    for rank in range(world):
        with open(os.path.join(outdir, f"rank{rank}.json")) as f:
            res = json.load(f)
        assert sorted(res) == ["eager", "fused"]
        for case, r in res.items():
            print(f"ring {R} x ulysses {world // R}, rank {rank}, {case}: relative error {r['rel']:.2e}")
            assert r["shape_ok"] and r["rel"] <= REL_BOUND, (rank, case, r)
            assert not r["bitwise"], (rank, case, "the ring path did not run: the outputs are degree 1's bits")
            c = r["counters"]
            assert c["ring.fallback"] == LAYERS and "ring.fused" not in c, (rank, case, c)
            assert "sdpa_flash: sdpa_flash needs CUDA tensors" in next(iter(r["reasons"]["ring"])), r["reasons"]
            assert "attention.fused" not in c and "attention.fallback" not in c, (rank, case, c)
            assert c["modulation.fused"] == 2 * LAYERS, (rank, case, c)
            assert c.get("qk_norm_rope.fused", 0) == (LAYERS if case == "fused" else 0), (rank, case, c)
            assert any("1/" + str(world) + " sequence shard" in s for s in r["swaps"]), r["swaps"]


def test_a_ring_plan_needs_a_world_of_ring_x_ulysses_ranks():
    from install_helpers import tiny_model

    from h3plan.errors import InstallError
    from h3plan.install import install
    from h3plan.levers import REGISTRY
    from h3plan.planner import make_plan
    from h3plan.facts.decision import make_decision

    ds = [make_decision("attention", "sdpa", True, ["t"]),
          make_decision("ring", "on", False, ["t"], params={"ring": 2, "ulysses": 1})]
    reg = {k: REGISTRY[k].install for k in ("attention", "ring")}
    with pytest.raises(InstallError, match=r"^plan ring 2 x ulysses 1 = 2 ranks but the process group has 1 "):
        install(tiny_model(), make_plan({}, {}, ds), registry=reg)
    bad = [make_decision("attention", "cudnn_fp8", False, ["t"])] + ds[1:]
    with pytest.raises(InstallError, match=r"^ring_degree=2 cannot run with: backend cudnn_fp8 gives no log-sum-exp"):
        install(tiny_model(), make_plan({}, {}, bad), registry=reg)


def test_a_ring_plan_refuses_the_settings_the_ring_rules_out_by_their_reason():
    """A hand-made plan with a setting parallel.ring rules out (levers/rules.py EXCLUDES) whose install recorded an
    option is refused at install with EXCLUDES' reason; the same lever's setting that installs nothing is not."""
    from install_helpers import tiny_model

    from h3plan.errors import InstallError
    from h3plan.install import install
    from h3plan.levers import REGISTRY
    from h3plan.levers.rules import EXCLUDES
    from h3plan.planner import make_plan
    from h3plan.facts.decision import make_decision

    ring = make_decision("ring", "on", False, ["t"], params={"ring": 2, "ulysses": 1})
    reg = {k: REGISTRY[k].install for k in ("attention", "fa4_2cta", "ring")}
    on = [make_decision("attention", "fa4", True, ["t"]),
          make_decision("fa4_2cta", "on", True, ["t"], params={"attention": "fa4"}), ring]
    why = EXCLUDES["fa4_2cta"][1]
    with pytest.raises(InstallError, match=r"^ring_degree=2 cannot run with: fa4_2cta=on \(" + re.escape(why)):
        install(tiny_model(), make_plan({}, {}, on), registry=reg)
    off = [on[0], make_decision("fa4_2cta", "off", True, ["t"], params={"attention": "fa4"}), ring]
    with pytest.raises(InstallError, match=r"^plan ring 2 x ulysses 1 = 2 ranks"):
        install(tiny_model(), make_plan({}, {}, off), registry=reg)
