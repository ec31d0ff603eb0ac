"""Probe (2+ GPUs, torchrun): ring attention against one GPU (error) and against Ulysses (time).

    torchrun --standalone --nproc-per-node=2 benchmarks/probes/ring_nccl.py OUT_DIR [S ...]   # writes ring-nccl-x2.json

MiniMax-H3 attention alone (B=1, 56 heads x 128, bf16, non-causal), default S = 37,820. Block attention
with its LSE: FA4 (flash_attn.cute, return_lse) when it runs here, else torch's SDPA flash kernel; the
Ulysses arm calls the same function (its lse unused), so the arms differ only in how work is split.

Per length, on W GPUs:
- error (rank rows): ring W x ulysses 1, and ring 2 x ulysses W/2 where 56 heads allow, against the same
  kernel on one GPU over the whole sequence, and both against an fp32 reference (TF32 off);
- time, interleaved rounds with a barrier ahead of every call, CUDA events, medians: one GPU (every rank
  its own full attention), Ulysses W (padded), the ring meshes;
- parts: one ring transfer (K+V block, batch_isend_irecv), one block attention, one fp32 merge;
- the planner's estimate (ring_plan.ring_ulysses_cost) from the measured block attention and transfer
  rates, to check the overlap model.
Rank 0 writes OUT_DIR/ring-nccl-x<W>.json ($OUT when OUT_DIR is not given).
"""
import json
import os
import statistics
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from _cuda_timing import interleaved_ms, median_ms

from h3plan.parallel import UlyssesAttention, shard_rows
from h3plan.planning.sizes import valid_rows
from h3plan.parallel.lse import LSE_BACKENDS, LseMerge, attention_with_lse, pick_lse_backend
from h3plan.parallel.ring import RingAttention, RingUlysses, ring_ulysses_groups
from h3plan.planning.ring_plan import NUMERICS, describe, ring_ulysses_cost

H, D, ROUNDS, WARM = 56, 128, 8, 2
OUT = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", ".")
SEQS = [int(s) for s in sys.argv[2:]] or [37820]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _nccl_version() -> str:
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def main():
    dist.init_process_group("nccl", timeout=timedelta(seconds=600))
    rank, W = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    meshes = [(W, 1)] + ([(2, W // 2)] if W > 2 and W % 2 == 0 and H % (W // 2) == 0 else [])
    groups = {m: ring_ulysses_groups(*m) for m in meshes}
    probe = torch.empty(1, 8, 2, D, device="cuda", dtype=torch.bfloat16)
    name, skipped = pick_lse_backend(probe, prefer=("fa4", "sdpa_flash"))
    attn = LSE_BACKENDS[name]
    result = {"device": torch.cuda.get_device_name(), "gpus": W, "torch": torch.__version__,
              "nccl": _nccl_version(), "lse_backend": name, "skipped": skipped,
              "heads": H, "head_dim": D, "rounds": ROUNDS, "numerics_note": NUMERICS, "runs": []}
    for S in SEQS:
        g = torch.Generator(device="cuda").manual_seed(S)
        q, k, v = (torch.randn(1, S, H, D, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
        loc = [shard_rows(t, None) for t in (q, k, v)]
        S_loc, vr = loc[0].shape[1], valid_rows(S, W, rank)
        rows = slice(rank * S_loc, rank * S_loc + vr)
        rec = {"S": S, "rows_per_rank": S_loc, "errors": {}, "ms": {}, "parts_ms": {}}

        # ---- error
        with torch.no_grad():
            one = attn(q, k, v)[0][:, rows].reshape(1, vr, H * D)
            torch.backends.cuda.matmul.allow_tf32 = False
            ref = attention_with_lse(q[:, rows], k, v, max_score_bytes=4 << 30)[0].reshape(1, vr, H * D)
            rec["errors"]["one_gpu_vs_fp32"] = rel(one, ref)
            for R, U in meshes:
                ru = RingUlysses(*groups[(R, U)], attn=attn)
                got = ru(*loc, seq_len=S)[:, :vr]
                key = f"ring{R}_x_ulysses{U}"
                rec["errors"][key] = {"vs_one_gpu": rel(got, one), "vs_fp32": rel(got, ref),
                                      "max_abs_vs_one_gpu": (got.float() - one.float()).abs().max().item(),
                                      "bytes": ru.last_bytes}
            del ref, one, got

        # ---- time
        ua = UlyssesAttention(None, padding="padded")
        fns = {"one_gpu": lambda: attn(q, k, v),
               f"ulysses{W}": lambda: ua(*loc, lambda a, b, c: attn(a, b, c)[0], seq_len=S)}
        rus = {m: RingUlysses(*groups[m], attn=attn) for m in meshes}
        for (R, U), ru in rus.items():
            fns[f"ring{R}_x_ulysses{U}"] = lambda ru=ru: ru(*loc, seq_len=S)
        with torch.no_grad():
            t = interleaved_ms(fns, ROUNDS, WARM, before=dist.barrier)
        rec["ms"] = {k_: statistics.median(v_) for k_, v_ in t.items()}
        rec["ms_all_rounds"] = t
        rec["speedup_ring_vs_ulysses"] = {k_: rec["ms"][f"ulysses{W}"] / rec["ms"][k_]
                                          for k_ in rec["ms"] if k_.startswith("ring")}

        # ---- parts of the pure ring (R = W): one transfer, one block attention, one merge
        L = S_loc
        kb, vb = loc[1].contiguous(), loc[2].contiguous()
        kin, vin = torch.empty_like(kb), torch.empty_like(vb)
        ring = RingAttention(groups[(W, 1)][0], attn=attn)

        def transfer():
            for w in ring._rotate(kb, vb, kin, vin, 0):
                w.wait()

        with torch.no_grad():
            rec["parts_ms"]["ring_transfer"] = median_ms(transfer, before=dist.barrier)
            rec["parts_ms"]["block_attention"] = median_ms(lambda: attn(loc[0], kb, vb))
            o, lse = attn(loc[0], kb, vb)

            def merge():
                m = LseMerge()
                m.add(o, lse)
                m.add(o, lse)
                return m.result(torch.bfloat16)

            rec["parts_ms"]["merge_two_blocks"] = median_ms(merge)
        blk_bytes = 2 * kb.numel() * kb.element_size()
        rec["parts_ms"]["ring_transfer_gbps"] = blk_bytes / (rec["parts_ms"]["ring_transfer"] * 1e-3) / 1e9
        block_tflops = 4 * L * L * H * D / (rec["parts_ms"]["block_attention"] * 1e-3) / 1e12
        rec["parts_ms"]["block_attention_tflops"] = block_tflops
        cost = ring_ulysses_cost(S, ring=W, ulysses=1, attention_tflops=block_tflops,
                                 ring_gbps=rec["parts_ms"]["ring_transfer_gbps"], hbm_tbps=4.15)
        rec["plan_estimate"] = cost.as_dict()
        rec["plan_lines"] = describe(cost)
        result["runs"].append(rec)
        if rank == 0:
            keys = ("S", "errors", "ms", "speedup_ring_vs_ulysses", "parts_ms")
            print(json.dumps({k_: rec[k_] for k_ in keys}), flush=True)
        del q, k, v, loc, kb, vb, kin, vin, o, lse
        torch.cuda.empty_cache()
    if rank == 0:
        os.makedirs(OUT, exist_ok=True)
        path = os.path.join(OUT, f"ring-nccl-x{W}.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        print("wrote", path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
