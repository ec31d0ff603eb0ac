"""The one timer: both benches, action=tune and every script under benchmarks/ time through it. A progress bar, a
clock, interleaved and back-to-back repetitions (`median_ms`: their median in one call), a timer that rides inside
an installed attention backend (the block bench) and one around every forward of a module (the pipeline bench).

On a GPU every time is device time between two CUDA events; on a CPU the host clock stands in (the
bench action says those numbers mean nothing). Medians, never means: one slow repetition (a clock
ramp, an allocator hiccup) does not move the result.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable, Mapping, Sequence


def _stamp(torch, cuda: bool):
    """A point in time: a recorded CUDA event on a GPU (no sync), the host clock elsewhere."""
    if not cuda:
        return time.perf_counter()
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    return e


def _ms(a, b, cuda: bool) -> float:
    """ms between two stamps (the caller has synchronized)."""
    return a.elapsed_time(b) if cuda else (b - a) * 1e3


class Progress:
    """tqdm when installed, else a printed line at most every 2 s (and at the end)."""

    def __init__(self, total: int, desc: str):
        self.total, self.n, self._last = total, 0, 0.0
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, mininterval=1.0, ascii=True, file=sys.stderr)
        except ImportError:
            self.bar = None
            print(f"{desc}: {total} steps", flush=True)

    def step(self, what: str, n: int = 1) -> None:
        self.n += n
        if self.bar is not None:
            self.bar.set_postfix_str(what, refresh=False)
            self.bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= 2.0 or self.n >= self.total:
            self._last = now
            print(f"  [{self.n}/{self.total}] {what}", flush=True)

    def write(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Quiet:
    """Progress that says nothing (the ranks other than 0)."""

    def step(self, what: str, n: int = 1) -> None:
        pass

    def write(self, msg: str) -> None:
        pass

    def close(self) -> None:
        pass


class Clock:
    """Times one call in ms: CUDA events (synchronized) on a GPU, the host clock elsewhere. `Clock()`: the GPU's."""

    def __init__(self, torch=None, device=None):
        if torch is None:
            import torch
        self.torch, self.cuda = torch, device is None or device.type == "cuda"
        self.kind = "cuda-events" if self.cuda else "host-clock"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def __call__(self, fn: Callable[[], Any]) -> float:
        return self.timed(fn)[0]

    def timed(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        """(ms, fn's result) of one call."""
        if self.cuda:
            a, b = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
            a.record()
            out = fn()
            b.record()
            self.torch.cuda.synchronize()
            return a.elapsed_time(b), out
        t = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t) * 1e3, out


def interleaved(clock: Clock, fns: Mapping[str, Callable[[], Any]], warmup: int, iters: int,
                progress: Progress | None = None, what: str = "",
                before: Callable[[], Any] | None = None) -> dict[str, list[float]]:
    """Per name, `iters` times; rounds alternate the order (a b, b a, ...) so neither side always goes first.
    `before` (untimed, e.g. a barrier so ranks start together) runs ahead of every timed call."""
    names = list(fns)
    for i in range(warmup):
        for n in names:
            fns[n]()
        clock.sync()
        if progress:
            progress.step(f"{what} warmup {i + 1}/{warmup}")
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(iters):
        for n in (names if i % 2 == 0 else names[::-1]):
            if before is not None:
                before()
            times[n].append(clock(fns[n]))
        if progress:
            progress.step(f"{what} {i + 1}/{iters}")
    return times


def back_to_back(clock: Clock, fn: Callable[[], Any], warmup: int, iters: int, progress: Progress | None = None,
                 what: str = "", before: Callable[[], Any] | None = None, lead_us: float = 0) -> list[float]:
    """Per-call ms of `iters` calls issued back to back, events around each and one sync at the end: the
    way the plan's forward issues its attention calls (the host runs ahead, launch overhead is hidden).
    `before` (untimed, outside the events) runs ahead of every timed call: the work the call should follow.
    `lead_us`: a GPU spin of about that long after `before` (torch.cuda._sleep, ~2 GHz cycles), so the host has
    queued a short call's launches before its start event runs: the GPU's time, not the host's dispatch."""
    for i in range(warmup):
        fn()
        if progress:
            progress.step(f"{what} warmup {i + 1}/{warmup}")
    clock.sync()
    if clock.cuda:
        events = []
        for _ in range(iters):
            if before is not None:
                before()
            if lead_us:
                clock.torch.cuda._sleep(int(lead_us * 2000))
            a, b = (clock.torch.cuda.Event(enable_timing=True) for _ in range(2))
            a.record()
            fn()
            b.record()
            events.append((a, b))
        clock.sync()
        ts = [a.elapsed_time(b) for a, b in events]
    else:
        ts = []
        for _ in range(iters):
            if before is not None:
                before()
            ts.append(clock(fn))
    if progress:
        progress.step(f"{what} {iters} calls", iters)
    return ts


def median(ts: Sequence[float]) -> float | None:
    return statistics.median(ts) if ts else None


def median_ms(fn: Callable[[], Any], warmup: int = 2, iters: int = 8, before: Callable[[], Any] | None = None,
              lead_us: float = 0, clock: Clock | None = None, synced: bool = False) -> float:
    """The benchmarks' and probes' one-call timer: the median of `back_to_back` on the GPU (or `clock`);
    `synced`: of calls timed one at a time, synchronized after each (the host's launch cost included)."""
    clock = clock or Clock()
    if synced:
        return statistics.median(interleaved(clock, {"": fn}, warmup, iters, before=before)[""])
    return statistics.median(back_to_back(clock, fn, warmup, iters, before=before, lead_us=lead_us))


