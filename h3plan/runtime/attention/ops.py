"""Attention backends as torch custom ops, for regions torch.compile traces.

FA4 and the cuDNN graphs are opaque to dynamo (cute DSL launches, cudnn-frontend graph execution): called as
they are, each would break the graph, and `fullgraph=True` fails. Inside a traced region `call(backend, ...)`
goes through `h3plan::attention` / `h3plan::attention_out` instead: the backend object is looked up by the
index `register` gave it at install, the op runs it eagerly at every call of the compiled graph, and its fake gives the
output's shape and dtype (`backend.out_dtype`, else q's). Outside tracing the backend is called directly.
"""

from typing import Optional

import torch

_BACKENDS: list = []


def register(backend):
    """Give `backend` its op index (`backend._h3plan_op_index`); call at install, never while tracing."""
    if getattr(backend, "_h3plan_op_index", None) is None:
        _BACKENDS.append(backend)
        backend._h3plan_op_index = len(_BACKENDS) - 1
    return backend


def _kw(descales, amax) -> dict:
    kw = {}
    if descales is not None:
        kw["descales"] = descales
    if amax is not None:
        kw["amax"] = amax
    return kw


@torch.library.custom_op("h3plan::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: int, descales: Optional[torch.Tensor],
              amax: Optional[torch.Tensor]) -> torch.Tensor:
    o = _BACKENDS[backend](q, k, v, **_kw(descales, amax))
    return o.clone() if any(o.data_ptr() == t.data_ptr() for t in (q, k, v)) else o


@attention.register_fake
def _(q, k, v, backend, descales, amax):
    dtype = getattr(_BACKENDS[backend], "out_dtype", None) or q.dtype
    return q.new_empty(q.shape, dtype=dtype)


@torch.library.custom_op("h3plan::attention_out", mutates_args=("out",))
def attention_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, backend: int,
                  descales: Optional[torch.Tensor], amax: Optional[torch.Tensor]) -> None:
    _BACKENDS[backend](q, k, v, out=out, **_kw(descales, amax))


@attention_out.register_fake
def _(q, k, v, out, backend, descales, amax):
    return None


def call(backend, q, k, v, out=None, descales=None, amax=None):
    """backend(q, k, v, out=..., descales=..., amax=...); through the custom ops while torch.compile traces."""
    if not torch.compiler.is_compiling():
        return backend(q, k, v, out=out, **_kw(descales, amax))
    i = backend._h3plan_op_index  # set by register() at install
    if out is None:
        return torch.ops.h3plan.attention(q, k, v, i, descales, amax)
    torch.ops.h3plan.attention_out(q, k, v, out, i, descales, amax)
    return out
