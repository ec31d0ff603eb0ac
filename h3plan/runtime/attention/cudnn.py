"""cuDNN fused flash attention (BF16 and per-tensor FP8) through cudnn-frontend Python graphs.

Graphs are built once per (kind, device, shapes, strides, dtypes) and cached with their tensor handles;
each call only binds pointers and executes on torch's current stream. Q/K/V/O are declared in the
(B, H, S, D) dim order with the strides of the (B, S, H, D) tensors, so no transposes are copied, and an
output view of a larger padded buffer (prefix in place) is written directly through its strides.

- `CudnnBF16Backend`: `sdpa(is_inference=True, attn_scale=1/sqrt(D))`, fp32 softmax/accumulation,
  bf16/fp16 output. Where these graphs ran: docs/measurements.md.
- `CudnnFP8Backend`: `sdpa_fp8` on e4m3 Q/K/V with per-tensor descales (dynamic from amax, static
  from a table, or pre-quantised codes from the fused QK-norm+RoPE+FP8 kernel), scale_s = 448 for P.
  On SM90 the output must be FP8: scale_o = 1 / descale_v (see h3plan.runtime.attention.fp8) and the result is
  dequantised to bf16. BF16 output is used where the hardware
  facts allow it (hardware.cudnn.fp8_output_dtypes, bf16_output_min_version: SM100+ with cuDNN >= 9.13);
  where that path ran is the YAML's verified facts (specs/cudnn_fp8.py's `untested`, the installer's note).
  Lossy: budgeted by the recipe.

What each takes and needs from the hardware facts is declared in specs/cudnn_bf16.py and specs/cudnn_fp8.py.
"""

from __future__ import annotations

import math

import torch

from h3plan.runtime.kernels.fp8 import dequantize, dequantize_check, dequantize_ref

from . import fp8 as f8
from h3plan.facts.hardware import cudnn_fp8_bf16_output, cudnn_fp8_version_problem, for_capability

from .base import (AttentionBackend, cuda_reason, device_cc, device_facts, dtype_reason, facts_reason, shape_reason,
                   write_out)
from h3plan.facts.attention.specs import cudnn_bf16, cudnn_fp8

_HANDLES: dict[int, object] = {}
_GRAPHS: dict[tuple, "_Graph"] = {}


def _cudnn():
    import cudnn

    return cudnn


def _handle(device: torch.device):
    cudnn = _cudnn()
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _HANDLES:
        with torch.cuda.device(idx):
            _HANDLES[idx] = cudnn.create_handle()
    h = _HANDLES[idx]
    cudnn.set_stream(h, torch.cuda.current_stream(idx).cuda_stream)
    return h


def _bhsd(t: torch.Tensor) -> torch.Tensor:
    """(B, S, H, D) tensor -> the (B, H, S, D) view cuDNN is told about (same storage, same first element).

    Strides of size-1 dims are meaningless; they are set to their dense value so that, e.g., a batch-1
    prefix view of a padded buffer and a plain contiguous tensor share one cached graph (same kernel)."""
    v = t.permute(0, 2, 1, 3)
    stride, span = list(v.stride()), 1
    for i in range(3, -1, -1):
        if v.shape[i] == 1:
            stride[i] = span
        span = max(span, stride[i] * v.shape[i])
    return v.as_strided(v.shape, stride) if stride != list(v.stride()) else v


def _sig(t: torch.Tensor) -> tuple:
    return tuple(t.shape), tuple(t.stride()), t.dtype


class _Graph:
    """One built cuDNN graph: its tensor handles, by role, and its workspace size."""

    def __init__(self, graph, tensors: dict):
        self.graph, self.tensors = graph, tensors
        self.workspace = graph.get_workspace_size()

    def run(self, bound: dict, device) -> None:
        pack = {self.tensors[role]: t for role, t in bound.items()}
        ws = torch.empty(max(1, self.workspace), dtype=torch.uint8, device=device)
        self.graph.execute(pack, ws, handle=_handle(device))  # _handle: torch's current stream


_CONST: dict = {}


def _const(value: float, device) -> torch.Tensor:
    """A cached (1, 1, 1, 1) fp32 device scalar (scale_s, descale_s, unit scale_o)."""
    key = (value, device)
    if key not in _CONST:
        _CONST[key] = torch.full((1, 1, 1, 1), value, dtype=torch.float32, device=device)
    return _CONST[key]


