"""vae_tiles' FP8 decode (`tile_dtype` fp8): the ViT decoder blocks' six linears as FP8 GEMMs. Lossy.

Scope: block.LINEARS of every MiniMaxH3VideoTransformerBlock; the rest of the decoder keeps its dtype.
Install quantises each weight once, from the float16 tensor the float16 decode computes with
(`weight.to(float16)` on the weight's device; after vae_precision's fp16 cast that is the parameter itself):
e4m3 codes with one fp32 scale per output channel (quant.fp8.quantize_weight: scale = amax/448, codes =
w/scale), the bias as its float16 cast. The module parameters stay as they are (float32, or float16
after the fp16 cast), so the device holds 1 byte per weight more; uninstall drops the codes and nothing
else changed.

Per block call, `route(x)`: where the decoder computes in float16 on the weights' device with no autograd
for x (float16 linears without autocast, or FP16 autocast: weights.fp16_compute_reason) the block runs every linear as
`fp8_linear(x, lin)`: x (float16) cast to e4m3 with one scale per row (scale = 448/amax of the row, 1 where amax is 0;
the one-pass Triton cast where its check passes, its torch reference otherwise, same codes: counted
`vae_tiles.fp8_rows`), then quant.fp8_rowwise's rowwise GEMM, `torch._scaled_mm(codes, w.t(), scale_a (M, 1), scale_b
(1, N), bias, out_dtype=float16)` on CUDA SM89+ with torch >= 2.10, else its fp32 emulation of the same numerics (one
fp16 rounding at the end; counted `vae_tiles.fp8_gemm.fused` / `.fallback` with the reason, per GEMM).
Any other call (float32 compute, autocast at another dtype, another device, autograd) runs diffusers'
path on the parameters as they are, exact, counted once per block call as a `vae_tiles.fp8_gemm` fallback.
Error: every e4m3 operand carries a relative rounding error <= 2^-4 (3 mantissa bits); the plan states
the recipe's PSNR/SSIM budget and benchmarks/vae.py measures the decoded frames' PSNR against eager.
Changed linear parameters (replaced, moved, cast, edited) while installed raise InstallError: the codes
would no longer describe them.
"""

from __future__ import annotations

import torch

from h3plan.levers import counter
from h3plan.errors import InstallError
from h3plan.runtime.quant.fp8 import FP8Linear, quantize_weight
from h3plan.runtime.quant.fp8_rowwise import fp8_linear_codes, quantize_activation_rows
from h3plan.runtime.guards import count_route

from .weights import FP16, fp16_compute_reason

COUNTER = counter("tile", "fp8_gemm")
ROWS_COUNTER = counter("tile", "fp8_rows")


def fp8_linear(x: torch.Tensor, lin: FP8Linear) -> torch.Tensor:
    """x (..., K) float16 -> (..., N) float16 through e4m3 rows and lin's e4m3 weights (module doc)."""
    codes, descale = quantize_activation_rows(x, counter=ROWS_COUNTER)
    return fp8_linear_codes(codes, descale, lin, FP16, counter=COUNTER)


def quantize_linear(module: torch.nn.Linear) -> FP8Linear:
    """The FP8 GEMM of one block linear: per-output-channel e4m3 codes of its float16 weight, float16 bias."""
    with torch.no_grad():
        w8, scale = quantize_weight(module.weight.detach().to(FP16), "channel")
        bias = None if module.bias is None else module.bias.detach().to(FP16)
    return FP8Linear.from_quantized(w8, scale, bias)


class Fp8Gemms:
    """One block's linears as FP8 GEMMs (see the module doc)."""

    def __init__(self, fqn: str, linears: list[torch.nn.Linear]):
        self.fqn = fqn
        self.device, self.dtype = linears[0].weight.device, linears[0].weight.dtype
        self.gemms = {m: quantize_linear(m) for m in linears}
        self._seen = [(m, n, m._parameters[n], m._parameters[n].data_ptr(), m._parameters[n]._version)
                      for m in linears for n in ("weight", "bias") if m._parameters.get(n) is not None]

    @property
    def code_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for g in self.gemms.values()
                   for t in (g.weight, g.weight_scale, g.bias) if t is not None)

    def verify(self) -> None:
        for m, name, p, ptr, version in self._seen:
            q = m._parameters.get(name)
            if q is not p or q.data_ptr() != ptr or q._version != version:
                raise InstallError(f"vae_tiles.fp8: {self.fqn} linear {name} was replaced, moved, cast or edited while "
                                   "the plan is installed; its FP8 codes would be stale: uninstall and reinstall")

    def route(self, x) -> dict | None:
        """{linear: FP8Linear} when this block call runs FP8 GEMMs; else None, counted as a fallback."""
        self.verify()
        why = fp16_compute_reason(x, self.device, self.dtype)
        if why is None and torch.is_grad_enabled() and any(p.requires_grad for _, _, p, _, _ in self._seen):
            why = "autograd is recording and the linears require grad: FP8 codes give no weight gradients"
        if why is None:
            return dict(self.gemms)
        count_route(COUNTER, why)
        return None
