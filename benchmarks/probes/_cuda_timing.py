"""Shared by the probes: the median of CUDA-event times of `fn`, after untimed warm-up calls."""
import statistics

import torch


def median_ms(fn, warmup=2, iters=8, before=None, lead_us=0):
    """`before` (untimed) runs ahead of every timed call: what the call should follow, e.g. a GEMM burst.
    lead_us: a GPU spin of about that long (torch.cuda._sleep) after `before`, so the host has queued the call's
    launches before the start event runs, as in a model's forward where the GPU runs behind the host: the time is
    then the GPU's, not the host's Python and launch overhead (which a call of a ~0.1 ms op otherwise includes)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = []
    for _ in range(iters):
        if before is not None:
            before()
        if lead_us:
            torch.cuda._sleep(int(lead_us * 2000))  # cycles at about 2 GHz
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        ev.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def events(fn):
    """(start, end) CUDA events recorded around one call of `fn` (read them after a synchronize)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    return a, b


def interleaved_ms(fns: dict, rounds: int, warmup: int = 2, before=None) -> dict:
    """{name: [ms per round]}: every round calls each of `fns` once, in order, with CUDA events around
    each call; `before` (untimed, e.g. a barrier) runs ahead of every timed call."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    ev = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            if before is not None:
                before()
            ev[k].append(events(fn))
    torch.cuda.synchronize()
    return {k: [a.elapsed_time(b) for a, b in v] for k, v in ev.items()}
