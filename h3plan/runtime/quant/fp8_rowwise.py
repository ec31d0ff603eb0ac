"""FP8 linears fed by activations quantised per row: codes straight from the producing kernel.

    fp8_linear_codes(codes, row_descale, lin)   lin: an h3plan.runtime.quant.fp8.FP8Linear
        out = (codes * row_descale) @ (lin.weight * lin.weight_scale).T + lin.bias, rounded once to bf16

codes (..., K) e4m3 and row_descale (..., 1) fp32 come from h3plan.runtime.kernels.fp8_producers (row r of the
activation ~= codes[r] * row_descale[r]). On CUDA with hardware.gemm.fp8 (bf16 output, K and N multiples of 16) this is
torch's rowwise-scaled FP8 GEMM, `torch._scaled_mm(codes (M, K), weight.t(),
scale_a=row_descale (M, 1), scale_b=weight_scale (1, N), bias, out_dtype=bf16)` (torch 2.11 runs it on
SM90; float16 output and bias since torch 2.10, pytorch#166744: the VAE's FP8 decoder GEMMs, h3plan/install/vae/fp8.py);
a per-tensor weight scale is expanded to (1, N). Elsewhere the call falls back to an fp32
emulation of the same numerics: both operands dequantised to fp32 (one rounding each), multiplied in
fp32 (autocast off), the bias added, rounded once; it differs from the GEMM only in accumulation order. Every
call counts `<counter>.fused` or `.fallback` (with the reason); counter `gemm_quant` unless the caller names its own.

For inputs that no producer kernel quantised (a refused producer, a bf16 tensor from elsewhere):
`quantize_activation_rows(x)` is FP8Linear's input quantisation with one scale per row -- the one-pass
cast kernels.fp8_producers.cast_rows_fp8 where its check passes, its torch reference otherwise, counted
under `fp8_act_quant` -- and gives the producers' codes bit for bit (the same y, the same scale rule), so
a fallback never changes the numbers. Inside h3plan.runtime.quant.fp8.shared_activation(x) (to_q/to_k/to_v on one
input) the codes are computed once. `fp8_linear_rows(x, lin)` chains the two; `FP8RowLinear` is an
FP8Linear whose forward does that.

A producer's codes travel to the linear as `RowCodes(codes, descale, dtype)` (dtype: the bf16/fp16 dtype the
producer's plain output would have, the GEMM's output dtype): `FP8RowLinear` takes either that or a bf16
tensor, so a call site whose producer fell back hands the linear its bf16 output and gets the same bits.

Per-row scales need no amax pass and no all-reduce: a row's scale depends on that row alone, so the
codes and the GEMM's rows are the same at every Ulysses degree (GEMM row shards keep their bits:
benchmarks/results/probes/fp8-splits-h200.json). A static scale (`act_scale`, a calibration-table number)
gives every row the same fp32 scale.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from h3plan.levers import counter
from h3plan.errors import UsageError
from h3plan.facts.hardware import gemm_rule
from h3plan.runtime.kernels.fp8 import E4M3
from h3plan.runtime.kernels.fp8_producers import cast_rows_fp8, cast_rows_fp8_check, cast_rows_fp8_ref
from h3plan.runtime.guards import run_guarded

from . import fp8 as _fp8

_FP8_FROM, _FP8_WHY = gemm_rule("fp8")  # hardware.gemm.fp8, read once (facts/hardware.py)
from .fp8 import FP8Linear, dequantize_weight

LEVER = _fp8.LEVER  # gemm_quant's counter
ACT_LEVER = counter("fp8_act_quant")  # the activation cast of a linear whose producer did not quantise its input
FP16_OUT_TORCH = "2.10"  # pytorch#166744: rowwise _scaled_mm with float16 output and bias (CUTLASS, SM90)
_ROW_KEY = "row_codes"  # shared_activation's cache entry for per-row codes


class RowCodes(NamedTuple):
    """An FP8 linear's input as a producer wrote it: codes (..., K) e4m3, descale (..., 1) fp32 (row r ~=
    codes[r] * descale[r]), and the dtype of the bf16/fp16 tensor it stands for (the GEMM's output dtype)."""

    codes: torch.Tensor
    descale: torch.Tensor
    dtype: torch.dtype


def _check_operands(codes, row_descale, lin):
    if not isinstance(lin, FP8Linear):
        raise UsageError(f"fp8_linear_codes needs an h3plan FP8Linear, got {type(lin).__name__}")
    if not isinstance(codes, torch.Tensor) or codes.dtype != E4M3 or codes.dim() < 1:
        raise UsageError(f"fp8_linear_codes: codes must be a float8_e4m3fn tensor (..., K), got "
                         f"{getattr(codes, 'dtype', type(codes).__name__)}")
    if codes.shape[-1] != lin.in_features:
        raise UsageError(f"fp8_linear_codes: codes have K={codes.shape[-1]}, the linear takes {lin.in_features}")
    want = tuple(codes.shape[:-1]) + (1,)
    ok = (isinstance(row_descale, torch.Tensor) and tuple(row_descale.shape) == want
          and row_descale.dtype == torch.float32)
    if not ok:
        raise UsageError(f"fp8_linear_codes: row_descale must be fp32 of shape {want}, got "
                         f"{getattr(row_descale, 'dtype', None)} {tuple(getattr(row_descale, 'shape', ()))}")
    if row_descale.device != codes.device:
        raise UsageError(f"fp8_linear_codes: row_descale on {row_descale.device}, codes on {codes.device}")


def rowwise_gemm_reason(codes: torch.Tensor, lin: FP8Linear, out_dtype=torch.bfloat16) -> str | None:
    """None when torch._scaled_mm's rowwise GEMM takes these operands, else the one-line reason."""
    if codes.device.type != "cuda":
        return f"FP8 GEMM needs CUDA (input on {codes.device.type})"
    if _FP8_FROM is None or torch.cuda.get_device_capability(codes.device) < _FP8_FROM:
        return _FP8_WHY
    if out_dtype not in (torch.bfloat16, torch.float16):
        return f"torch's rowwise-scaled FP8 GEMM writes bf16 or float16, asked for {out_dtype}"
    if out_dtype == torch.float16 and torch.torch_version.TorchVersion(torch.__version__) < FP16_OUT_TORCH:
        return (f"torch {torch.__version__}'s rowwise-scaled FP8 GEMM writes bf16 only (float16 since torch "
                f"{FP16_OUT_TORCH})")
    if lin.in_features % 16 or lin.out_features % 16:
        return f"FP8 GEMM needs K and N divisible by 16, got K={lin.in_features}, N={lin.out_features}"
    if lin.weight.device != codes.device:
        return f"weights on {lin.weight.device}, codes on {codes.device}"
    return None


def _weight_scale_row(lin: FP8Linear) -> torch.Tensor:
    ws = lin.weight_scale
    if ws.dim() == 0:
        return ws.reshape(1, 1).expand(1, lin.out_features).contiguous()
    return ws.view(1, -1)


def fp8_linear_codes(codes: torch.Tensor, row_descale: torch.Tensor, lin: FP8Linear,
                     out_dtype: torch.dtype = torch.bfloat16, counter: str = LEVER) -> torch.Tensor:
    """lin's GEMM on pre-quantised rows: codes (..., K) e4m3, row_descale (..., 1) fp32 -> (..., N) out_dtype.
    UsageError on operands that do not fit the linear; see the module docstring for the paths."""
    _check_operands(codes, row_descale, lin)
    lead, K, N = tuple(codes.shape[:-1]), codes.shape[-1], lin.out_features
    a = codes.reshape(-1, K)
    sa = row_descale.reshape(-1, 1)

    def gemm():
        if a.shape[0] == 0:
            return codes.new_empty((0, N), dtype=out_dtype)
        bias = None if lin.bias is None else lin.bias.to(out_dtype)
        return torch._scaled_mm(a.contiguous(), lin.weight.t(), scale_a=sa.contiguous(), scale_b=_weight_scale_row(lin),
                                bias=bias, out_dtype=out_dtype, use_fast_accum=lin.fast_accum)

    out = run_guarded(counter, lambda: rowwise_gemm_reason(codes, lin, out_dtype), gemm,
                      lambda: emulate_rows(a, sa, lin, out_dtype))
    return out.reshape(lead + (N,))


def emulate_rows(codes2d: torch.Tensor, descale2d: torch.Tensor, lin: FP8Linear,
                 out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The rowwise GEMM's numerics in fp32 (FP8Linear's emulation with one activation scale per row)."""
    w = dequantize_weight(lin.weight, lin.weight_scale).to(codes2d.device)
    with torch.autocast(codes2d.device.type, enabled=False):  # autocast would run the fp32 product at its dtype
        out = (codes2d.float() * descale2d.float()) @ w.t()
    if lin.bias is not None:
        out = out + lin.bias.float().to(out.device)
    return out.to(out_dtype)


def quantize_activation_rows(x: torch.Tensor, act_scale: float | None = None,
                             counter: str = ACT_LEVER) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes (..., K) e4m3, row_descale (..., 1) fp32) of a bf16/fp16 activation, one scale per row (or the
    static `act_scale`): kernels.fp8_producers.cast_rows_fp8 where its check passes, else its reference
    (counted under `counter`, fp8_act_quant unless named). Computed once per tensor inside
    h3plan.runtime.quant.fp8.shared_activation(x)."""
    shared = _fp8._SHARED.get("x") is x
    key = (_ROW_KEY, act_scale)
    if shared and key in _fp8._SHARED:
        return _fp8._SHARED[key]
    out = run_guarded(counter, lambda: cast_rows_fp8_check(x, act_scale), lambda: cast_rows_fp8(x, act_scale),
                      lambda: cast_rows_fp8_ref(x, act_scale), (x,))
    if shared:
        _fp8._SHARED[key] = out
    return out


def fp8_linear_rows(x: torch.Tensor, lin: FP8Linear, act_scale: float | None = None) -> torch.Tensor:
    """lin(x) with per-row activation scales (or the static act_scale): the cast, then fp8_linear_codes."""
    out_dtype = torch.bfloat16 if x.dtype not in (torch.bfloat16, torch.float16) else x.dtype
    codes, descale = quantize_activation_rows(x, act_scale)
    return fp8_linear_codes(codes, descale, lin, out_dtype)


class FP8RowLinear(FP8Linear):
    """An FP8Linear whose activation is quantised per row (or with a static scale), not per tensor. It shares
    the weight buffers of the FP8Linear it is made from (`from_fp8`); forward is `fp8_linear_rows`."""

    act_scale: float | None = None

    @classmethod
    def from_fp8(cls, lin: FP8Linear, act_scale: float | None = None) -> "FP8RowLinear":
        new = cls(lin.weight, lin.weight_scale, lin.bias, fast_accum=lin.fast_accum)
        new.act_scale = act_scale
        return new

    def forward(self, x: torch.Tensor | RowCodes) -> torch.Tensor:
        if isinstance(x, RowCodes):
            return fp8_linear_codes(x.codes, x.descale, self, x.dtype)
        return fp8_linear_rows(x, self, self.act_scale)

    def extra_repr(self) -> str:
        mode = "per row" if self.act_scale is None else f"static scale {self.act_scale:g}"
        return super().extra_repr() + f", activations={mode}"


__all__ = ["ACT_LEVER", "FP8RowLinear", "RowCodes", "emulate_rows", "fp8_linear_codes", "fp8_linear_rows",
           "quantize_activation_rows", "rowwise_gemm_reason"]
