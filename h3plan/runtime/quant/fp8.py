"""FP8 (e4m3) linear layers for the `gemm_quant=fp8` lever: W8A8 through torch._scaled_mm.

Weights are quantised once, per output channel by default: real = weight (e4m3) * weight_scale (fp32,
(N,)), weight_scale = amax(row) / 448. Why per channel: a checkpoint's output channels differ in scale
(outlier rows), and with one tensor-wide scale every small row loses mantissa to the largest one; with
rowwise scales the scale multiplies the output column in the GEMM epilogue at no extra pass, and
torch 2.11 runs rowwise-scaled FP8 GEMMs on SM90 (cuBLAS >= 12.9, else its CUTLASS kernel) with bf16
output. torch's rowwise recipe needs both operands rowwise, so the per-tensor activation scale is
expanded to (M, 1). `scaling="tensor"` keeps one weight scale (cuBLAS tensorwise path) instead.
Activations: per-tensor dynamic e4m3 on the device each call (h3plan.runtime.kernels.fp8: scale = 448 / amax,
codes = e4m3(x * scale), descale = 1 / scale; a two-pass Triton kernel on CUDA, the same bits as its
torch reference), or static: `set_static_input(amax, margin)` (a calibrated table, h3plan.facts.scale_table)
fixes the activation scale to 448 / (amax * margin), so the cast is one pass with no amax (values beyond
amax * margin saturate at +-448). to_q, to_k and to_v receive the same input tensor: inside
`shared_activation(x)` (the installer's attention processor wraps the three projections in it) its codes
are computed once. Under
Ulysses (degree U > 1) "per tensor" means the whole sequence, as at degree 1: the installer gives each
FP8Linear a `SequenceAmax`, which takes the amax over this rank's valid rows and MAX-all-reduces it over
the group (one 4-byte all-reduce per shared input, four per block), so no row's codes depend on the
degree or on the padding rows of the last shard.

A user's already-quantised checkpoint (e4m3 weight + weight_scale as a scalar, (N,) or (N, 1)) loads
into the same module with `FP8Linear.from_quantized`. State-dict keys: `weight` (e4m3), `weight_scale`
(fp32), `bias` if any.

Per call, `fp8_gemm_reason(x)` decides: CUDA with hardware.gemm.fp8, bf16/fp16 input, K and N multiples of 16, no
autograd. Otherwise the call falls back (counted under `gemm_quant` with the reason) to an emulation of
the same numerics: the activation is quantised the same way, both operands are dequantised to fp32,
multiplied in fp32 and rounded once to the output dtype. So CPU runs measure the recipe's error; they
differ from the GPU GEMM only by accumulation order and fast-accumulation effects.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn

from h3plan.levers import counter
from h3plan.runtime.guards import run_guarded

from h3plan.runtime.kernels.fp8 import E4M3, E4M3_MAX, amax, quantize, quantize_check, quantize_ref
from h3plan.runtime.parallel.comm import amax_allreduce_hook, degree_rank
from h3plan.facts.hardware import gemm_rule
from h3plan.facts.sizes import valid_rows

_FP8_FROM, _FP8_WHY = gemm_rule("fp8")  # hardware.gemm.fp8, read once (facts/hardware.py)

LEVER = counter("quant")  # gemm_quant's counter


def quantize_weight(w: torch.Tensor, scaling: str = "channel") -> tuple[torch.Tensor, torch.Tensor]:
    """(weight e4m3 (N, K), weight_scale fp32 (N,) or ()) with real ~= weight * weight_scale[:, None]."""
    if w.dim() != 2:
        raise ValueError(f"quantize_weight expects a 2-dim (N, K) weight, got {tuple(w.shape)}")
    wf = w.detach().float()
    if scaling == "channel":
        amax = wf.abs().amax(dim=1)
    elif scaling == "tensor":
        amax = wf.abs().amax()
    else:
        raise ValueError(f"scaling must be 'channel' or 'tensor', got {scaling!r}")
    scale = amax.clamp(min=1e-12) / E4M3_MAX
    s = scale[:, None] if scale.dim() else scale
    return (wf / s).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def dequantize_weight(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    s = weight_scale[:, None] if weight_scale.dim() else weight_scale
    return weight.float() * s


_SHARED: dict = {}  # inside shared_activation(x): {"x": x, "codes": (x8, descale) once computed}


@contextmanager
def shared_activation(x: torch.Tensor):
    """Quantise `x` at most once for every FP8Linear called on this very tensor inside the block
    (no version-counter tricks: the caller promises not to modify x in between)."""
    _SHARED.clear()
    _SHARED["x"] = x
    try:
        yield
    finally:
        _SHARED.clear()


def quantize_activation(x: torch.Tensor, kernel: bool = False, amax_fn=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes e4m3 (M, K), descale fp32 0-dim) of x (..., K), per tensor. `amax_fn(x)` (fp32 0-dim), when
    given, is the amax the scale covers instead of x's own (SequenceAmax under Ulysses)."""
    shared = _SHARED.get("x") is x
    if shared and "codes" in _SHARED:
        return _SHARED["codes"]
    x2d = x.reshape(-1, x.shape[-1])
    if kernel:
        fn = None if amax_fn is None else (lambda _: amax_fn(x))
        codes = quantize(x2d, fn) if quantize_check(x2d) is None else _cast_ref(x2d, x, amax_fn)
    else:
        codes = _cast_ref(x2d, x, amax_fn)
    if shared:
        _SHARED["codes"] = codes
    return codes


