"""Worker of test_install_step_cache_gloo.py: one gloo rank of 2 running first_block's decision on its own shard.

Rank 0's first-block residual barely moves, rank 1's moves a lot: alone each would decide differently; reduced over the
group both see the whole sequence's relative change and take the same decision."""

import json
import os
import sys

import torch
import torch.distributed as dist


def worker(rank, world, port, outdir):
    sys.path.insert(0, os.path.dirname(__file__))
    from h3plan.runtime.levers.step_cache import _State, relative_change

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(rank)
        ref = torch.randn(1, 8, 16, generator=g)
        moved = ref + (0.01 if rank == 0 else 1.0) * torch.randn(1, 8, 16, generator=g)
        spec = dict(mode="first_block", steps=6, forwards=5, computed=5, warmup=1, final=1, threshold=0.3, max_skip=2)
        st = _State(spec, {}, dist.group.WORLD)
        st.begin(5)
        st.step, st.first_res, st.residual = 2, ref, torch.zeros_like(ref)
        sums = torch.stack([(moved - ref).abs().sum(), ref.abs().sum()])
        local = relative_change(sums, None)
        decision = st._first_block_skip(moved)
        both = [None] * world
        dist.all_gather_object(both, (ref, moved))
        whole_ref = torch.cat([r for r, _ in both], dim=1)
        whole = torch.cat([m for _, m in both], dim=1)
        global_rel = float((whole - whole_ref).abs().sum() / whole_ref.abs().sum())
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump({"local": local, "global": global_rel, "reduced": relative_change(sums, dist.group.WORLD),
                       "skip": decision}, f)
    finally:
        dist.destroy_process_group()
