"""H200: the one-pass FP8 dequantisation (cuDNN FP8 attention's output on SM90) is bit-identical to
torch's (codes.float() * descale).to(bf16) for every code, and at the attention output's size."""

import pytest
import torch

from h3plan.runtime.kernels.fp8 import dequantize, dequantize_ref

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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quantize_codes_match_torch(dtype):
    """The GEMM-activation cast (amax pass + cast pass, the conversion's own round-to-nearest-even on the
    GPU) gives torch's codes for every value: random rows at the FP8 GEMM's real size, every e4m3 midpoint
    and its neighbours, signed zeros, subnormals, +-448."""
    from h3plan.runtime.kernels.fp8 import quantize, quantize_ref

    g = torch.Generator("cuda").manual_seed(3)
    grid = torch.arange(256, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn).float()
    grid = grid[grid.isfinite()].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    special = torch.cat([grid, mids, mids.nextafter(torch.tensor(float("inf"), device="cuda")),
                         mids.nextafter(torch.tensor(float("-inf"), device="cuda")),
                         torch.tensor([0.0, -0.0, 448.0, -448.0, 2.0 ** -10, -(2.0 ** -10)], device="cuda")])
    # amax 448 -> scale exactly 1, so the midpoints stay midpoints after scaling
    cases = [torch.randn(19000, 5376, generator=g, device="cuda").to(dtype), special.to(dtype)]
    bad = 0
    for x in cases:
        (c, d), (cr, dr) = quantize(x), quantize_ref(x)
        bad += int((c.view(torch.uint8) != cr.view(torch.uint8)).sum()) + int(not torch.equal(d, dr))
    print(f"\n[gpu] fp8 quantize {dtype}: {bad} codes or descales differ")
    assert bad == 0
