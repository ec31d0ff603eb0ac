"""Probe (2+ GPUs, torchrun): what Ulysses buys per block, and what the all-to-all costs.

    torchrun --standalone --nproc-per-node=U benchmarks/probes/ulysses_scaling.py OUT_DIR   # writes ulysses-xU.json
    python benchmarks/probes/ulysses_scaling.py --report RESULTS_DIR    # ulysses-h200.md from every ulysses-h200x*.json

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
from h3plan.actions.bench import Clock, interleaved

from h3plan.actions import bench as inputs
from h3plan.actions.bench import capture_block_inputs, configured, run_stack
from h3plan import install
from h3plan.actions.bench import roles

ROUNDS, WARM, BLOCKS = 8, 2, 2
OUT = sys.argv[1] if len(sys.argv) > 1 else "."
SEQS = [int(s) for s in sys.argv[2:]] or [37820, 19000]


def plan(U, S, *extra):
    return configured(["hardware=sm90", f"parallel=u{U}", "recipe=bf16", f"parallel.seq_len={S}", *extra])[1]


def interleave(fns):
    t = interleaved(Clock(), fns, WARM, ROUNDS, before=dist.barrier)  # ranks start each timed call together
    return {k: statistics.median(v) for k, v in t.items()}


def main():
    dist.init_process_group("nccl", timeout=timedelta(seconds=300))
    rank, U = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dc = configured(["hardware=sm90"])[0]["model"]["diffusers_config"]
    eager = inputs.build_model(dc, blocks=BLOCKS, device="cuda", dtype="bf16", seed=0)
    result = {"device": torch.cuda.get_device_name(), "gpus": U, "torch": torch.__version__,
              "nccl": str(torch.cuda.nccl.version()), "blocks": BLOCKS, "rounds": ROUNDS, "stack": [], "a2a": []}
    for S in SEQS:
        p1, pu, pu_off = plan(1, S), plan(U, S), plan(U, S, f"levers.{roles.OVERLAP}=off")
        models = {"plan_u1": copy.deepcopy(eager), f"plan_u{U}": copy.deepcopy(eager),
                  f"plan_u{U}_no_overlap": copy.deepcopy(eager)}
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
               "plan_settings": {lv: pu.decision(lv).setting for lv in roles.ULYSSES},
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


READING = """
## Reading

- The lossless plan's blocks scale with the GPUs: 1.73-1.84x on two and 3.09-3.47x on four against the
  same plan on one GPU (2.24x and 3.96-4.28x against diffusers' eager block on one GPU), bitwise equal to one GPU
  (the bf16 outputs here, and tests/gpu/test_install_ulysses_nccl.py at degrees 2 and 4).
- The all-to-all moves 200-238 GB/s out of each rank, about half the 450 GB/s one-direction NVLink figure
  the plan estimated with; a block's exchange is 3.6% (two GPUs) to 5.0% (four) of its time at 37,820.
- Overlapping the exchange with attention in two head chunks does not pay on the H200: 0.94-0.995x.
  Likely cause, not profiled: two half-size FA4 calls lose about what the hidden exchange saves.
  `conf/hardware/sm90.yaml` records the runs, so sm90 plans at degrees 2 and 4 turn the overlap off and
  estimate the exchange from the measured rate. Degree 8 never ran and keeps the borrowed rule.
- One interleaved run per (degree, length).
""".splitlines()


def report(results_dir):
    """ulysses-h200.md: one table per measured degree, from the committed ulysses-h200x<U>.json files."""
    import glob

    docs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(results_dir, "ulysses-h200x*.json")))]
    d0 = docs[0]
    nccl = ".".join(d0["nccl"].strip("()").replace(" ", "").split(","))
    lines = [f"# Ulysses on several H200s ({d0['device']}, torch {d0['torch']}, NCCL {nccl})", "",
             "`torchrun --standalone --nproc-per-node=U benchmarks/probes/ulysses_scaling.py OUT`: one process per "
             f"GPU, a stack of {d0['blocks']} real-width blocks (the first shards the sequence, the last gathers it), "
             f"bf16 plans (FA4), {d0['rounds']} interleaved rounds, rank 0's CUDA-event medians; `eager u1` and `plan "
             f"u1` run on one GPU.",
             "", "Speedups use the overlap-off time: what sm90 plans pick at these degrees since this measurement.", "",
             "| GPUs | S | diffusers eager, 1 GPU ms | plan u1, 1 GPU ms | plan uU, overlap on ms | plan uU, overlap "
             "off ms | uU vs plan u1 | uU vs eager u1 | overlap on vs off | uU bitwise vs u1 |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for d in docs:
        U = d["gpus"]
        for r in sorted(d["stack"], key=lambda r: r["S"]):
            t = r["ms_per_stack"]
            off = t[f"plan_u{U}_no_overlap"]
            lines.append(f"| {U} | {r['S']} | {t['eager_u1']:.2f} | {t['plan_u1']:.2f} | {t[f'plan_u{U}']:.2f} | "
                         f"{off:.2f} | {t['plan_u1'] / off:.2f}x | {t['eager_u1'] / off:.2f}x | "
                         f"{r['overlap_on_vs_off']:.3f}x | {'yes' if r['bitwise_u_vs_u1'] else 'no'} |")
    lines += ["", "## The all-to-all", "", "| GPUs | S | per-rank tensor | one tensor ms | four tensors (a block's q, "
                                           "k, v, o) ms "
              "| GB/s leaving a rank | NVLink estimate per block ms |", "|---:|---:|---|---:|---:|---:|---:|"]
    for d in docs:
        est = {r["S"]: r["a2a_ms_per_block_est"] for r in d["stack"]}
        for r in sorted(d["a2a"], key=lambda r: r["S"]):
            lines.append(f"| {d['gpus']} | {r['S']} | {' x '.join(map(str, r['tensor']))} bf16 | {r['one_ms']:.3f} | "
                         f"{r['block_ms']:.3f} | {r['gbps_leaving_rank']:.0f} | {est[r['S']]:.3f} |")
    return "\n".join(lines + READING) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--report":
        text = report(sys.argv[2])
        with open(os.path.join(sys.argv[2], "ulysses-h200.md"), "w") as f:
            f.write(text)
        print(text)
    else:
        main()
