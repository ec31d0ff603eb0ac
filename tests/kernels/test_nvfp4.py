"""NVFP4 quantizer (runtime/kernels/nvfp4.py): hand-computed golden vectors for the reference, then the Triton cast
against the reference in the interpreter.

Contract: packed codes, block scales and g bit-identical (rtol=0, atol=0) to `cast_nvfp4_ref`, whose chain is
torchao 0.18's nvfp4_quantize (checked offline against torchao: 0 of 1.3M codes and scales differ across normal,
tiny, zero and saturating blocks; torchao is not a dependency, so the goldens below pin the same behaviour).
"""

import pytest
import torch

from h3plan.runtime.kernels import nvfp4 as n4

E4M3 = torch.float8_e4m3fn


def u8(t):
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def assert_same(got, ref):
    for a, b, name in zip(got, ref, ("packed", "scales", "g")):
        assert a.shape == b.shape and a.dtype == b.dtype, (name, a.shape, b.shape, a.dtype, b.dtype)
        if name == "g":
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (a, b)
        else:
            assert torch.equal(u8(a), u8(b)), f"{name}: {(u8(a) != u8(b)).sum().item()} of {a.numel()} differ"


# ---------------------------------------------------------------------------------------------- goldens
def test_golden_grid_ties_sign_and_saturation():
    # amax 6 with g = 1: s = e4m3(6 / 6 / 1) = 1 (byte 0x38), r = 1, so each value is rounded on the grid itself
    x = torch.tensor([[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.0, -0.1, 6.0, -6.0, 1.0, 2.0, 3.0, 0.5, 4.0]])
    packed, s, g = n4.quantize_ref(x, torch.tensor(1.0))
    # ties to the even code: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5 -> 4.0;
    # -0.0 and -0.1 keep the sign (code 8); 6 -> 7, -6 -> 15
    codes = [0, 2, 2, 4, 4, 6, 6, 8, 8, 7, 15, 2, 4, 5, 1, 6]
    assert n4.unpack(packed).tolist() == [codes]
    assert packed.tolist() == [[0x20, 0x42, 0x64, 0x86, 0x78, 0x2F, 0x54, 0x61]]
    assert u8(s).tolist() == [[0x38]] and g.item() == 1.0


def test_golden_tiny_zero_and_saturating_blocks():
    x = torch.zeros(1, 64)
    x[0, :16] = 1e-3  # tiny block: (1e-3 / 6) / 1 = 1.7e-4 clamps to 2^-6 (byte 0x08), r = 64, 0.064 -> code 0
    x[0, 16:32] = 0.0  # zero block: scale 2^-6 too, codes 0
    x[0, 32] = 6 * 448 * 2.0  # saturating block: (5376 / 6) / 1 = 896 clamps to 448 (0x7E), 5376 / 448 = 12 -> 6
    x[0, 33] = -1.0  # 1 / 448 -> 0.0022 -> -0 (code 8)
    x[0, 48:64] = 3.0  # normal block: s = 0.5 (0x30), 3 * 2 = 6 -> code 7
    packed, s, _ = n4.quantize_ref(x, torch.tensor(1.0))
    assert u8(s).tolist() == [[0x08, 0x08, 0x7E, 0x30]]
    codes = n4.unpack(packed)[0].tolist()
    assert codes[:32] == [0] * 32 and codes[32:34] == [7, 8] and codes[34:48] == [0] * 14 and codes[48:] == [7] * 16
    z = torch.zeros(2, 32)
    packed, s, g = n4.quantize_ref(z)  # all zero: g = 1 (torchao would divide by 0)
    assert g.item() == 1.0 and packed.eq(0).all() and u8(s).eq(0x08).all()


def test_golden_reciprocal_multiply_at_a_midpoint():
    """x * ((1 / g) / s), not x / (s * g): here element 14 lands just above the 1.25 tie (-> -1.5, code 11)
    where dividing lands on it (-> -1.0, code 10)."""
    g = torch.tensor(0.004146793857216835)
    x = torch.tensor([[5.96483039855957, -0.8349308371543884, -0.2521752715110779, 0.09093959629535675,
                       1.6478500366210938, 0.5069466233253479, 1.8587630987167358, -0.7734735608100891,
                       -0.2986563742160797, -1.4209933280944824, -2.015242099761963, 0.39138349890708923,
                       0.8018884062767029, 1.1846590042114258, -1.2440382242202759, 0.483188271522522]])
    packed, s, _ = n4.quantize_ref(x, g)
    assert packed.tolist() == [[167, 9, 19, 164, 185, 28, 34, 27]]
    divided = n4.pack(n4.e2m1_codes((x / (s.float() * g)).clamp(-6, 6)))
    assert divided.tolist() == [[167, 9, 19, 164, 185, 28, 34, 26]]  # the old h3plan rounding


