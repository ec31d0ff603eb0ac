"""Probe (2 GPUs, torchrun): where degree 2 loses against half of degree 1, and which exchange layouts and
overlaps would win it back. The scaling target: >= 1.9x at U = 2, 37,820 tokens.

    torchrun --standalone --nproc-per-node=2 benchmarks/probes/ulysses_overlap.py OUT_DIR [S]

Sections (rank 0 writes ulysses-overlap.json):

- `profile`: the installed bf16 plan at degree 1 and 2 (whole transformer, 2 real-width blocks), every GPU
  kernel's time and calls, and the torch ops that launched them (key_averages), so u2 - u1/2 names the costs
  that do not halve.
- `exchange`: a block's q/k/v exchange as the plan runs it (one (U, 3, B, S_loc, h, D) all-to-all, then three
  seq-major copies) against three per-tensor all-to-alls whose receive buffers are already seq-major; and
  the same per-tensor exchange as grouped send/recv that skips the local chunk.
- `attention`: FA4 over the whole query range vs two query halves; the output exchange of the first half
  (send/recv with the peer) overlapped with the second half's attention, on the default NCCL group and on a
  group whose stream has high priority.
- `gemm`: the q projection at S_loc rows, whole vs per-rank head halves (bitwise, time), and a half
  overlapped with a concurrent exchange.
"""
import json
import os
import statistics
import sys
import traceback

import torch
import torch.distributed as dist

from h3plan.actions.bench import Clock, interleaved, profile_summary

OUT = sys.argv[1] if len(sys.argv) > 1 else "."
S = int(sys.argv[2]) if len(sys.argv) > 2 else 37820
ROUNDS, WARM = 10, 3
H, D, DIM = 56, 128, 7168


def timed(fns):
    t = interleaved(Clock(), fns, WARM, ROUNDS, before=dist.barrier)
    return {k: round(statistics.median(v), 4) for k, v in t.items()}


def op_table(prof, top=40):
    out = []
    for a in prof.key_averages():
        dev = getattr(a, "self_device_time_total", None)
        if dev is None:
            dev = getattr(a, "self_cuda_time_total", 0)
        if dev > 0:
            out.append([a.key[:80], round(dev / 1e3, 4), a.count])
    return sorted(out, key=lambda r: -r[1])[:top]


def profile_section(doc, rank, U):
    import copy

    from torch.profiler import ProfilerActivity, profile

    import h3plan
    from h3plan.actions.bench import build_model, packed_inputs

    def plan(u):
        return h3plan.resolve_config(recipe="bf16", parallel=f"u{u}", **{"parallel.seq_len": S})

    dc = plan(1).get("model")["diffusers_config"]
    base = build_model(dc, blocks=2, device="cuda", dtype="bf16", seed=0)
    x = packed_inputs(dc, S, seed=1234, device="cuda")
    m1, m2 = copy.deepcopy(base), base
    h3plan.install(m1, plan(1))
    h3plan.install(m2, plan(U), group=dist.group.WORLD)
    fns = {"u1": lambda: m1(**x).sample, f"u{U}": lambda: m2(**x).sample}
    with torch.no_grad():
        doc["profile_ms"] = timed(fns)
        for k, fn in fns.items():
            for _ in range(2):
                fn()
            torch.cuda.synchronize()
            dist.barrier()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            doc.setdefault("kernels", {})[k] = profile_summary(prof, (), top=10**6)["top_kernels_ms"]
            doc.setdefault("ops", {})[k] = op_table(prof)


