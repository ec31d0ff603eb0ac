"""Shared by the profiling probes: GPU kernel events of a torch.profiler run, grouped by category."""
import torch

SKIP = ("nccl:",)  # profiler ranges drawn on the GPU timeline over the NCCL kernels: counted once, as their kernels


def category(name: str, table) -> str:
    """First match wins: `table` is ((category, (lower-case substrings...)), ...)."""
    low = name.lower()
    for cat, keys in table:
        if any(k.lower() in low for k in keys):
            return cat
    return "other"


def summary(prof, table, top: int = 12) -> dict:
    """busy/span ms, busy ms by category, the top kernels and the largest idle gaps of one profiled run."""
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0
          and not e.name.startswith(SKIP)]
    ev.sort(key=lambda e: e.time_range.start)
    by_cat, by_kernel, calls = {}, {}, {}
    for e in ev:
        ms, c, k = e.time_range.elapsed_us() / 1e3, category(e.name, table), e.name[:110]
        by_cat[c] = by_cat.get(c, 0.0) + ms
        by_kernel[k] = by_kernel.get(k, 0.0) + ms
        calls[k] = calls.get(k, 0) + 1
    gaps = sorted(((b.time_range.start - a.time_range.end) / 1e3, a.name[:50], b.name[:50]) for a, b in zip(ev, ev[1:]))
    return {"ops": len(ev), "busy_ms": sum(by_cat.values()), "span_ms": (ev[-1].time_range.end - ev[0].time_range.start) / 1e3,
            "by_category_ms": dict(sorted(by_cat.items(), key=lambda kv: -kv[1])),
            "top_kernels_ms": {k: [round(v, 3), calls[k]] for k, v in sorted(by_kernel.items(), key=lambda kv: -kv[1])[:top]},
            "idle_ms": sum(g for g, _, _ in gaps if g > 0),
            "largest_gaps_ms": [list(g) for g in gaps[::-1][:6]]}
