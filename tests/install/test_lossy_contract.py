"""The lossy levers' contract, on the CPU: an installed lossy path's output is neither zeros nor its input, and lies
within a bound derived from its number format of the exact (unquantised) reference. A lossy path that returned zeros,
passed its input through, or lost accuracy beyond its format fails here.

- gemm_quant=fp8 (per-tensor activations) and fp8_act_quant=row (per-row activations): the installed block linears
  (FP8Linear / FP8RowLinear, CPU emulation) against the bf16 linear computed in fp32. e4m3 round to nearest even
  errs by at most 2^-4 relative for a normal value and 2^-10 x scale below 2^-6 x scale (half the smallest subnormal),
  so with e_w, e_x those per-element bounds |y_q - y| <= |x| e_w^T + e_x |w|^T + e_x e_w^T, plus the fp32 sum's
  K 2^-24 |x||w|^T and the bf16 result's half ulp (2^-8 relative of |y_q|).
- gemm_quant=nvfp4: the NVFP4Linear (emulation) the same way, with NVFP4's per-element bound: a 16-block's dequant
  factor S = e4m3(amax_b / 6 / g) g (clamped to >= 2^-6 g; g = amax / 2688) is at most (amax_b / 6)(1 + 2^-4) or
  2^-6 g, and e2m1's widest half-spacing (between 4 and 6) is 1: |x_q - x| <= S; a block scale rounded down
  saturates at 6 / (1 - 2^-4), within 0.4 S.
- vae_tiles=fp8_tiles (the VAE's FP8 decoder GEMMs): the installed block's GEMMs against the float16 linear, the
  e4m3 bound with per-row activations and a float16 result (2^-11 relative).
- vae_precision=fp16 / bf16 (diffusers' decoder ops): the plan's decode is diffusers' decode of the VAE cast as
  from_pretrained(torch_dtype=...) casts it, bit for bit (tolerance 0 against the reference at that precision).
- vae_encode_precision=fp16 / bf16: the plan's encode is the encoder and quant_conv cast by hand to that dtype, bit
  for bit (the reference at the plan's precision: its tolerance is 0).
The other lossy levers' contracts live beside their kernels, each failing when its output is zeros or its input:
modulation=fp32 tests/kernels/test_modulation.py::test_fp32_mode_error_bound; the FP8 attention inputs
(qk_norm_rope=fused_fp8) with dynamic and static fp8_scales tests/kernels/test_qk_fp8.py::
test_quantisation_error_budget and ::test_static_scales_and_saturation; vae_precision=fp16 with the fused decoder
ops, bit for bit diffusers' fp16 decode: tests/install/test_install_vae.py::
test_fp16_plan_decode_is_bitwise_the_fp16_loaded_vae_and_every_fused_path_ran.
"""

import pytest
import torch
from install_helpers import LEVERS, plan, tiny_inputs, tiny_model

from h3plan.install import install, uninstall
from h3plan.runtime.quant import BLOCK_LINEARS

U8, U4 = 2.0**-4, 2.0**-4  # e4m3's relative half-ulp; e4m3 block scales of NVFP4 alike