def test_golden_global_scale_and_block_scale_divisions():
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 16] = 2688.0, 7.0  # g = 2688 / 2688 = 1; block 1: (7 / 6) / 1 = 1.1667 -> e4m3 1.125 (0x39)
    packed, s, g = n4.quantize_ref(x)
    assert g.item() == 1.0 and u8(s).tolist() == [[0x7E, 0x39]]
    assert n4.unpack(packed)[0, 16].item() == 7  # 7 / 1.125 = 6.2 -> saturates at 6
    assert n4.global_scale(torch.tensor(0.0)).item() == 1.0


def test_values_pack_and_dequantize():
    codes = torch.arange(16, dtype=torch.uint8)
    assert n4.e2m1_values(codes).tolist() == [0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6]
    assert n4.pack(torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)).tolist() == [[0x21, 0x0F]]
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0] * 2)
    x = torch.stack([grid * 0.125, -grid * 2.0])  # block amax 6 * a power of two: exact scales
    g = torch.tensor(1.0 / 32)
    assert torch.equal(n4.dequantize_ref(*n4.quantize_ref(x, g)), x)


def test_error_bound_random():
    """|dequant - x| <= half a grid step of the block (saturation aside) for every element."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(8, 64, generator=gen) * torch.logspace(-2, 1, 8)[:, None]
    packed, bs, g = n4.quantize_ref(x)
    t = bs.float()[..., None] * g
    r = (x.unflatten(-1, (4, 16)) / t).abs()
    half_step = torch.where(r < 2, 0.25, torch.where(r < 4, 0.5, 1.0))
    bound = torch.where(r > 6, r - 6, half_step) * t
    err = (n4.dequantize_ref(packed, bs, g).unflatten(-1, (4, 16)) - x.unflatten(-1, (4, 16))).abs()
    # slack: fp32 roundings of x * r and of the bound
    assert bool((err <= bound + 2 ** -20 * x.unflatten(-1, (4, 16)).abs()).all())


def test_blocked_layout_round_trip():
    rows, cols = 130, 5
    s = torch.arange(rows * cols, dtype=torch.float32).view(rows, cols)
    out = n4.to_blocked(s)
    assert out.numel() == n4.blocked_numel(rows, cols) == 256 * 8
    r, c = 37, 2  # tile (0, 0): byte (r % 32) * 16 + (r // 32) * 4 + c
    assert out[(r % 32) * 16 + (r // 32) * 4 + c] == s[r, c]
    r, c = 129, 4  # tile (1, 1) = 4th tile (row-major over tiles), 512 entries each
    assert out[3 * 512 + (r % 128 % 32) * 16 + (r % 128 // 32) * 4 + c % 4] == s[r, c]
    assert torch.equal(n4.from_blocked(out, rows, cols), s)


# ---------------------------------------------------------------------------------------------- the kernel
def spread(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-12, 9, shape, generator=gen).float()))


def special_blocks(x):
    """zero, -0, tiny and saturating-adjacent blocks in the first rows of a (.., K >= 64) tensor."""
    x2 = x.view(-1, x.shape[-1])
    x2[0, :16] = 0.0
    x2[0, 16:32] = -0.0
    x2[0, 32:48] *= 1e-8
    x2[-1, 0] = 3e4
    return x


@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 96), (1, 3, 7168)])
@pytest.mark.parametrize("static", [False, True])
def test_cast_matches_reference(shape, static):
    x = special_blocks(spread(shape, shape[-1])).bfloat16()
    g = torch.tensor([0.01]) if static else None
    got = n4.cast_nvfp4(x, g)
    assert_same(got, n4.cast_nvfp4_ref(x, g))
    assert got[0].shape == shape[:-1] + (shape[-1] // 2,)


@pytest.mark.slow  # interpreter past one swizzle tile (~4 s)
def test_cast_fp16_and_swizzle_past_one_tile():
    x = special_blocks(spread((133, 48), 5)).half()  # 133 rows: two row tiles; 3 scale columns: padded to 4
    got = n4.cast_nvfp4(x)
    assert_same(got, n4.cast_nvfp4_ref(x))
    full = u8(n4.from_blocked(got[1], 256, 4))
    assert got[1].numel() == 256 * 4 and full[133:].eq(0).all() and full[:, 3].eq(0).all()  # zero padding
    assert torch.equal(u8(n4.from_blocked(got[1], 133, 3)), u8(n4.quantize_ref(x)[1]))


def test_cast_guards():
    assert "multiple of 16" in n4.cast_nvfp4_check(torch.zeros(2, 24, dtype=torch.bfloat16))
    assert "x dtype" in n4.cast_nvfp4_check(torch.zeros(2, 32))
    assert "not contiguous" in n4.cast_nvfp4_check(torch.zeros(32, 32, dtype=torch.bfloat16).t())
    assert "1-element fp32" in n4.cast_nvfp4_check(torch.zeros(2, 32, dtype=torch.bfloat16), torch.ones(2))
    with pytest.raises(ValueError, match="multiple of 16"):
        n4.cast_nvfp4(torch.zeros(2, 24, dtype=torch.bfloat16))


@pytest.mark.slow  # torch.library.opcheck
def test_cast_opcheck():
    x = spread((3, 64), 1).bfloat16()
    torch.library.opcheck(torch.ops.h3plan.cast_nvfp4.default, (x, None))
    torch.library.opcheck(torch.ops.h3plan.cast_nvfp4.default, (x, torch.tensor([0.5])))


@pytest.mark.slow
def test_every_nvfp4_kernel_compiles_for_sm90_without_spills():
    """The GPU compile (Triton -> cubin with triton's ptxas, no GPU needed) of every launch at H3 widths."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, str(root / "benchmarks/probes/nvfp4_compile.py"), "--arch", "90"], env=env,
                       capture_output=True, text=True, timeout=600)
    records = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert p.returncode == 0 and len(records) == 16, p.stdout[-2000:] + p.stderr[-2000:]
    assert all(r["spill_stores"] == 0 and r["spill_loads"] == 0 for r in records), records


