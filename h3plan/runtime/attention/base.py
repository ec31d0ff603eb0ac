"""The attention backend interface and the checks every backend shares.

A backend computes non-causal, unmasked softmax attention with scale 1/sqrt(D) on (B, S, H, D)
tensors (the layout diffusers' processors hand to `dispatch_attention_fn`) and returns (B, Sq, H, D):

- `unavailable_reason(q, k, v) -> str | None`: runtime: import, the device's hardware facts (the same
  conf/hardware YAML the planner reads, picked by compute capability: h3plan.facts.hardware), dtype, head dim.
  The installer's processor calls it per call and routes a refused call to diffusers' own attention.
- `__call__(q, k, v, out=None)`: the attention. Sq may be smaller than Skv (Ulysses padded queries).
  `out` (optional, (B, Sq, H, D), any strides with a unit last stride) receives the result in place
  where the backend can write through a strided view (cuDNN); other backends copy into it.
- `out_dtype`: dtype of the result (None: q's dtype).

What a backend takes and needs is declared once, in its `BackendSpec` (h3plan/facts/attention/specs/); the runtime
checks here read that declaration (`facts_reason`, `dtype_reason`) against the device's hardware facts.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from h3plan.facts.hardware import for_capability


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "e4m3": torch.float8_e4m3fn}


class AttentionBackend:
    name = "base"
    out_dtype = None

    def unavailable_reason(self, q, k=None, v=None) -> str | None:
        return shape_reason(q, k, v)

    def __call__(self, q, k, v, out=None):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def shape_reason(q, k=None, v=None) -> str | None:
    """q (B, Sq, H, D); k, v (B, Skv, H, D) with the same B, H, D and dtype/device as q."""
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        return f"q must be a 4-dim (B, S, H, D) tensor, got {getattr(q, 'shape', type(q))}"
    for name, t in (("k", k), ("v", v)):
        if t is None:
            continue
        if t.dim() != 4 or (t.shape[0], t.shape[2], t.shape[3]) != (q.shape[0], q.shape[2], q.shape[3]):
            return f"{name} shape {tuple(t.shape)} does not match q {tuple(q.shape)} in B, H, D"
        if t.dtype != q.dtype or t.device != q.device:
            return f"{name} is {t.dtype} on {t.device}, q is {q.dtype} on {q.device}"
    if k is not None and v is not None and k.shape != v.shape:
        return f"k {tuple(k.shape)} and v {tuple(v.shape)} differ"
    return None


def cuda_reason(q, name: str, min_cc: tuple[int, int] | None = None) -> str | None:
    if q.device.type != "cuda":
        return f"{name} needs a CUDA device (tensors on {q.device.type})"
    cc = torch.cuda.get_device_capability(q.device)
    if min_cc is not None and cc < min_cc:
        return f"{name} needs SM{min_cc[0]}{min_cc[1]}+ (device is SM{cc[0]}{cc[1]})"
    return None


def device_cc(q) -> tuple[int, int]:
    return torch.cuda.get_device_capability(q.device)


def device_facts(cc: tuple[int, int]) -> tuple[Mapping[str, Any] | None, str | None]:
    """(the hardware facts of a device of compute capability `cc`, None) or (None, why there are none)."""
    facts = for_capability(cc)
    if facts is None:
        return None, f"h3plan has no hardware facts for SM{cc[0]}{cc[1]} (conf/hardware)"
    return facts, None


def facts_reason(spec, facts: Mapping[str, Any]) -> str | None:
    """The first capability fact `spec` needs (BackendSpec.needs) that the device's hardware facts deny, as a reason."""
    for f in spec.needs:
        if not f.value(facts):
            return f"{spec.label} is not available on {facts['name']} (hardware.{f.path}=false; {f.source(facts)})"
    return None


def dtype_reason(spec, q) -> str | None:
    """q's dtype against the dtypes `spec` takes (BackendSpec.dtypes)."""
    if q.dtype not in {DTYPES[d] for d in spec.dtypes}:
        return f"{spec.label} takes {'/'.join(spec.dtypes)} q/k/v, got {q.dtype}"
    return None


def write_out(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return result
    if out.shape != result.shape or out.dtype != result.dtype:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} does not fit the result {tuple(result.shape)} "
                         f"{result.dtype}")
    out.copy_(result)
    return out


__all__ = ["DTYPES", "AttentionBackend", "shape_reason", "cuda_reason", "device_cc", "device_facts", "facts_reason",
           "dtype_reason", "write_out"]
