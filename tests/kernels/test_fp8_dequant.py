"""FP8 e4m3 -> bf16/fp16 dequantisation (h3plan/runtime/kernels/fp8.py): every code, several descales,
bit-identical to (codes.float() * descale).to(dtype) (one fp32 rounding, one output rounding)."""

import pytest
import torch

from h3plan.runtime.kernels.fp8 import dequantize, dequantize_check, dequantize_ref


def _bits(t):
    return t.view(torch.int16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("descale", [1.0, 0.0166015625, 3.1e-3, 100.0, 1e-30, 7.3e4])
def test_every_code_exact(dtype, descale):
    codes = torch.arange(256, dtype=torch.uint8).repeat(3)[:701].view(torch.float8_e4m3fn)  # odd length
    d = torch.tensor([descale], dtype=torch.float32)
    got, ref = dequantize(codes, d, dtype), dequantize_ref(codes, d, dtype)
    nan = ref.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(_bits(got)[~nan], _bits(ref)[~nan])


def test_guards():
    codes = torch.zeros(8, dtype=torch.float8_e4m3fn)
    d = torch.ones(1)
    assert dequantize_check(codes, d) is None
    assert "dtype" in dequantize_check(torch.zeros(8, dtype=torch.bfloat16), d)
    assert "contiguous" in dequantize_check(torch.zeros(8, 2, dtype=torch.float8_e4m3fn).t(), d)
    assert "one-element" in dequantize_check(codes, torch.ones(2))
    assert "fp32" in dequantize_check(codes, torch.ones(1, dtype=torch.float64))
    assert "output dtype" in dequantize_check(codes, d, torch.float32)
    with pytest.raises(ValueError, match="one-element"):
        dequantize(codes, torch.ones(3))