# ---------------------------------------------------------------- attention inside the plan


class BackendTimer:
    """Device events around every call of an installed attention backend, no sync inside.

    `attach` gives the backend object a subclass of its own class whose `__call__` is timed (so
    isinstance checks in the processor still hold); `detach` puts the class back. With `capture` set,
    the first call's tensor arguments are cloned, so the backend can later be timed standalone on
    exactly what the plan handed it.
    """

    def __init__(self, torch, cuda: bool):
        self.torch, self.cuda = torch, cuda
        self.events: list = []
        self.captured = None
        self.capture = False
        self._attached: list = []

    def attach(self, backend) -> None:
        cls, timer = type(backend), self

        def __call__(self_, *args, **kwargs):
            return timer.call(cls.__call__, self_, args, kwargs)

        backend.__class__ = type(f"Timed{cls.__name__}", (cls,), {"__call__": __call__, "__module__": cls.__module__})
        self._attached.append((backend, cls))

    def detach(self) -> None:
        for backend, cls in self._attached:
            backend.__class__ = cls
        self._attached = []

    def original(self, backend):
        """The backend's untimed __call__ (bound)."""
        for b, cls in self._attached:
            if b is backend:
                return lambda *a, **k: cls.__call__(b, *a, **k)
        return backend

    def call(self, fn, backend, args, kwargs):
        if self.capture and self.captured is None:
            clone = lambda x: x.detach().clone() if isinstance(x, self.torch.Tensor) else x  # noqa: E731
            self.captured = (backend, tuple(clone(a) for a in args), {k: clone(v) for k, v in kwargs.items()})
        a = _stamp(self.torch, self.cuda)
        out = fn(backend, *args, **kwargs)
        self.events.append((a, _stamp(self.torch, self.cuda)))
        return out

    def drain_ms(self) -> list[float]:
        """Per-call ms of the calls since the last drain (the caller has synchronized)."""
        ts = [_ms(a, b, self.cuda) for a, b in self.events]
        self.events = []
        return ts


# ---------------------------------------------------------------- every forward of a module


class ForwardTimer:
    """Each forward of a module between two stamps, while `on`: `module.register_forward_pre_hook(t.pre)` and
    `register_forward_hook(t.post)`. CUDA events on a GPU (no sync until `seconds`), else the host clock."""

    def __init__(self, torch, cuda: bool):
        self.torch, self.cuda, self.spans, self.on = torch, cuda, [], False

    def pre(self, module, args, kwargs=None):
        if self.on:
            self.spans.append([_stamp(self.torch, self.cuda), None])

    def post(self, module, args, out):
        if self.on and self.spans and self.spans[-1][1] is None:
            self.spans[-1][1] = _stamp(self.torch, self.cuda)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def seconds(self) -> list[float]:
        self.sync()
        return [_ms(a, b, self.cuda) / 1e3 for a, b in self.spans]


# ---------------------------------------------------------------- kernels on the GPU timeline (torch.profiler)


def kernel_events(prof, skip: tuple[str, ...] = ("nccl:",)) -> list:
    """The GPU kernels of a torch.profiler run, in start order; names starting with `skip` (lower case) left out:
    NCCL's profiler ranges are drawn over its own kernels, so they are counted once, as the kernels."""
    from torch.autograd import DeviceType

    ev = [e for e in prof.events() if e.device_type == DeviceType.CUDA and e.time_range.elapsed_us() > 0
          and not e.name.lower().startswith(skip)]
    return sorted(ev, key=lambda e: e.time_range.start)


def category(name: str, table, default: str = "other") -> str:
    """First match wins: `table` is ((category, (substrings...)), ...), matched in lower case."""
    low = name.lower()
    return next((cat for cat, keys in table if any(k.lower() in low for k in keys)), default)


def profile_summary(prof, table, top: int = 12) -> dict:
    """busy/span ms, busy ms by category, the top kernels and the largest idle gaps of one profiled run."""
    ev = kernel_events(prof)
    by_cat: dict[str, float] = {}
    by_kernel: dict[str, float] = {}
    calls: dict[str, int] = {}
    for e in ev:
        ms, c, k = e.time_range.elapsed_us() / 1e3, category(e.name, table), e.name[:110]
        by_cat[c] = by_cat.get(c, 0.0) + ms
        by_kernel[k] = by_kernel.get(k, 0.0) + ms
        calls[k] = calls.get(k, 0) + 1
    gaps = sorted(((b.time_range.start - a.time_range.end) / 1e3, a.name[:50], b.name[:50]) for a, b in zip(ev, ev[1:]))
    return {"ops": len(ev), "busy_ms": sum(by_cat.values()),
            "span_ms": (ev[-1].time_range.end - ev[0].time_range.start) / 1e3,
            "by_category_ms": dict(sorted(by_cat.items(), key=lambda kv: -kv[1])),
            "top_kernels_ms": {k: [round(v, 3), calls[k]] for k, v in sorted(by_kernel.items(),
                                                                             key=lambda kv: -kv[1])[:top]},
            "idle_ms": sum(g for g, _, _ in gaps if g > 0), "largest_gaps_ms": [list(g) for g in gaps[::-1][:6]]}
