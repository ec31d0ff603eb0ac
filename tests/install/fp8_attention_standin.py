"""A CPU stand-in for cuDNN FP8 attention: the real CudnnFP8Backend's scale bookkeeping (its quantise step,
dynamic, from a given amax, or static), with the attention itself computed by h3plan.runtime.attention.fp8.emulate on
the e4m3 codes instead of the cuDNN graph. Rows and heads are independent in the emulation, so degree U and
degree 1 give the same bits exactly when they quantise with the same scales: what the FP8 Ulysses tests
need to see. Install with `use_standin(monkeypatch)` or `register()` (in a worker process)."""

import dataclasses

import torch

from h3plan.facts.attention import BACKENDS
from h3plan.runtime.attention import fp8 as f8
from h3plan.runtime.attention.base import shape_reason, write_out
from h3plan.runtime.attention.cudnn import CudnnFP8Backend


class EmulatedCudnnFP8(CudnnFP8Backend):
    def unavailable_reason(self, q, k=None, v=None):
        return shape_reason(q, k, v)

    def __call__(self, q, k, v, out=None, descales=None, amax=None):
        if q.dtype == f8.E4M3:
            q8, k8, v8 = q, k, v
        else:
            q8, k8, v8, descales = f8.quantize_qkv(q, k, v, descales, amax=amax)
        o = f8.emulate(q8, k8, v8, descales.to(torch.float32).reshape(3))
        return write_out(o, out)


def register():
    BACKENDS["cudnn_fp8"] = dataclasses.replace(BACKENDS["cudnn_fp8"], impl=f"{__name__}:EmulatedCudnnFP8")
