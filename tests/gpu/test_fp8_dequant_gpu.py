"""H200: the one-pass FP8 dequantisation (cuDNN FP8 attention's output on SM90) is bit-identical to
torch's (codes.float() * descale).to(bf16) for every code, and at the attention output's size."""

import pytest
import torch

from h3plan.quant.cast import dequantize, dequantize_ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dequantize_every_code_and_real_size(dtype):
    codes = torch.arange(256, dtype=torch.uint8, device="cuda").repeat(1001).view(torch.float8_e4m3fn)
    big = torch.randint(0, 256, (1, 19000, 56, 128), dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    bad = 0
    for c in (codes, big):
        for d in (1.0, 0.0166015625, 3.1e-3, 7.3e4):
            dt = torch.tensor([d], device="cuda")
            got, ref = dequantize(c, dt, dtype), dequantize_ref(c, dt, dtype)
            nan = ref.isnan()
            bad += int((got.isnan() != nan).sum()) + int((got.view(torch.int16) != ref.view(torch.int16))[~nan].sum())
    print(f"\n[gpu] fp8 dequantize {dtype}: {bad} differ")
    assert bad == 0
