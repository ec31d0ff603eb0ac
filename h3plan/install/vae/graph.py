"""The vae_graphs lever: diffusers' ViT decoder forward replayed from CUDA graphs.

The VAE decode calls `vae.decoder` once per spatial tile and temporal chunk (28 calls for a 4-frame
latent at the released 256/64 tiles), and each call runs 36 small transformer blocks: the host, not the
GPU, sets the pace (H200: 1,479 us of host time per eager block call against 622 us of GPU work;
benchmarks/results/probes/vae-host-h200.log). `GraphedDecoder` captures the whole decoder forward once
per input signature (shape, dtype, device, autocast state) and replays it: the same kernels on the same
pointers, so the output is bit-identical to a plain call (proven on the H200 by tests/gpu).

Per call, one counted event: `vae_graphs.fused` for a replay, `vae_graphs.fallback` with the reason for
a call that runs diffusers' forward instead:
- the input is not on a CUDA device, autograd is recording, a capture is already under way on this
  stream, or torch.compile is tracing;
- autocast's weight cache is on and a decoder parameter requires grad (the cached casts would live in
  the graph's memory and go stale);
- the capture of this signature failed (the reason is kept and the signature is never retried);
- the cache already holds `max_graphs` signatures.
A graph is dropped and recaptured when a decoder parameter or buffer was replaced or moved since its
capture (a new data pointer); in-place updates need nothing (the graph reads the same memory), except
where `validate` (the installer passes the FP8 VAE GEMMs' check) raises first: their e4m3 codes would be
stale.

Memory: all graphs of one GraphedDecoder capture into one shared pool (torch.cuda.graph_pool_handle,
made at the first capture), so the pool is sized by the largest signature's decoder call, not the sum
over tile shapes; each graph's static output stays allocated in it and its static input outside it.
Sharing is safe because the graphs never overlap: each call replays one graph on the caller's current
stream and clones its output on that stream before returning, all graphs capture on torch.cuda.graph's
one capture stream, and no graph reads another's memory (an intermediate freed at the end of one
capture may be reused by the next capture, and every replay rewrites its intermediates before reading
them). Decodes interleaved on two streams without synchronisation are unsupported (they would also
share one graph's static buffers). torch keeps one cuBLAS workspace per (handle, stream) for the process; one made
by the warm-up on the side stream or inside the capture (then in the graph's pool) would outlive the graphs, and
after uninstall stay allocated on the device and pin the pool: the capture clears torch's workspaces before and
after, as Inductor's CUDA-graph trees do around theirs (the next eager GEMM makes a new one; a graph keeps the
workspace it captured with in its own pool, which only later captures into that pool reuse, never concurrently). Inner
fused-op counters (vae_ops.*) count only the warm-up and capture runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from h3plan.levers import counter
from h3plan.runtime.guards import count_route

COUNTER = counter("graphs")
MAX_GRAPHS = 32
WARMUP = 1


@dataclass
class _Entry:
    graph: Any
    static_in: torch.Tensor
    static_out: torch.Tensor
    pointers: tuple
    pool: Any = None  # the graph memory pool it captured into


def _autocast_state(device_type: str) -> tuple:
    if not torch.is_autocast_enabled(device_type):
        return (False,)
    return (True, torch.get_autocast_dtype(device_type), torch.is_autocast_cache_enabled())


def cuda_capture(fn: Callable, x: torch.Tensor, pool=None) -> _Entry:
    """Warm up `fn` on a side stream, then capture fn(static copy of x) into a CUDA graph in `pool` (None: a
    new pool, from torch.cuda.graph_pool_handle, returned in the entry for the next captures to share)."""
    static_in = x.detach().clone()
    _clear_cublas_workspaces()
    side = torch.cuda.Stream(device=x.device)
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            fn(static_in)
    torch.cuda.current_stream(x.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle() if pool is None else pool
    with torch.cuda.graph(graph, pool=pool):
        static_out = fn(static_in)
    _clear_cublas_workspaces()
    return _Entry(graph, static_in, static_out, (), pool)


def _clear_cublas_workspaces() -> None:
    """Drop torch's cached cuBLAS workspaces (module docstring: none made by a capture outlives it)."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