def exchange_section(doc, rank, U, group):
    S_loc, h = -(-S // U), H // U
    packed = torch.randn((U, 3, 1, S_loc, h, D), device="cuda", dtype=torch.bfloat16)
    tensor_major = packed.transpose(0, 1).contiguous()  # (3, U, 1, S_loc, h, D)
    recv = torch.empty_like(packed)
    full = [torch.empty((U, 1, S_loc, h, D), device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    peer = 1 - rank if U == 2 else None

    def fused():
        dist.all_to_all_single(recv, packed, group=group)
        return [recv[:, t].permute(1, 0, 2, 3, 4).contiguous() for t in range(3)]

    def per_tensor():
        for t in range(3):
            dist.all_to_all_single(full[t], tensor_major[t], group=group)

    def p2p():  # grouped send/recv of the remote chunks; the local chunk is written in place by the producer
        ops = []
        for t in range(3):
            ops += [dist.P2POp(dist.isend, tensor_major[t, peer], peer, group),
                    dist.P2POp(dist.irecv, full[t][peer], peer, group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    fns = {"fused_plus_copies": fused, "per_tensor_a2a": per_tensor}
    if peer is not None:
        fns["p2p_remote_only"] = p2p
    doc["exchange_ms"] = timed(fns)
    per_tensor()
    ref = fused()
    doc["exchange_same_bytes"] = all(torch.equal(full[t].view(1, U * S_loc, h, D), ref[t].view(1, U * S_loc, h, D))
                                     for t in range(3))
    mb = packed.numel() * 2 / 1e6
    doc["exchange_note"] = f"{mb:.1f} MB of q/k/v per rank, {mb * (U - 1) / U:.1f} MB leave it"


def attention_section(doc, rank, U, group):
    from h3plan.actions.bench.ops import get_backend

    fa4 = get_backend("fa4")
    S_loc, h = -(-S // U), H // U
    q, k, v = (torch.randn((1, U * S_loc, h, D), device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    recv = torch.empty((U, 1, S_loc, h, D), device="cuda", dtype=torch.bfloat16)
    peer = 1 - rank
    hp_opts = dist.ProcessGroupNCCL.Options()
    hp_opts.is_high_priority_stream = True
    hp = dist.new_group(backend="nccl", pg_options=hp_opts)
    kv = (k[:, :S], v[:, :S])

    def whole():
        fa4(q, *kv, out=out)
        dist.all_to_all_single(recv, out.view(U, 1, S_loc, h, D), group=group)

    def halves_sync():
        o = out.view(U, 1, S_loc, h, D)
        fa4(q[:, peer * S_loc:(peer + 1) * S_loc], *kv, out=o[peer])
        fa4(q[:, rank * S_loc:(rank + 1) * S_loc], *kv, out=recv[rank])
        dist.all_to_all_single(recv, o, group=group)

    def overlapped(g):
        def fn():
            o = out.view(U, 1, S_loc, h, D)
            fa4(q[:, peer * S_loc:(peer + 1) * S_loc], *kv, out=o[peer])
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, o[peer], peer, g),
                                            dist.P2POp(dist.irecv, recv[peer], peer, g)])
            fa4(q[:, rank * S_loc:(rank + 1) * S_loc], *kv, out=recv[rank])
            for w in works:
                w.wait()
        return fn

    def attn_only():
        fa4(q, *kv, out=out)

    fns = {"attn_whole": attn_only, "whole_then_a2a": whole, "halves_then_a2a": halves_sync,
           "halves_overlap": overlapped(group), "halves_overlap_hiprio": overlapped(hp)}
    with torch.no_grad():
        doc["attention_ms"] = timed(fns)
        whole()
        ref = recv.clone()
        overlapped(hp)()
        doc["attention_overlap_bitwise"] = bool(torch.equal(recv, ref))


def gemm_section(doc, rank, U, group):
    S_loc = -(-S // U)
    x = torch.randn((S_loc, DIM), device="cuda", dtype=torch.bfloat16)
    w = torch.randn((DIM, DIM), device="cuda", dtype=torch.bfloat16) * 0.02
    b = torch.randn((DIM,), device="cuda", dtype=torch.bfloat16)
    half = DIM // U
    buf = torch.randn((S_loc * (H // U) * D * 3,), device="cuda", dtype=torch.bfloat16)
    rb = torch.empty_like(buf)
    peer = 1 - rank

    def whole():
        return torch.nn.functional.linear(x, w, b)

    def halves():
        return [torch.nn.functional.linear(x, w[i * half:(i + 1) * half], b[i * half:(i + 1) * half]) for i in range(U)]

    def half_with_exchange():
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, peer, group),
                                        dist.P2POp(dist.irecv, rb, peer, group)])
        torch.nn.functional.linear(x, w[:half], b[:half])
        for wk in works:
            wk.wait()

    def exchange_only():
        for wk in dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, peer, group),
                                          dist.P2POp(dist.irecv, rb, peer, group)]):
            wk.wait()

    with torch.no_grad():
        doc["gemm_ms"] = timed({"q_proj_whole": whole, "q_proj_halves": halves, "half": lambda: halves()[0],
                                "half_with_exchange": half_with_exchange, "exchange_only": exchange_only})
        doc["gemm_halves_bitwise"] = bool(torch.equal(whole(), torch.cat(halves(), -1)))


def main():
    dist.init_process_group("nccl")
    rank, U = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    group = dist.group.WORLD
    doc = {"S": S, "U": U, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())), "errors": {}}
    for name, fn in (("exchange", exchange_section), ("attention", attention_section), ("gemm", gemm_section),
                     ("profile", profile_section)):
        try:
            (fn(doc, rank, U) if name == "profile" else fn(doc, rank, U, group))
        except Exception as e:  # noqa: BLE001 - recorded; the other sections still run
            doc["errors"][name] = "".join(traceback.format_exception_only(e)).strip()[:400]
            if rank == 0:
                traceback.print_exc()
        if rank == 0:
            print(name, json.dumps({k: v for k, v in doc.items() if k.startswith(name) or k == "errors"}), flush=True)
    if rank == 0:
        with open(os.path.join(OUT, "ulysses-overlap.json"), "w") as f:
            json.dump(doc, f, indent=1)
        for k in doc.get("kernels", {}):
            print(f"--- kernels {k}")
            for n, (ms, c) in list(doc["kernels"][k].items())[:30]:
                print(f"{ms:9.3f} ms {c:4d}  {n[:100]}")
            print(f"--- ops {k}")
            for n, ms, c in doc["ops"][k][:25]:
                print(f"{ms:9.3f} ms {c:4d}  {n}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
