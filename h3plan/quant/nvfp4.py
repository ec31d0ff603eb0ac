"""NVFP4 linear layers for `gemm_quant=nvfp4` (Blackwell only). THE NVFP4 GEMM NEVER RAN HERE.

Format (NVIDIA NVFP4): values are e2m1 (magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; sign bit 8), two per
byte (element 2i in the low nibble); every block of 16 consecutive values along K shares an e4m3 block
scale; one fp32 per-tensor scale g = amax / (6 * 448) sits on top. Quantise: block scale
s_b = e4m3(amax_block / (6 g)), codes = round-to-nearest-even_e2m1(x / (s_b g)) saturated at +-6.
Dequantise: value(code) * s_b * g. Quantise/dequantise are plain torch, so their numerics are tested
on the CPU.

The GEMM path (`torch._scaled_mm` on float4_e2m1fn_x2 operands with 128x4-tile swizzled e4m3 block
scales, then the two global scales on the output) needs FP4 tensor cores: SM100+. This machine and
the H200 are not Blackwell, so that path has never run on hardware; off Blackwell every call falls
back, counted under `gemm_quant` with the reason "NVFP4 GEMMs need SM100+", to an emulation: both
operands NVFP4-quantised and dequantised, fp32 matmul, one rounding to the output dtype.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from h3plan.runtime.counters import fallback as count_fallback, fused as count_fused
from h3plan.kernels.fp8 import E4M3, E4M3_MAX
from h3plan.runtime.guards import GRAD_REASON, needs_grad

BLOCK = 16
E2M1_MAX = 6.0
_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
SM100_REASON = "NVFP4 GEMMs need SM100+"
LEVER = "gemm_quant"


def e2m1_codes(a: torch.Tensor) -> torch.Tensor:
    """4-bit codes (uint8 0..15) of fp32 values, round to nearest, ties to the even code, saturating."""
    mids = torch.tensor(_MIDS, dtype=torch.float32, device=a.device)
    mag = a.abs()
    down = torch.bucketize(mag, mids, right=False)  # a tie at a midpoint lands on the lower code
    up = torch.bucketize(mag, mids, right=True)  # ... and here on the upper one
    code = torch.where(down % 2 == 0, down, up)
    return (code | ((a < 0) & (code > 0)).to(code.dtype) * 8).to(torch.uint8)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    grid = torch.tensor(_GRID, dtype=torch.float32, device=codes.device)
    mag = grid[(codes & 7).long()]
    return torch.where((codes & 8) > 0, -mag, mag)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """(..., K) codes -> (..., K/2) bytes, element 2i in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def quantize(x: torch.Tensor, global_scale: torch.Tensor | None = None):
    """x (..., K), K % 16 == 0 -> (packed uint8 (..., K/2), block scales e4m3 (..., K/16), g fp32 0-dim)."""
    if x.shape[-1] % BLOCK:
        raise ValueError(f"NVFP4 needs the last dim divisible by {BLOCK}, got {x.shape[-1]}")
    xf = x.detach().float()
    g = xf.abs().amax().clamp(min=1e-12) / (E2M1_MAX * E4M3_MAX) if global_scale is None else global_scale.float()
    blocks = xf.unflatten(-1, (-1, BLOCK))
    bs = (blocks.abs().amax(-1) / (E2M1_MAX * g)).clamp(max=E4M3_MAX).to(E4M3)
    denom = bs.float()[..., None] * g
    scaled = torch.where(denom > 0, blocks / torch.where(denom > 0, denom, 1.0), 0.0)
    return pack(e2m1_codes(scaled).flatten(-2)), bs, g


def dequantize(packed: torch.Tensor, block_scales: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    vals = e2m1_values(unpack(packed)).unflatten(-1, (-1, BLOCK))
    return (vals * block_scales.float()[..., None] * g).flatten(-2)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """(rows, cols) block scales -> cuBLAS's swizzled layout: 128x4 tiles, row r of a tile at byte
    (r % 32) * 16 + (r // 32) * 4 (+ column), tiles in row-major order; zero padding to full tiles."""
    rows, cols = scales.shape
    rt, ct = -(-rows // 128), -(-cols // 4)
    padded = torch.zeros((rt * 128, ct * 4), dtype=scales.dtype, device=scales.device)
    padded[:rows, :cols] = scales
    return padded.view(rt, 4, 32, ct, 4).permute(0, 3, 2, 1, 4).reshape(-1)


def nvfp4_gemm_reason(x: torch.Tensor) -> str | None:
    if x.device.type != "cuda" or torch.cuda.get_device_capability(x.device)[0] < 10:
        return SM100_REASON
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"NVFP4 GEMM takes bf16/fp16 activations, got {x.dtype}"
    if not hasattr(torch, "float4_e2m1fn_x2"):
        return "this torch has no float4_e2m1fn_x2 dtype"
    if x.shape[-1] % 32:
        return f"NVFP4 GEMM needs K divisible by 32, got {x.shape[-1]}"
    return None


class NVFP4Linear(nn.Module):
    """nn.Linear replacement with NVFP4 weights (state dict: weight uint8 packed, weight_block_scale e4m3,
    weight_global_scale fp32, bias). See the module docstring: the GEMM path never ran on hardware."""

    hardware_verified = False

    def __init__(self, weight_packed, block_scales, global_scale, bias=None):
        super().__init__()
        self.out_features, self.in_features = weight_packed.shape[0], weight_packed.shape[1] * 2
        self.register_buffer("weight", weight_packed)
        self.register_buffer("weight_block_scale", block_scales)
        self.register_buffer("weight_global_scale", global_scale.reshape(()))
        self.register_buffer("bias", None if bias is None else bias.detach())

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "NVFP4Linear":
        return cls(*quantize(linear.weight), linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, x.shape[-1])
        reason = GRAD_REASON if needs_grad(x) else nvfp4_gemm_reason(x)
        if reason is None:
            count_fused(LEVER)
            out = self._gemm(x2d)
        else:
            count_fallback(LEVER, reason)
            out = self._emulate(x2d)
        return out.reshape(*x.shape[:-1], self.out_features)

    def _gemm(self, x2d):  # never ran on hardware (SM100+ only)
        xp, xbs, xg = quantize(x2d)
        fp4 = torch.float4_e2m1fn_x2
        out = torch._scaled_mm(xp.view(fp4), self.weight.view(fp4).t(), scale_a=to_blocked(xbs),
                               scale_b=to_blocked(self.weight_block_scale), out_dtype=x2d.dtype)
        out = (out.float() * (xg * self.weight_global_scale))
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(x2d.dtype)

    def _emulate(self, x2d):
        xd = dequantize(*quantize(x2d))
        wd = dequantize(self.weight, self.weight_block_scale, self.weight_global_scale)
        out = xd @ wd.t()
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(x2d.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