class GraphedDecoder:
    """Callable standing in for `decoder.forward`; `original` is the module's own bound forward; `validate`
    (optional) runs before every call and raises when the model may no longer be replayed."""

    def __init__(self, module: torch.nn.Module, original: Callable, *, capture: Callable = cuda_capture,
                 max_graphs: int = MAX_GRAPHS, validate: Callable[[], None] | None = None):
        self.module, self.original, self.capture, self.max_graphs = module, original, capture, max_graphs
        self.validate = validate
        self.pool = None  # shared by every capture (set by the first)
        self.graphs: dict[tuple, _Entry] = {}
        self.refused: dict[tuple, str] = {}
        self.captures = 0

    # ------------------------------------------------------------------ guards
    def _tensors(self) -> list[torch.Tensor]:
        return [*self.module.parameters(), *self.module.buffers()]

    def pointers(self) -> tuple:
        return tuple(t.data_ptr() for t in self._tensors())

    def device_reason(self, x) -> str | None:
        if not isinstance(x, torch.Tensor):
            return f"input is {type(x).__name__}, not a tensor"
        if x.device.type != "cuda":
            return f"CUDA graphs need a CUDA device (input on {x.device.type})"
        return None

    def reason(self, x) -> str | None:
        why = self.device_reason(x)
        if why:
            return why
        if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.module.parameters())):
            return "autograd is recording: the graph keeps no backward"
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return "a CUDA graph capture is already under way on this stream"
        if torch.compiler.is_compiling():
            return "torch.compile is tracing: it sees diffusers' forward"
        state = _autocast_state(x.device.type)
        if state[0] and state[2] and any(p.requires_grad for p in self.module.parameters()):
            return "autocast's weight cache is on and decoder parameters require grad (cached casts would go stale)"
        return None

    def key(self, x) -> tuple:
        return (tuple(x.shape), x.dtype, x.device, _autocast_state(x.device.type))

    # ------------------------------------------------------------------ call
    def _entry(self, x, key) -> _Entry | str:
        if key in self.refused:
            return self.refused[key]
        ptrs = self.pointers()
        e = self.graphs.get(key)
        if e is not None and e.pointers != ptrs:
            del self.graphs[key]  # weights replaced or moved since the capture: recapture
            e = None
        if e is None:
            if len(self.graphs) >= self.max_graphs:
                return f"graph cache full ({self.max_graphs} input signatures)"
            try:
                e = self.capture(self.original, x, self.pool)
            except Exception as exc:  # a failed capture must not take the decode down
                msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
                self.refused[key] = f"capture failed ({type(exc).__name__}: {msg})"
                return self.refused[key]
            e.pointers = ptrs
            self.pool = e.pool if self.pool is None else self.pool
            self.graphs[key] = e
            self.captures += 1
        return e

    def __call__(self, hidden_states, *args, **kwargs):
        if self.validate is not None:
            self.validate()
        if args or kwargs:
            count_route(COUNTER, "extra forward arguments: only decoder(hidden_states) is graphed")
            return self.original(hidden_states, *args, **kwargs)
        why = self.reason(hidden_states)
        e = None
        if why is None:
            e = self._entry(hidden_states, self.key(hidden_states))
            if isinstance(e, str):
                why = e
        if why is not None:
            count_route(COUNTER, why)
            return self.original(hidden_states)
        e.static_in.copy_(hidden_states)
        e.graph.replay()
        count_route(COUNTER, None)
        return e.static_out.clone()

    def release(self) -> None:
        self.graphs.clear()
        self.refused.clear()
        self.pool = None
