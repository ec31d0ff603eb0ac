"""Shared by the probes: the median of CUDA-event times of `fn`, after untimed warm-up calls."""
import statistics

import torch


def median_ms(fn, warmup=2, iters=8, before=None):
    """`before` (untimed) runs ahead of every timed call: what the call should follow, e.g. a GEMM burst."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = []
    for _ in range(iters):
        if before is not None:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        ev.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)