def contract(out, inp, ref, bound):
    """`out` is neither zeros nor `inp`, has `ref`'s shape, and every element lies within `bound` of `ref`."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.count_nonzero(out) > 0, "the lossy output is all zeros"
    assert out.shape != inp.shape or not torch.equal(out.float(), inp.float()), "the lossy output is its input"
    err = (out.float() - ref.float()).abs()
    worst = (err - bound).max().item()
    assert bool((err <= bound).all()), f"outside the derived bound by {worst:.3g} (max err {err.max().item():.3g})"


def e4m3_error(t, amax):
    """Per-element bound of e4m3 RNE with scale amax / 448 (amax broadcastable to t)."""
    s = amax / 448.0
    return torch.maximum(t.abs() * U8, 2.0**-10 * s)


def gemm_bound(x, w, ex, ew, y_q):
    K = x.shape[-1]
    xa, wa = x.abs(), w.abs()
    return xa @ ew.t() + ex @ wa.t() + ex @ ew.t() + K * 2.0**-24 * (xa @ wa.t()) + 2.0**-8 * y_q.float().abs()


def _linears(fmt, **levers):
    """(installed tiny model, {path: original bf16 weight as fp32}, bf16 input rows of block 0's widths)."""
    model = tiny_model()
    block = model.transformer_blocks[0]
    weights = {p: block.get_submodule(p).weight.detach().float().clone() for p in BLOCK_LINEARS}
    install(model, plan(gemm_quant=fmt, attention="sdpa", **levers), registry=LEVERS)
    x = tiny_inputs()["hidden_states"]  # a seeded standard-normal source, scaled per row below
    g = torch.Generator().manual_seed(7)
    return model, weights, g, x


def _rows(g, k):
    """48 bf16 rows of width k, rows of very different scale (per-tensor scaling sends the small ones subnormal)."""
    return (torch.randn(48, k, generator=g) * torch.logspace(-2, 1, 48)[:, None]).to(torch.bfloat16)


@pytest.mark.parametrize("act", ["tensor", "row"])
def test_fp8_block_linears_within_the_e4m3_bound(act):
    model, weights, g, _ = _linears("fp8", **({"fp8_act_quant": "row"} if act == "row" else {}))
    for path in BLOCK_LINEARS:
        lin = model.transformer_blocks[0].get_submodule(path)
        assert type(lin).__name__ == ("FP8RowLinear" if act == "row" else "FP8Linear")
        w = weights[path]
        x = _rows(g, w.shape[1])
        y = lin(x)
        xf = x.float()
        amax_x = xf.abs().amax(-1, keepdim=True) if act == "row" else xf.abs().amax()
        ew = e4m3_error(w, w.abs().amax(-1, keepdim=True))  # per-output-channel weight scales
        contract(y, x, xf @ w.t(), gemm_bound(xf, w, e4m3_error(xf, amax_x), ew, y))
    uninstall(model)


def nvfp4_error(t):
    """Per-element bound of NVFP4 (16-blocks along the last dim, e4m3 block scales, fp32 global scale)."""
    g = t.abs().amax() / (6.0 * 448.0)
    amax_b = t.unflatten(-1, (-1, 16)).abs().amax(-1, keepdim=True)
    s = torch.maximum(amax_b / 6.0 * (1 + U4), 2.0**-6 * g)
    return s.expand(*amax_b.shape[:-1], 16).flatten(-2)


@pytest.mark.slow  # the NVFP4 casts run in the Triton interpreter (~20 s)
def test_nvfp4_block_linears_within_the_e2m1_bound():
    model, weights, g, _ = _linears("nvfp4")
    for path in BLOCK_LINEARS:
        lin = model.transformer_blocks[0].get_submodule(path)
        assert type(lin).__name__ == "NVFP4Linear"
        w = weights[path]
        x = _rows(g, w.shape[1])
        y = lin(x)
        xf = x.float()
        contract(y, x, xf @ w.t(), gemm_bound(xf, w, nvfp4_error(xf), nvfp4_error(w), y))
    uninstall(model)


def test_vae_fp8_decoder_linears_within_the_e4m3_bound():
    """The installed FP8 decoder GEMMs (vae_tiles=fp8_tiles, the fp8 recipe) of the first decoder block, as the block
    runs them (`route` then fp8_linear), against the float16 linear computed in fp32: per-row e4m3 activations,
    per-channel e4m3 weights of the float16 weight, one float16 rounding (2^-11 relative)."""
    from test_install_vae import tiny_vae
    from test_install_vae_fp8 import fp8_plan

    from h3plan.install.vae.block import LINEARS
    from h3plan.install.vae.fp8 import fp8_linear

    vae = tiny_vae()
    block = vae.decoder.transformer_blocks[0]
    weights = {p: (block.get_submodule(p).weight.detach().half().float(), block.get_submodule(p).bias) for p in LINEARS}
    install(vae, fp8_plan())
    g = torch.Generator().manual_seed(9)
    for path in LINEARS:
        lin = block.get_submodule(path)
        w, b = weights[path]
        x = (torch.randn(40, w.shape[1], generator=g) * torch.logspace(-2, 1, 40)[:, None]).half()
        with torch.no_grad():  # as diffusers decodes
            gemms = block._h3plan_vae.fp8.route(x)
            assert gemms is not None, "the FP8 GEMMs do not run for a float16 call"
            y = fp8_linear(x, gemms[lin])
        xf = x.float()
        bias = 0.0 if b is None else b.detach().half().float()
        ew = e4m3_error(w, w.abs().amax(-1, keepdim=True))
        bound = gemm_bound(xf, w, e4m3_error(xf, xf.abs().amax(-1, keepdim=True)), ew, y) - 2.0**-8 * y.float().abs()
        contract(y, x, xf @ w.t() + bias, bound + 2.0**-11 * y.float().abs())
    uninstall(vae)


@pytest.mark.parametrize("dtype,name", [(torch.float16, "fp16"), (torch.bfloat16, "bf16")])
def test_lossy_decode_is_diffusers_decode_of_the_cast_vae(dtype, name):
    import h3plan
    from test_install_vae import cast, decode, latent, tiny_vae

    plan_ = h3plan.resolve_config(hardware="sm90", recipe="bf16", vae="h3_tiny", **{
        "recipe.vae": name, "levers.vae_ops": "eager", "levers.vae_graphs": "off"})
    assert plan_.decision("vae_precision").setting == name
    vae, z = tiny_vae(), latent()
    exact, want = decode(tiny_vae(), z), decode(cast(tiny_vae(), dtype), z)
    install(vae, plan_)
    got = decode(vae, z)
    assert got.dtype == dtype and torch.count_nonzero(got) > 0 and not torch.equal(got.float(), exact.float())
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    uninstall(vae)


@pytest.mark.parametrize("dtype,name", [(torch.float16, "fp16"), (torch.bfloat16, "bf16")])
def test_lossy_encode_is_the_encoder_cast_by_hand(dtype, name):
    from test_install_vae_encode import FL2VA, _encode, _plan, _x, tiny_vae

    vae, ref = tiny_vae(), tiny_vae()
    install(vae, _plan(**FL2VA, **{"recipe.vae": "fp16", "levers.vae_precision": "fp32",
                                   "levers.vae_encode_precision": name}))
    ref.encoder.to(dtype)
    ref.quant_conv.to(dtype)
    x = _x()
    exact = _encode(tiny_vae(), x)
    got, want = _encode(vae, x), _encode(ref, x)
    assert got.dtype == dtype and torch.count_nonzero(got) > 0 and not torch.equal(got.float(), exact)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    uninstall(vae)