def _finalize(g):
    cudnn = _cudnn()
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()


def _io_type(dtype):
    dt = _cudnn().data_type
    return {torch.bfloat16: dt.BFLOAT16, torch.float16: dt.HALF, f8.E4M3: dt.FP8_E4M3}[dtype]


def _tensor(g, view: torch.Tensor, dtype=None):
    return g.tensor(dim=list(view.shape), stride=list(view.stride()), data_type=_io_type(dtype or view.dtype))


def _bf16_graph(q, k, v, o) -> _Graph:
    key = ("bf16", q.device, _sig(q), _sig(k), _sig(v), _sig(o))
    if key not in _GRAPHS:
        cudnn, handle = _cudnn(), _handle(q.device)
        g = cudnn.pygraph(io_data_type=_io_type(q.dtype), intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
        tq, tk, tv = _tensor(g, q), _tensor(g, k), _tensor(g, v)
        to, _ = g.sdpa(q=tq, k=tk, v=tv, is_inference=True, attn_scale=1.0 / math.sqrt(q.shape[-1]))
        to.set_output(True).set_dim(list(o.shape)).set_stride(list(o.stride())).set_data_type(_io_type(o.dtype))
        _finalize(g)
        _GRAPHS[key] = _Graph(g, {"q": tq, "k": tk, "v": tv, "o": to})
    return _GRAPHS[key]


def _fp8_graph(q8, k8, v8, o) -> _Graph:
    key = ("fp8", q8.device, _sig(q8), _sig(k8), _sig(v8), _sig(o))
    if key not in _GRAPHS:
        cudnn, handle = _cudnn(), _handle(q8.device)
        dt = cudnn.data_type
        g = cudnn.pygraph(io_data_type=dt.FP8_E4M3, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT,
                          handle=handle)
        tq, tk, tv = _tensor(g, q8), _tensor(g, k8), _tensor(g, v8)
        sc = {n: g.tensor(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=dt.FLOAT)
              for n in ("dq", "dk", "dv", "ds", "ss", "so")}
        to, _, tas, tao = g.sdpa_fp8(q=tq, k=tk, v=tv, descale_q=sc["dq"], descale_k=sc["dk"], descale_v=sc["dv"],
                                     descale_s=sc["ds"], scale_s=sc["ss"], scale_o=sc["so"], is_inference=True,
                                     attn_scale=1.0 / math.sqrt(q8.shape[-1]))
        to.set_output(True).set_dim(list(o.shape)).set_stride(list(o.stride())).set_data_type(_io_type(o.dtype))
        for t in (tas, tao):
            t.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(dt.FLOAT)
        _finalize(g)
        _GRAPHS[key] = _Graph(g, {"q": tq, "k": tk, "v": tv, "o": to, "amax_s": tas, "amax_o": tao, **sc})
    return _GRAPHS[key]


def _runtime_reason(q, spec) -> str | None:
    """Device, hardware facts (the spec's needs), dtype, head dim, the frontend import."""
    reason = shape_reason(q) or cuda_reason(q, spec.label)
    if reason:
        return reason
    facts, why = device_facts(device_cc(q))
    if facts is None:
        return f"{spec.label}: {why}"
    reason = facts_reason(spec, facts) or dtype_reason(spec, q)
    if reason:
        return reason
    D = q.shape[-1]
    if not (D <= 256 and D % 8 == 0):
        return f"{spec.label} needs head_dim <= 256 divisible by 8, got {D}"
    try:
        _cudnn()
    except Exception as exc:
        return f"cudnn-frontend import failed ({type(exc).__name__}: {exc})"
    return None


def _build_reason(build) -> str | None:
    try:
        build()
    except Exception as exc:
        return f"cuDNN declined the graph: {str(exc).strip().splitlines()[0][:300]}"
    return None


class CudnnBF16Backend(AttentionBackend):
    name = "cudnn_bf16"

    def unavailable_reason(self, q, k=None, v=None) -> str | None:
        k = q if k is None else k
        v = k if v is None else v
        return (shape_reason(q, k, v) or _runtime_reason(q, cudnn_bf16.SPEC)
                or _build_reason(lambda: _bf16_graph(_bhsd(q), _bhsd(k), _bhsd(v), _bhsd(torch.empty_like(q)))))

    def __call__(self, q, k, v, out=None):
        o = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
        if o.shape != q.shape or o.dtype != q.dtype or o.stride(-1) != 1:
            return write_out(self(q, k, v), out)
        g = _bf16_graph(_bhsd(q), _bhsd(k), _bhsd(v), _bhsd(o))
        g.run({"q": _bhsd(q), "k": _bhsd(k), "v": _bhsd(v), "o": _bhsd(o)}, q.device)
        return o


class CudnnFP8Backend(AttentionBackend):
    """FP8 attention. `__call__(q, k, v, out=None, descales=None, amax=None)`: bf16 q/k/v are quantised here
    (dynamic scales from their own amax or from `amax` (3,) fp32, the whole sequence's under Ulysses; or
    `descales` (3,) fp32 for static ones); e4m3 codes need `descales`."""

    name = "cudnn_fp8"
    out_dtype = torch.bfloat16

    _bf16_out: dict = {}

    @classmethod
    def bf16_output(cls, device) -> bool:
        """BF16 output where the device's hardware facts allow it with the runtime cuDNN (SM100+, >= 9.13); FP8
        output elsewhere."""
        if device not in cls._bf16_out:
            facts = for_capability(torch.cuda.get_device_capability(device))
            cls._bf16_out[device] = facts is not None and cudnn_fp8_bf16_output(facts, _cudnn().backend_version())
        return cls._bf16_out[device]

    def unavailable_reason(self, q, k=None, v=None) -> str | None:
        reason = shape_reason(q, k, v) or _runtime_reason(q, cudnn_fp8.SPEC)
        if reason:
            return reason
        why = cudnn_fp8_version_problem(device_facts(device_cc(q))[0], _cudnn().backend_version())
        if why:
            return f"runtime {why}"
        k = q if k is None else k
        v = k if v is None else v
        e = lambda t: torch.empty(t.shape, dtype=f8.E4M3, device=t.device)  # noqa: E731
        return _build_reason(lambda: _fp8_graph(_bhsd(e(q)), _bhsd(e(k)), _bhsd(e(v)), _bhsd(self._o(q))))

    def _o(self, q):
        dtype = torch.bfloat16 if self.bf16_output(q.device) else f8.E4M3
        return torch.empty(q.shape, dtype=dtype, device=q.device)

    def __call__(self, q, k, v, out=None, descales=None, amax=None):
        if q.dtype == f8.E4M3:
            if descales is None:
                raise ValueError("cudnn_fp8: e4m3 q/k/v need their descales (3,) fp32")
            q8, k8, v8 = q, k, v
        else:
            q8, k8, v8, descales = f8.quantize_qkv(q, k, v, descales, amax=amax)
        descales = descales.to(device=q.device, dtype=torch.float32).reshape(3)
        o = self._o(q)
        direct = o.dtype == torch.bfloat16 and out is not None and out.dtype == o.dtype and out.stride(-1) == 1
        if direct:
            o = out
        one = lambda x: x.reshape(1, 1, 1, 1)  # noqa: E731
        dev = q.device
        scale_o = _const(1.0, dev) if o.dtype == torch.bfloat16 else one(1.0 / descales[2])
        amax = torch.empty(2, 1, 1, 1, device=dev)
        bound = {"q": _bhsd(q8), "k": _bhsd(k8), "v": _bhsd(v8), "o": _bhsd(o),
                 "dq": one(descales[0]), "dk": one(descales[1]), "dv": one(descales[2]),
                 "ds": _const(1.0 / f8.E4M3_MAX, dev), "ss": _const(f8.E4M3_MAX, dev), "so": scale_o,
                 "amax_s": amax[0:1], "amax_o": amax[1:2]}
        _fp8_graph(bound["q"], bound["k"], bound["v"], bound["o"]).run(bound, q.device)
        if direct:
            return out
        if o.dtype == f8.E4M3:  # SM90: dequantise with descale_o = 1 / scale_o = descale_v
            d = descales[2:3]
            fused = dequantize_check(o, d) is None  # one pass instead of torch's three
            res = dequantize(o, d) if fused else dequantize_ref(o, d)
            return write_out(res, out)
        return write_out(o, out)

