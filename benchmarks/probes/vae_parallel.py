"""Probe (2+ GPUs, no torchrun): one VAE decode spread over U GPUs (vae_parallel) vs one GPU.

    python benchmarks/probes/vae_parallel.py --out benchmarks/results/probes/vae-parallel-h200x2.json
    python benchmarks/probes/vae_parallel.py --out /tmp/vp.json --latent 1x24x12x48x84 --iters 2

Spawns `--world` processes (NCCL over tcp://127.0.0.1, one GPU each). The released config (conf/vae/h3.yaml)
with seeded fp32 weights (benchmarks/vae.py build_vae, broadcast from rank 0), decoded under
torch.autocast(float16) and no_grad, for two lever sets: diffusers' ops, and the VAE plan (vae_ops fused +
vae_graphs on). Per set, every rank times the one-GPU decode on its own GPU, then the decode with
vae_parallel installed over all ranks (ranks start each timed decode together after a barrier), and checks
the U-GPU video bitwise against its one-GPU video and against diffusers' one-GPU decode. Times are CUDA
events (median of --iters after --warmup) with the host wall clock beside them; the parallel decode is
split into its gather (the two all_gathers, including any wait for a slower rank) and its stitch
(diffusers' _decode answered from the gather), the rest being this rank's decoder calls. Peak memory:
max_memory_allocated over one decode, per rank (weights, with the plan's decoder-block linears in float16, and the
latent included; the reference videos are held on the host).
Rank 0 writes the JSON (every rank's record).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from h3plan.actions.bench import Clock, ForwardTimer, roles  # noqa: E402

PLAN = "hardware=sm90 recipe=bf16 levers.vae_ops=fused levers.vae_graphs=on"
COUNTED = ("vae_parallel", roles.counter(roles.VAE_GRAPHS))  # the spread decode's and graph replays'


def _phases(vp, torch):
    """Time vae_parallel's gathers and its stitch on the GPU (module attributes, this process only)."""
    log = {"gather": ForwardTimer(torch, True), "stitch": ForwardTimer(torch, True)}
    gather, replay = vp._all_gather_bytes, vp.ParallelDecode._replay

    def timed(kind, fn):
        def call(*a, **k):
            log[kind].on = True
            log[kind].pre(None, a)
            out = fn(*a, **k)
            log[kind].post(None, a, out)
            return out
        return call

    vp._all_gather_bytes = timed("gather", gather)
    vp.ParallelDecode._replay = timed("stitch", replay)
    return log


def _timed(decode, warmup, iters, barrier, torch):
    for _ in range(warmup):
        barrier()
        decode()
    ms, wall, out = [], [], None
    clock, host = Clock(torch), Clock(torch, torch.device("cpu"))
    for i in range(iters):
        clock.sync()
        barrier()
        if i == iters - 1:
            torch.cuda.reset_peak_memory_stats()
        w, (m, out) = host.timed(lambda: clock.timed(decode))  # the host's wall around the GPU's events
        wall.append(w)
        ms.append(m)
    return statistics.median(ms), statistics.median(wall), out, torch.cuda.max_memory_allocated() / 2**30


def worker(rank, world, port, args):
    import torch
    import torch.distributed as dist

    import vae as bench
    from h3plan import counters, install, reset_counters, uninstall
    from h3plan.actions.bench.ops import vae_parallel as vp

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    try:
        log = _phases(vp, torch)
        vae = bench.build_vae(bench.vae_config("h3"), device="cuda", seed=0)
        for t in (*vae.parameters(), *vae.buffers()):
            dist.broadcast(t.data, 0)
        latent = bench.parse_latent(args.latent)
        z = torch.randn(latent, generator=torch.Generator().manual_seed(1)).cuda()
        run = bench.Decoder(vae, z)
        records, eager = [], None
        for name, spec in (("diffusers-ops", None), ("plan-fused-graphs", PLAN)):
            uninstall(vae)
            if spec:
                install(vae, bench.resolve_plan(spec, "h3"))
            torch.cuda.empty_cache()
            one_ms, one_wall, one, one_peak = _timed(run, args.warmup, args.iters, lambda: None, torch)
            one = one.cpu()  # held off the GPU: the peaks below count only what a decode holds
            eager = one if eager is None else eager
            undo = vp.install_parallel(vae, dist.group.WORLD)
            try:
                torch.cuda.empty_cache()
                reset_counters()
                for v in log.values():
                    v.clear()
                u_ms, u_wall, out, u_peak = _timed(run, args.warmup, args.iters, dist.barrier, torch)
                last, c = vae.__dict__["_decode"].last, counters()
            finally:
                undo()
            torch.cuda.synchronize()
            out = out.cpu()
            gather = sum(log["gather"].seconds()[-2:]) * 1e3  # the last decode: agreement + tiles
            stitch = log["stitch"].seconds()[-1] * 1e3 if log["stitch"].spans else None
            rec = {"rank": rank, "levers": name, "plan": spec, "latent": list(latent),
                   "one_gpu_ms": round(one_ms, 1), "one_gpu_wall_ms": round(one_wall, 1),
                   f"u{world}_ms": round(u_ms, 1), f"u{world}_wall_ms": round(u_wall, 1),
                   "speedup": round(one_ms / u_ms, 3), "gather_ms": round(gather, 2),
                   "stitch_ms": None if stitch is None else round(stitch, 1),
                   "bitwise_vs_one_gpu": bool(torch.equal(out, one)),
                   "bitwise_vs_diffusers": bool(torch.equal(out, eager)),
                   "peak_GiB": {"one_gpu": round(one_peak, 2), f"u{world}": round(u_peak, 2)},
                   "items": last and last["items"], "shares": last and last["shares"],
                   "gather_buffer_GiB": last and round(last["buffer_bytes"] / 2**30, 3),
                   "counters": {k: v for k, v in c.items() if k.startswith(COUNTED)}}
            print(f"[vae-parallel] rank {rank} {name}: one GPU {one_ms:.0f} ms, U={world} {u_ms:.0f} ms "
                  f"({rec['speedup']:.2f}x; gather {gather:.1f} ms, stitch {rec['stitch_ms']} ms); bitwise "
                  f"{rec['bitwise_vs_one_gpu']}/{rec['bitwise_vs_diffusers']}; peak GiB {rec['peak_GiB']}", flush=True)
            records.append(rec)
            del out, one
        uninstall(vae)
        everyone = [None] * world
        dist.all_gather_object(everyone, records)
        if rank == 0:
            import diffusers

            meta = {"device": torch.cuda.get_device_name(), "world": world, "torch": torch.__version__,
                    "diffusers": diffusers.__version__, "autocast": "float16", "warmup": args.warmup,
                    "iters": args.iters, "clock": "CUDA events (host wall beside)"}
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            doc = {**meta, "records": [r for rs in everyone for r in rs]}
            Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
            print(f"[vae-parallel] wrote {args.out}", flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--latent", default="1x24x62x48x84", help="the released latent -> video [1, 3, 209, 768, 1344]")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iters", type=int, default=1)
    args = ap.parse_args(argv)
    import torch
    import torch.multiprocessing as mp

    n = torch.cuda.device_count()
    if n < args.world:
        print(f"vae_parallel probe: needs {args.world} CUDA GPUs, found {n}", file=sys.stderr)
        return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.world, port, args), nprocs=args.world)
    records = json.loads(Path(args.out).read_text())["records"]
    return 0 if all(r["bitwise_vs_one_gpu"] and r["bitwise_vs_diffusers"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
