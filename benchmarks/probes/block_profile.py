"""Probe (H200): where does a planned block spend its time? Profiles one block forward of the bf16
(S=37,820) and fp8 (S=19,000) plans and prints GPU busy time, the idle gaps between kernels (with the
kernels on either side), host-device syncs, and the top kernels. Usage: python block_profile.py"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import h3plan
from h3plan.actions.bench.measure import capture_block_inputs, run_stack
from h3plan.actions.inputs import build_model, packed_inputs


def profile_plan(recipe: str, S: int):
    plan = h3plan.resolve_config(hardware="sm90", recipe=recipe, parallel="u1")
    cfg = plan.get("model")["diffusers_config"]
    model = build_model(cfg, blocks=1, device="cuda")
    x = capture_block_inputs(torch, model, packed_inputs(cfg, S, device="cuda"))
    h3plan.install(model, plan)
    blocks = model.transformer_blocks
    with torch.no_grad():
        for _ in range(3):
            run_stack(blocks, *x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run_stack(blocks, *x)
            torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0]
    ev.sort(key=lambda e: e.time_range.start)
    busy = sum(e.time_range.elapsed_us() for e in ev)
    span = ev[-1].time_range.end - ev[0].time_range.start
    print(f"\n== {recipe} S={S}: {len(ev)} GPU ops, busy {busy / 1e3:.2f} ms, span {span / 1e3:.2f} ms")
    gaps = []
    for a, b in zip(ev, ev[1:]):
        g = b.time_range.start - a.time_range.end
        if g > 50:
            gaps.append((g, a.name[:60], b.name[:60]))
    for g, a, b in sorted(gaps, reverse=True)[:10]:
        print(f"  gap {g / 1e3:7.3f} ms  after {a}  before {b}")
    syncs = [e for e in prof.events() if any(s in e.name for s in ("Synchronize", "cudaMemcpy", "item", "_local_scalar"))]
    for e in syncs[:15]:
        print(f"  host sync-ish: {e.name} {e.cpu_time_total / 1e3:.3f} ms")
    for e in sorted(ev, key=lambda e: -e.time_range.elapsed_us())[:12]:
        print(f"  {e.time_range.elapsed_us() / 1e3:8.3f} ms  {e.name[:110]}")
    h3plan.uninstall(model)
    del model
    torch.cuda.empty_cache()


profile_plan("bf16", int(sys.argv[1]) if len(sys.argv) > 1 else 37820)
profile_plan("fp8", 19000)
