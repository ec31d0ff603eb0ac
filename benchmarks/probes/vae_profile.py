"""Probe (H200): why is the fused VAE decode slower than diffusers' eager decode?

Profiles one decode of a 1x24x4x48x84 latent (the released 256/64 tiles, 28 decoder calls) twice:
diffusers eager, then h3plan's `vae_ops=fused` plan. For each: GPU busy time and span, the largest idle
gaps with their neighbours, the top GPU kernels by total time, and the top host ops by self time.
Usage: python vae_profile.py [latent]
"""
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from vae import Decoder, build_vae, parse_latent, resolve_plan, tiles_only, vae_config  # noqa: E402

from h3plan.install import counters, install, reset_counters, uninstall  # noqa: E402


def summarize(prof, label):
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0]
    ev.sort(key=lambda e: e.time_range.start)
    busy = sum(e.time_range.elapsed_us() for e in ev)
    span = ev[-1].time_range.end - ev[0].time_range.start
    print(f"\n== {label}: {len(ev)} GPU ops, busy {busy / 1e3:.1f} ms, span {span / 1e3:.1f} ms")
    gaps = sorted(((b.time_range.start - a.time_range.end, a.name[:50], b.name[:50]) for a, b in zip(ev, ev[1:])),
                  reverse=True)
    idle = sum(g for g, _, _ in gaps if g > 0)
    print(f"  idle between GPU ops: {idle / 1e3:.1f} ms; gaps > 20 us: {sum(1 for g, _, _ in gaps if g > 20)}")
    for g, a, b in gaps[:6]:
        print(f"  gap {g / 1e3:7.3f} ms  after {a}  before {b}")
    tot, n = defaultdict(float), defaultdict(int)
    for e in ev:
        tot[e.name[:90]] += e.time_range.elapsed_us()
        n[e.name[:90]] += 1
    print("  top GPU kernels (total ms, calls):")
    for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:14]:
        print(f"    {v / 1e3:9.2f} ms  {n[k]:6d}  {k}")
    cpu = defaultdict(float)
    cn = defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CPU:
            cpu[e.name[:70]] += e.self_cpu_time_total
            cn[e.name[:70]] += 1
    print("  top host ops by self time (ms, calls):")
    for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])[:14]:
        print(f"    {v / 1e3:9.2f} ms  {cn[k]:6d}  {k}")


def main():
    latent = parse_latent(sys.argv[1] if len(sys.argv) > 1 else "1x24x4x48x84")
    vae = build_vae(vae_config("h3"), device="cuda")
    z = torch.randn(latent, generator=torch.Generator().manual_seed(1)).to("cuda")
    run = Decoder(vae, z)
    plan = resolve_plan("hardware=sm90 recipe=bf16 levers.vae_ops=fused", "h3")
    for label, p in (("eager", tiles_only(plan)), ("fused", plan)):
        uninstall(vae)
        install(vae, p)
        ms, _, peak = run.timed(1, 3)
        print(f"{label}: decode {ms:.1f} ms (median of 3), peak {peak:.2f} GiB", flush=True)
        reset_counters()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        print(f"{label} counters: {counters()}")
        summarize(prof, label)
    uninstall(vae)


if __name__ == "__main__":
    main()
