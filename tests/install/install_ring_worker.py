"""Worker of test_install_ring.py: one gloo rank running the installed tiny model at ring R x Ulysses U."""

import json
import os
import sys

import torch
import torch.distributed as dist


def _rel(out, ref):
    """Relative Frobenius error over both outputs (video and audio samples)."""
    num = sum(float((a.float() - b.float()).pow(2).sum()) for a, b in zip(out, ref))
    den = sum(float(b.float().pow(2).sum()) for b in ref)
    return (num / den) ** 0.5


def worker(rank, world, port, outdir, S, R):
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, os.path.dirname(__file__))
    from install_helpers import LEVERS, forward, tiny_inputs, tiny_model

    from h3plan.install import counters, install, reset_counters
    from h3plan.levers import REGISTRY
    from h3plan.planner import make_plan
    from h3plan.facts.decision import make_decision

    U = world // R
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        levers = dict(LEVERS, ulysses_padding=REGISTRY["ulysses_padding"].install, ring=REGISTRY["ring"].install)
        inputs = tiny_inputs(S)
        res = {}
        for qk in ("eager", "fused"):
            base = [make_decision("attention", "sdpa", True, ["t"]), make_decision("qk_norm_rope", qk, True, ["t"]),
                    make_decision("modulation", "exact", True, ["t"]),
                    make_decision("gated_residual", "on", True, ["t"]), make_decision("swiglu", "on", True, ["t"])]
            one = tiny_model()
            install(one, make_plan({}, {}, base), registry=levers)
            ref = forward(one, inputs)
            model = tiny_model()
            ring = [make_decision("ulysses_padding", "none", True, ["t"], params={"degree": U}),
                    make_decision("ring", "on", False, ["t"], params={"ring": R, "ulysses": U})]
            report = install(model, make_plan({}, {}, base + ring), registry=levers, group=dist.group.WORLD)
            reset_counters()
            out = forward(model, inputs)
            c = counters()
            res[qk] = {"rel": _rel(out, ref), "bitwise": all(torch.equal(a, b) for a, b in zip(out, ref)),
                       "shape_ok": all(a.shape == b.shape for a, b in zip(out, ref)), "counters": dict(c),
                       "reasons": {k: dict(v) for k, v in getattr(c, "reasons", {}).items()},
                       "swaps": [str(s) for s in report.swaps if "ring" in str(s) or "sequence shard" in str(s)][:2]}
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(res, f)
    finally:
        dist.destroy_process_group()
