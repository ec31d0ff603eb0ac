"""Probe (2+ GPUs, torchrun): what Ulysses buys per block, and what the all-to-all costs.

    torchrun --standalone --nproc-per-node=2 benchmarks/probes/ulysses_x2.py OUT_DIR

Per sequence length, one process per GPU, a stack of two real-width blocks (the first shards the
sequence, the last gathers it), interleaved rounds of: diffusers eager on one GPU (every rank runs its
own copy), the degree-1 plan on one GPU, and the degree-U plan with its overlap on and off. Each rank
times its own stream with CUDA events; rank 0 writes. Then the raw all-to-all: one (S/U, H, D) bf16
tensor through dist.all_to_all_single, against the plan's NVLink estimate.
"""
import copy
import json
import os
import statistics
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from h3plan.actions import inputs
from h3plan.actions.bench.measure import capture_block_inputs, run_stack
from h3plan.cli import compose_config
from h3plan.install import install
from h3plan.planner import resolve

ROUNDS, WARM, BLOCKS = 8, 2, 2
OUT = sys.argv[1] if len(sys.argv) > 1 else "."
SEQS = [int(s) for s in sys.argv[2:]] or [37820, 19000]


def plan(U, S, *extra):
    return resolve(compose_config(["hardware=sm90", f"parallel=u{U}", "recipe=bf16", f"parallel.seq_len={S}", *extra]))


def timed(fn):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    return a, b


def interleave(fns):
    for fn in fns.values():
        for _ in range(WARM):
            fn()
    torch.cuda.synchronize()
    ev = {k: [] for k in fns}
    for _ in range(ROUNDS):
        for k, fn in fns.items():
            dist.barrier()
            ev[k].append(timed(fn))
    torch.cuda.synchronize()
    return {k: statistics.median(a.elapsed_time(b) for a, b in v) for k, v in ev.items()}


def main():
    dist.init_process_group("nccl", timeout=timedelta(seconds=300))
    rank, U = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dc = compose_config(["hardware=sm90"])["model"]["diffusers_config"]
    eager = inputs.build_model(dc, blocks=BLOCKS, device="cuda", dtype="bf16", seed=0)
    result = {"device": torch.cuda.get_device_name(), "gpus": U, "torch": torch.__version__,
              "nccl": str(torch.cuda.nccl.version()), "blocks": BLOCKS, "rounds": ROUNDS, "stack": [], "a2a": []}
    for S in SEQS:
        p1, pu, pu_off = plan(1, S), plan(U, S), plan(U, S, "levers.ulysses_overlap=off")
        models = {"plan_u1": copy.deepcopy(eager), f"plan_u{U}": copy.deepcopy(eager), f"plan_u{U}_no_overlap": copy.deepcopy(eager)}
        install(models["plan_u1"], p1)
        install(models[f"plan_u{U}"], pu, group=dist.group.WORLD)
        install(models[f"plan_u{U}_no_overlap"], pu_off, group=dist.group.WORLD)
        block_in = capture_block_inputs(torch, eager, inputs.packed_inputs(dc, S, seed=0, device="cuda"))
        fns = {"eager_u1": lambda: run_stack(eager.transformer_blocks, *block_in)}
        fns.update({k: (lambda m=m: run_stack(m.transformer_blocks, *block_in)) for k, m in models.items()})
        with torch.no_grad():
            same = torch.equal(fns[f"plan_u{U}"](), fns["plan_u1"]())
            t = interleave(fns)
        rec = {"S": S, "ms_per_stack": t, "bitwise_u_vs_u1": bool(same),
               "speedup_plan_u_vs_plan_u1": t["plan_u1"] / t[f"plan_u{U}"],
               "speedup_plan_u_vs_eager_u1": t["eager_u1"] / t[f"plan_u{U}"],
               "overlap_on_vs_off": t[f"plan_u{U}_no_overlap"] / t[f"plan_u{U}"],
               "plan_settings": {lv: pu.decision(lv).setting for lv in ("ulysses_padding", "ulysses_overlap", "a2a_fp8_codes")},
               "a2a_ms_per_block_est": pu.derived_value("a2a_ms_per_block_est")}
        result["stack"].append(rec)
        if rank == 0:
            print("stack", json.dumps(rec), flush=True)
        del models, fns, block_in
        torch.cuda.empty_cache()
        # raw all-to-all of one per-rank q-sized tensor, and of the four a block sends (q, k, v before, o after)
        H, D = int(dc["num_attention_heads"]), int(dc["attention_head_dim"])
        rows = -(-S // U)
        x = torch.randn(rows, H, D, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        a2a = lambda: dist.all_to_all_single(y, x)  # noqa: E731
        t1 = interleave({"one": a2a, "four": lambda: [a2a() for _ in range(4)]})
        leaving = x.numel() * 2 * (U - 1) / U
        rec = {"S": S, "tensor": [rows, H, D], "one_ms": t1["one"], "block_ms": t1["four"],
               "gbps_leaving_rank": leaving / (t1["one"] * 1e-3) / 1e9}
        result["a2a"].append(rec)
        if rank == 0:
            print("a2a", json.dumps(rec), flush=True)
        del x, y
    if rank == 0:
        with open(os.path.join(OUT, f"ulysses-x{U}.json"), "w") as f:
            json.dump(result, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