def test_e2m1_code_jit_matches_the_reference_everywhere():
    """The kernels' one-fma e2m1 rounding (`e2m1_code`) against the compare-chain reference (`e2m1_codes` of the
    clamped value) on every rounding tie and its fp32 neighbours, +-0, subnormals, saturating values and inf."""
    import triton
    import triton.language as tl

    @triton.jit
    def codes_kernel(v_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        v = tl.load(v_ptr + i, mask=i < n, other=0.0)
        tl.store(out_ptr + i, n4.e2m1_code(v), mask=i < n)

    grid = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 1e30])
    bits = grid.view(torch.int32)
    near = torch.cat([grid, (bits + 1).view(torch.float32), (bits - 1).clamp(min=0).view(torch.float32)])
    sub = torch.tensor([1, 2, 0x7FFFFF], dtype=torch.int32).view(torch.float32)  # fp32 subnormals
    rand = torch.rand(200, generator=torch.Generator().manual_seed(3)) * 7
    v = torch.cat([near, sub, torch.tensor([float("inf")]), rand])
    v = torch.cat([v, -v])
    out = torch.empty(v.numel(), dtype=torch.int32)
    codes_kernel[(1,)](v, out, v.numel(), BLOCK=triton.next_power_of_2(v.numel()))
    want = n4.e2m1_codes(v.clamp(-n4.E2M1_MAX, n4.E2M1_MAX)).to(torch.int32)
    assert torch.equal(out, want), v[out != want]


# static: 130 rows, ~20 s interpreted
@pytest.mark.parametrize("static", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_cast_odd_width_rows_and_word_fallback(static):
    """A width that ends inside a 64-column group (208: one 256-column chunk, its last 48 columns masked), 130 rows
    (two row tiles, the second nearly empty), tiny, zero, -0 and saturating blocks (static g: scales clamp at 448),
    and the same data at an odd storage offset (no int32 view: the element-pair loads). 133 rows in fp16:
    test_cast_fp16_and_swizzle_past_one_tile."""
    x = special_blocks(spread((130 if static else 6, 208), 11)).bfloat16()  # the interpreter runs a program a row
    x[5, 64:80] = 1e-30  # a tiny block: its scale clamps at 2^-6
    g = torch.tensor([1e-4]) if static else None  # static: most blocks saturate (amax / 6 / g > 448)
    assert_same(n4.cast_nvfp4(x, g), n4.cast_nvfp4_ref(x, g))
    x = x[:6].contiguous()
    odd = torch.empty(x.numel() + 1, dtype=x.dtype)[1:].view(x.shape)
    odd.copy_(x)
    assert n4.pair_args(odd)[-1] == 2 and n4.pair_args(x)[-1] == 0
    assert_same(n4.cast_nvfp4(odd, g), n4.cast_nvfp4_ref(x, g))


@pytest.mark.parametrize("rows,n", [(3, 128), *(pytest.param(*c, marks=pytest.mark.slow)
                                                for c in ((130, 128), (128, 128), (3, 80), (200, 1040)))])
def test_scale_padding_zeroed_whatever_the_buffer_held(monkeypatch, rows, n):
    """`outputs` zeroes only the swizzled layout's padding (the last row tile, or all of it when n/16 % 4): with
    every fresh buffer full of 0xFF bytes, the cast still gives the reference's zero padding and its scales."""
    empty = torch.empty

    def dirty(*a, **k):
        return empty(*a, **k).fill_(255) if k.get("dtype") == torch.uint8 else empty(*a, **k)

    monkeypatch.setattr(torch, "empty", dirty)
    x = (torch.randn(rows, n, generator=torch.Generator().manual_seed(rows + n)) * 3).bfloat16()
    assert_same(n4.cast_nvfp4(x), n4.cast_nvfp4_ref(x))
