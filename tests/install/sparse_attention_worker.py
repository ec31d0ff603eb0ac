"""Worker of test_install_sparse_attention.py's gloo pair: one rank running the tiny model with block-sparse attention
at Ulysses degree U (1: the single-process reference), on a sparse forward (the hook places it by its timestep)."""

import json
import os
import sys

import torch
import torch.distributed as dist

STEPS, DENSE = 6, 2  # 5 forwards, the first 2 dense
BLOCK = 32


def sparse_decisions(keep=0.5, padding=None, world=1):
    from h3plan.facts.decision import make_decision

    ds = [make_decision("attention", "fa4", True, ["t"]),
          make_decision("sparse_attention", "block_sparse", False, ["t"],
                        params={"keep": keep, "dense_forwards": DENSE, "block_q": BLOCK, "block_k": BLOCK,
                                "video_only": True, "steps": STEPS})]
    if padding:
        ds.append(make_decision("ulysses_padding", padding, True, ["t"]))
    return ds


def registry(world=1):
    from install_helpers import LEVERS

    from h3plan.levers import REGISTRY

    return dict(LEVERS, sparse_attention=REGISTRY["sparse_attention"].install,
                ulysses_padding=lambda b, d: (b.set("ulysses_padding", "ulysses_degree", world),
                                              b.set("ulysses_padding", "ulysses_padding", d.setting)))


def inputs(S, forward_index):
    from install_helpers import TINY

    from h3plan.actions.inputs import packed_inputs
    from h3plan.install.adaln_table import timestep_vectors

    x = packed_inputs(TINY, S, n_text=8, n_audio=40)
    x["timestep"] = timestep_vectors([STEPS], audio=True)[forward_index]
    return x


def run(model, plan, reg, x, group=None):
    from install_helpers import forward

    from h3plan.install import counters, install, reset_counters

    install(model, plan, registry=reg, group=group)
    reset_counters()
    return forward(model, x), counters()


def worker(rank, world, port, outdir, S):
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, os.path.dirname(__file__))
    from install_helpers import tiny_model

    from h3plan.planner import make_plan

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        x = inputs(S, 3)
        ref, _ = run(tiny_model(), make_plan({}, {}, sparse_decisions()), registry(1), x)
        dense, _ = run(tiny_model(), make_plan({}, {}, sparse_decisions(keep=1.0)), registry(1), x)
        padding = "padded" if S % world else "none"
        out, c = run(tiny_model(), make_plan({}, {}, sparse_decisions(padding=padding, world=world)),
                     registry(world), x)
        res = {"max_abs": max(float((a.float() - b.float()).abs().max()) for a, b in zip(out, ref)),
               "bitwise": all(torch.equal(a, b) for a, b in zip(out, ref)),
               "dense_gap": max(float((a.float() - b.float()).abs().max()) for a, b in zip(out, dense)),
               "counters": c, "padding": padding}
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(res, f)
    finally:
        dist.destroy_process_group()
