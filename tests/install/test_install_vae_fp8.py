"""vae_tiles' FP8 decode (tile_dtype fp8): the decoder-block linears as FP8 GEMMs, on the CPU (fp32 emulation).

Numeric contracts: the FP8 linear is bit for bit its torch reference (per-row e4m3 activations, per-channel
e4m3 weights from the float16 weights, fp32 GEMM, one float16 rounding), since the emulation keeps those
rounding points; the whole decode is lossy, bounded by PSNR (derivation at PSNR_MIN_DB).
"""

import pytest
import torch

import h3plan
from h3plan.actions.quality import psnr
from h3plan.errors import H3PlanError
from h3plan.install import counters, fallback_reasons, install, reset_counters, uninstall
from h3plan.install.vae.fp8 import Fp8Gemms, fp8_linear, quantize_linear
from test_install_vae import BLOCKS, TILING, cast, decode, latent, tiny_vae

E4M3, MAX = torch.float8_e4m3fn, 448.0
# e4m3 has 3 mantissa bits: each operand's relative rounding error is <= 2^-4, so a GEMM output is within
# (2 * 2^-4 + 2^-8) ~= 0.13 of sum|a*w|; frames within 13% of their [0, 1] range: PSNR >= 20 log10(1/0.13) = 17.7 dB.
PSNR_MIN_DB = 20 * torch.log10(torch.tensor(1 / (2 * 2**-4 + 2**-8))).item()


@pytest.fixture(autouse=True)
def _counters():
    reset_counters()


def fp8_plan(**levers):
    return h3plan.resolve_config(hardware="sm90", recipe="fp8", vae="h3_tiny",
                                 **{"levers.vae_graphs": "off", **{f"levers.{k}": v for k, v in levers.items()}})


def reference(x, lin):
    """Per-row e4m3 activations x per-channel e4m3 weights (from the float16 weight), fp32 GEMM, one fp16 rounding."""
    w = lin.weight.detach().half().float()
    ws = w.abs().amax(dim=1).clamp(min=1e-12) / MAX
    wq = (w / ws[:, None]).clamp(-MAX, MAX).to(E4M3).float() * ws[:, None]
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    s = torch.where(amax > 0, MAX / amax, torch.ones_like(amax))
    xq = (xf * s).clamp(-MAX, MAX).to(E4M3).float() * (1 / s)
    return (xq @ wq.t() + lin.bias.detach().half().float()).half()


@pytest.mark.parametrize("autocast", [False, True])
def test_fp8_linear_is_its_reference_bit_for_bit_in_the_fallback(autocast):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48)
    x = (torch.randn(2, 7, 64) * torch.logspace(-3, 2, 7)[:, None]).half()
    x[0, 3] = 0  # amax 0: scale 1
    with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):  # the emulation turns autocast off
        out = fp8_linear(x, quantize_linear(lin))
    torch.testing.assert_close(out, reference(x, lin), rtol=0, atol=0)
    assert out.dtype == torch.float16 and not torch.equal(
        out, torch.nn.functional.linear(x, lin.weight.half(), lin.bias.half()))
    assert counters()["vae_tiles.fp8_gemm.fallback"] == 1
    assert "FP8 GEMM needs CUDA" in " | ".join(fallback_reasons()["vae_tiles.fp8_gemm"])


@pytest.mark.slow
def test_fp8_plan_decodes_within_the_e4m3_bound_and_counts_every_gemm():
    plan = fp8_plan()
    assert plan.decision("vae_tiles").setting == "fp8_tiles"
    vae, ref_vae, z = tiny_vae(), cast(tiny_vae()), latent()  # the plan decodes in fp16 (vae_precision)
    ref_vae.enable_tiling(288, 272, 32, 32)  # the plan's geometry and precision: the comparison isolates the FP8 GEMMs
    ref = decode(ref_vae, z)
    report = install(vae, plan)
    assert all(isinstance(b._h3plan_vae.fp8, Fp8Gemms) for b in vae.decoder.transformer_blocks)
    assert "vae_tiles.fp8_decode" not in dict(report.skipped)
    assert any("FP8 e4m3 GEMMs" in str(s) for s in report.swaps)
    out = decode(vae, z)
    c = counters()
    assert c["vae_tiles.fp8_gemm.fallback"] == 6 * BLOCKS and "vae_tiles.fp8_gemm.fused" not in c  # CPU: emulated
    assert c.get("vae_tiles.fp8_rows.fused", 0) + c.get("vae_tiles.fp8_rows.fallback", 0) == 6 * BLOCKS
    p = psnr(((out.float() + 1) / 2).clamp(0, 1), ((ref.float() + 1) / 2).clamp(0, 1))
    assert p is not None and PSNR_MIN_DB <= p, (p, PSNR_MIN_DB)  # lossy (not identical), within the bound
    reset_counters()
    bf16 = torch.bfloat16  # a user's bfloat16 autocast: diffusers' path (exact), one fallback per block
    torch.testing.assert_close(decode(vae, z, autocast=bf16), decode(ref_vae, z, autocast=bf16), rtol=0, atol=0)
    assert counters() == {"vae_tiles.fp8_gemm.fallback": BLOCKS}
    assert "autocast dtype torch.bfloat16 != float16" in " | ".join(fallback_reasons()["vae_tiles.fp8_gemm"])


@pytest.mark.parametrize("vae_ops", ["eager", "fused"])
def test_uninstall_restores_the_block_linears_and_tiling_exactly(vae_ops):
    vae = tiny_vae()
    before = {k: v.clone() for k, v in vae.state_dict().items()}
    tiling = {a: getattr(vae, a) for a in TILING}
    install(vae, fp8_plan(vae_ops=vae_ops))
    assert all(b._h3plan_vae.fp8 is not None for b in vae.decoder.transformer_blocks)
    uninstall(vae)
    after = vae.state_dict()
    assert after.keys() == before.keys()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    assert {a: getattr(vae, a) for a in TILING} == tiling
    assert all("forward" not in m.__dict__ and not hasattr(m, "_h3plan_vae") for m in vae.modules())


def test_edited_linear_while_installed_is_refused():
    vae, z = tiny_vae(), latent()
    install(vae, fp8_plan())
    with torch.no_grad():
        vae.decoder.transformer_blocks[0].attn.to_q.weight.mul_(2)
    with pytest.raises(h3plan.errors.InstallError, match="FP8 codes would be stale"):
        decode(vae, z)


def test_a_lossless_recipe_never_gets_fp8_gemms():
    plan = h3plan.resolve_config(hardware="sm90", recipe="bf16", vae="h3_tiny", **{"levers.vae_ops": "fused"})
    assert plan.decision("vae_tiles").setting == "default"
    vae = tiny_vae()
    install(vae, plan)
    assert all(b._h3plan_vae.fp8 is None for b in vae.decoder.transformer_blocks)
    with pytest.raises((H3PlanError, ValueError), match="lossless"):
        h3plan.resolve_config(hardware="sm90", recipe="bf16", vae="h3_tiny", **{"levers.vae_tiles": "fp8_tiles"})
