"""NVFP4 linear layers for `gemm_quant=nvfp4` (Blackwell). THE FP4 TENSOR-CORE GEMM NEVER RAN HERE.

    out = (codes_x * s_x) @ (codes_w * s_w)^T * (g_x * g_w) + bias, rounded once to the activation dtype

The format and its quantizer live in h3plan/runtime/kernels/nvfp4.py (torchao's two-level NVFP4 quantizer, bit for
bit). Weights are stored the way a ModelOpt NVFP4 export stores them, so the state dict of an installed
plan is such a checkpoint and `load_nvfp4_checkpoint` (h3plan.runtime.quant) reads one back:
    weight          uint8 (N, K/2)     packed e2m1, element 2i in the low nibble
    weight_scale    e4m3  (N, K/16)    block scales, the linear (row-major) layout
    weight_scale_2  fp32  ()           the weight's global scale g_w
    input_scale     fp32  () or None   the activation's global scale g_x (static, calibrated); None: dynamic,
                                       g_x = amax(x) / 2688 of each input tensor (of this rank's rows); its value
                                       is mirrored in `input_scale_value` (set it by assignment, not in place)
The activation reaches the linear either as `NVFP4Codes` from a producer kernel (runtime/kernels/nvfp4_producers.py)
or as a bf16/fp16 tensor the linear quantizes itself -- `input_kernel` False: the torch reference
(`cast_nvfp4_ref`), True: the one-pass Triton cast (`cast_nvfp4`, counted under nvfp4_out_quant, the lever
that turns it on for to_out.0). Both give the same codes, so which one ran never changes the output.

The GEMM (`_gemm`, SM100+): torch._scaled_mm(codes_x (M, K/2) float4_e2m1fn_x2 row-major, codes_w^T (K/2, N)
column-major, scale_a / scale_b the swizzled e4m3 block scales (flat, 128 x ceil(K/64)*4 per 128 rows:
torch/_meta_registrations.py `_check_scaled_mm_sizes` for float8_e4m3fn scales), out_dtype float32); then
x (g_x * g_w), + bias, one rounding. The fp32 output is what torchao's NVFP4 matmul asks for with fp32
inputs. Every other device runs `emulate`, counted under `gemm_quant` with the reason (hardware.gemm.nvfp4): the
same codes and block scales dequantised to fp32 (exact: an e2m1 value times an e4m3 scale has at most 5
significant bits), an fp32 matmul, then the same global-scale product, bias and rounding -- so only the
tensor-core product (its accumulation order) is untested. tests/install/test_install_nvfp4.py checks the
arguments `_gemm` passes against torch's meta implementation of _scaled_mm.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn

from h3plan.levers import counter
from h3plan.runtime.kernels.nvfp4 import (BLOCK, E4M3, blocked_numel, cast_nvfp4, cast_nvfp4_check, cast_nvfp4_ref,
                                  dequantize_ref, from_blocked, quantize_ref, to_blocked)
from h3plan.facts.blocks import BLOCK_LINEARS
from h3plan.facts.hardware import gemm_rule
from h3plan.runtime.guards import run_guarded

from . import fp8 as _fp8

_NVFP4_FROM, _NVFP4_WHY = gemm_rule("nvfp4")  # hardware.gemm.nvfp4, read once (facts/hardware.py)

LEVER = counter("quant")  # gemm_quant's counter
OUT_LEVER = counter("nvfp4_out_quant")  # the linear's own input cast through the Triton kernel (to_out.0)
_SHARED_KEY = "nvfp4_codes"  # h3plan.runtime.quant.fp8.shared_activation's cache entry (to_q/k/v on one input)


class NVFP4Codes(NamedTuple):
    """An NVFP4 linear's input as a producer wrote it: packed (..., K/2) uint8, scales (flat, swizzled e4m3,
    rows = the product of the leading dims), global_scale fp32 0-dim, dtype: the bf16/fp16 dtype of the tensor
    it stands for (the GEMM's output dtype)."""

    packed: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor
    dtype: torch.dtype


def nvfp4_gemm_reason(packed: torch.Tensor, lin: "NVFP4Linear", out_dtype=torch.bfloat16) -> str | None:
    """None when torch._scaled_mm's NVFP4 GEMM takes these operands, else the one-line reason."""
    if (packed.device.type != "cuda" or _NVFP4_FROM is None
            or torch.cuda.get_device_capability(packed.device) < _NVFP4_FROM):
        return _NVFP4_WHY
    if out_dtype not in (torch.bfloat16, torch.float16):
        return f"NVFP4 GEMM output must be bf16/fp16, asked for {out_dtype}"
    if not hasattr(torch, "float4_e2m1fn_x2"):
        return "this torch has no float4_e2m1fn_x2 dtype"
    if lin.in_features % 32 or lin.out_features % 16:
        return f"NVFP4 GEMM needs K divisible by 32 and N by 16, got K={lin.in_features}, N={lin.out_features}"
    if lin.weight.device != packed.device:
        return f"weights on {lin.weight.device}, codes on {packed.device}"
    return None


def scaled_mm_args(codes: NVFP4Codes, lin: "NVFP4Linear") -> tuple[tuple, dict]:
    """(args, kwargs) of the torch._scaled_mm call of `_gemm` (the FP4 GEMM, SM100+)."""
    fp4 = torch.float4_e2m1fn_x2
    a = codes.packed.reshape(-1, lin.in_features // 2).view(fp4)
    b = lin.weight.view(fp4).t()
    return (a, b), dict(scale_a=codes.scales, scale_b=lin.weight_scale_swizzled, out_dtype=torch.float32)


def _gemm(codes: NVFP4Codes, lin: "NVFP4Linear") -> torch.Tensor:  # never ran on hardware (SM100+ only)
    args, kwargs = scaled_mm_args(codes, lin)
    return torch._scaled_mm(*args, **kwargs)


def emulate(codes: NVFP4Codes, lin: "NVFP4Linear") -> torch.Tensor:
    """The GEMM's fp32 product sum_k (code_x s_x)(code_w s_w), without the global scales, in fp32 (autocast off)."""
    K = lin.in_features
    a2 = codes.packed.reshape(-1, K // 2)
    xs = from_blocked(codes.scales, a2.shape[0], K // BLOCK)
    a = dequantize_ref(a2, xs)
    w = dequantize_ref(lin.weight, lin.weight_scale).to(a.device)
    with torch.autocast(a.device.type, enabled=False):
        return a @ w.t()


def nvfp4_linear_codes(codes: NVFP4Codes, lin: "NVFP4Linear", counter: str = LEVER) -> torch.Tensor:
    """lin's GEMM on NVFP4 codes -> (..., N) codes.dtype; see the module docstring for the two paths."""
    lead, N = tuple(codes.packed.shape[:-1]), lin.out_features
    if codes.packed.shape[-1] * 2 != lin.in_features:
        raise ValueError(f"NVFP4 codes have K={codes.packed.shape[-1] * 2}, the linear takes {lin.in_features}")
    bad = check_scales(codes.scales, codes.packed.numel() // max(1, codes.packed.shape[-1]), lin.in_features)
    if bad:
        raise ValueError(bad)
    out = run_guarded(counter, lambda: nvfp4_gemm_reason(codes.packed, lin, codes.dtype), lambda: _gemm(codes, lin),
                      lambda: emulate(codes, lin))
    out = out * (codes.global_scale.float() * lin.weight_scale_2.float())
    if lin.bias is not None:
        out = out + lin.bias.float()
    return out.to(codes.dtype).reshape(lead + (N,))


def quantize_input(x: torch.Tensor, g: torch.Tensor | None = None, kernel: bool = False,
                   counter: str = OUT_LEVER) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed, swizzled scales, g) of a bf16/fp16 activation: the Triton cast where asked and its check passes
    (counted under `counter`), else the torch reference; the same bits either way."""
    if not kernel:
        return cast_nvfp4_ref(x, g)

    return run_guarded(counter, lambda: cast_nvfp4_check(x, g), lambda: cast_nvfp4(x, g),
                       lambda: cast_nvfp4_ref(x.contiguous() if x.dtype in (torch.bfloat16, torch.float16) else x, g),
                       (x,))


class NVFP4Linear(nn.Module):
    """nn.Linear replacement with NVFP4 weights in ModelOpt's layout (module docstring). `input_kernel`: quantize
    a bf16 input with the Triton cast (nvfp4_out_quant) instead of the torch reference."""

    hardware_verified = False

    def __init__(self, weight, weight_scale, weight_scale_2, bias=None, input_scale=None):
        super().__init__()
        self.out_features, self.in_features = weight.shape[0], weight.shape[1] * 2
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("weight_scale_2", weight_scale_2.float().reshape(()))
        self.register_buffer("input_scale", None if input_scale is None else input_scale.float().reshape(()))
        self.input_scale_value = None if input_scale is None else float(input_scale)
        self.register_buffer("bias", None if bias is None else bias.detach())
        self.input_kernel = False
        # the GEMM's copy of weight_scale in the swizzled layout; refreshed when a state dict is loaded
        self.register_buffer("weight_scale_swizzled", to_blocked(weight_scale), persistent=False)
        self.register_load_state_dict_post_hook(NVFP4Linear._refresh)

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name == "input_scale":  # a Python copy, so no forward reads the buffer's value on the host
            super().__setattr__("input_scale_value", None if value is None else float(value))

    @staticmethod
    def _refresh(module, _incompatible=None) -> None:
        """After load_state_dict: the swizzled weight scales and input_scale_value follow the loaded tensors."""
        module.weight_scale_swizzled.copy_(to_blocked(module.weight_scale))
        module.input_scale = module.input_scale

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "NVFP4Linear":
        packed, bs, g = quantize_ref(linear.weight)
        return cls(packed, bs, g, linear.bias)

    def quantize(self, x: torch.Tensor) -> NVFP4Codes:
        """x's codes with this linear's input scale (static) or its own amax (dynamic); computed once per tensor
        inside h3plan.runtime.quant.fp8.shared_activation(x) for linears of the same input scale."""
        g = self.input_scale
        key = (_SHARED_KEY, self.input_scale_value, self.input_kernel)
        shared = _fp8._SHARED.get("x") is x
        if shared and key in _fp8._SHARED:
            return _fp8._SHARED[key]
        codes = NVFP4Codes(*quantize_input(x, None if g is None else g.to(x.device), self.input_kernel), x.dtype)
        if shared:
            _fp8._SHARED[key] = codes
        return codes

    def forward(self, x: torch.Tensor | NVFP4Codes) -> torch.Tensor:
        if not isinstance(x, NVFP4Codes):
            x = self.quantize(x)
        return nvfp4_linear_codes(x, self)

    def extra_repr(self) -> str:
        act = "dynamic" if self.input_scale_value is None else f"static input_scale {self.input_scale_value:g}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"input={act}")


def check_scales(scales: torch.Tensor, rows: int, K: int) -> str | None:
    """None when `scales` is a flat swizzled e4m3 scale buffer for (rows, K)."""
    want = blocked_numel(rows, K // BLOCK)
    if scales.dtype != E4M3 or scales.dim() != 1 or scales.numel() != want:
        return f"NVFP4 scales must be flat float8_e4m3fn with {want} entries, got {scales.dtype} {tuple(scales.shape)}"
    return None


NOT_NVFP4 = "the block linears are not NVFP4 (gemm_quant is not nvfp4 here): no NVFP4 GEMM input to write"


def block_nvfp4_linears(model) -> list[tuple[int, str, NVFP4Linear]]:
    """(block index, path, module) of every NVFP4Linear among the transformer blocks' six linears."""
    return [(i, path, block.get_submodule(path)) for i, block in enumerate(model.transformer_blocks)
            for path in BLOCK_LINEARS if isinstance(block.get_submodule(path), NVFP4Linear)]


__all__ = ["LEVER", "NOT_NVFP4", "NVFP4Codes", "NVFP4Linear", "OUT_LEVER", "block_nvfp4_linears", "check_scales",
           "emulate", "nvfp4_gemm_reason", "nvfp4_linear_codes", "quantize_input", "scaled_mm_args"]