def _cast_ref(x2d, x, amax_fn):
    return quantize_ref(x2d, None if amax_fn is None else amax_fn(x))


class SequenceAmax:
    """The amax of a Ulysses rank's activation over the whole sequence: this rank's valid rows (padding
    rows excluded: they hold modulated zeros, not data), then a MAX all-reduce over the group. With it an
    FP8 linear's per-tensor scale is the one degree 1 computes, so the codes do not depend on the degree.
    `shard` is the installer's SequenceShard (seq_len of the current forward, group, degree)."""

    def __init__(self, shard):
        self.shard = shard
        self.rank = degree_rank(shard.group)[1]
        self.reduce = amax_allreduce_hook(shard.group)
        self._valid_rows, self._amax, self._check = valid_rows, amax, quantize_check  # resolved once, not per call

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3:
            raise ValueError(f"SequenceAmax expects (B, S_loc, K) activations, got {tuple(x.shape)}")
        vr = self._valid_rows(self.shard.seq_len, self.shard.degree, self.rank)
        xv = x[:, :vr]
        if vr == 0:
            a = torch.zeros((), device=x.device, dtype=torch.float32)
        elif x.is_cuda and self._check(xv) is None:
            a = self._amax(xv)  # the Triton pass 1 (a max is exact in any order: the same value as torch's)
        else:
            a = xv.abs().amax().float()
        return self.reduce(a.reshape(()).clone())


def fp8_gemm_reason(x: torch.Tensor, n_out: int) -> str | None:
    if x.device.type != "cuda":
        return f"FP8 GEMM needs CUDA (input on {x.device.type})"
    if _FP8_FROM is None or torch.cuda.get_device_capability(x.device) < _FP8_FROM:
        return _FP8_WHY
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"FP8 GEMM takes bf16/fp16 activations, got {x.dtype}"
    if x.shape[-1] % 16 or n_out % 16:
        return f"FP8 GEMM needs K and N divisible by 16, got K={x.shape[-1]}, N={n_out}"
    return None


class FP8Linear(nn.Module):
    """nn.Linear replacement holding e4m3 weights; see the module docstring for numerics and guards."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None,
                 *, fast_accum: bool = False):
        super().__init__()
        if weight.dtype != E4M3 or weight.dim() != 2:
            raise ValueError(f"FP8Linear weight must be a 2-dim float8_e4m3fn tensor, got {weight.dtype} "
                             f"{tuple(weight.shape)}")
        n = weight.shape[0]
        ws = weight_scale.detach().float().to(weight.device)
        if ws.numel() == 1:
            ws = ws.reshape(())
        elif ws.numel() == n:
            ws = ws.reshape(n)
        else:
            raise ValueError(f"weight_scale must have 1 or N={n} elements, got shape {tuple(weight_scale.shape)}")
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight.detach())
        self.register_buffer("weight_scale", ws.contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach())
        self.fast_accum = bool(fast_accum)
        self.amax_fn = None  # SequenceAmax under Ulysses (set by the installer); None: this tensor's own amax
        self.register_buffer("input_amax", None)  # static: calibrated amax * margin (fp32 0-dim); wins over amax_fn

    @classmethod
    def from_linear(cls, linear: nn.Linear, scaling: str = "channel", fast_accum: bool = False) -> "FP8Linear":
        w8, ws = quantize_weight(linear.weight, scaling)
        return cls(w8, ws, linear.bias, fast_accum=fast_accum)

    @classmethod
    def from_quantized(cls, weight_fp8: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None,
                       *, fast_accum: bool = False) -> "FP8Linear":
        """Load a pre-quantised checkpoint tensor pair (weight e4m3 (N, K), dequant scale 1 or N values)."""
        return cls(weight_fp8, weight_scale, bias, fast_accum=fast_accum)

    def set_static_input(self, amax: float | None, margin: float = 1.0) -> None:
        """Quantise every input with the calibrated `amax * margin` instead of its own amax; None: dynamic again.
        The same on every Ulysses rank, so it replaces the SequenceAmax all-reduce too."""
        self.input_amax = None if amax is None else torch.tensor(
            float(amax) * float(margin), dtype=torch.float32, device=self.weight.device)

    def _static_amax(self, x: torch.Tensor) -> torch.Tensor:
        return self.input_amax

    def _amax_source(self):
        return self.amax_fn if self.input_amax is None else self._static_amax

    @property
    def scaling(self) -> str:
        return "tensor" if self.weight_scale.dim() == 0 else "channel"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = run_guarded(LEVER, lambda: fp8_gemm_reason(x, self.out_features), lambda: self._gemm(x),
                          lambda: self._emulate(x), (x,))
        return out.reshape(*x.shape[:-1], self.out_features)

    def _gemm(self, x):
        x8, xs = quantize_activation(x, kernel=x.is_cuda, amax_fn=self._amax_source())
        if self.weight_scale.dim() == 0:
            sa, sb = xs, self.weight_scale
        else:
            sa = xs.expand(x8.shape[0], 1).contiguous()
            sb = self.weight_scale.view(1, -1)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return torch._scaled_mm(x8, self.weight.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=x.dtype,
                                use_fast_accum=self.fast_accum)

    def _emulate(self, x):
        x8, xs = quantize_activation(x, amax_fn=self._amax_source())
        out = (x8.float() * xs) @ dequantize_weight(self.weight, self.weight_scale).t()
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        inp = "dynamic" if self.input_amax is None else f"static amax {float(self.input_amax):g}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, scaling={self.scaling}, "
                f"input={inp}, bias={self.bias is not None}")
