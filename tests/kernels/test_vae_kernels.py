"""VAE decoder kernels (Triton interpreter): vae_qk_norm_rope and scaled_residual.

Numeric contract: rtol=0, atol=0 (bits). vae_qk_norm_rope against the processor's eager sequence with
torch's RMSNorm swapped for the CUDA-order emulation (torch on the CPU sums in another order; the GPU
suite checks real CUDA eager), including diffusers' own MiniMaxH3VideoAttnProcessor; scaled_residual
against eager `h + y * scale` and against diffusers' MiniMaxH3VideoTransformerBlock, unmodified.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from h3plan.runtime.kernels import qk_norm_rope as qm
from h3plan.runtime.kernels.vae import (scaled_residual, scaled_residual_check, scaled_residual_ref, vae_qk_norm_rope,
                                vae_qk_norm_rope_check, vae_qk_norm_rope_ref)


@pytest.fixture
def cuda_order(monkeypatch):
    monkeypatch.setattr(F, "rms_norm", lambda x, shape, w=None, eps=None: qm.emulate_cuda_rms_norm(x, w, eps))


def vae_rope(B, S, R, seed=0):
    """cos/sin (B, S, 1, R) as MiniMaxH3VideoRotaryPosEmbed builds them from [-1, 1) coordinates."""
    pos = torch.rand(B, S, 3, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    inv = 1.0 / 100.0 ** torch.arange(0, 1, 6 / R)
    ang = (2.0 * math.pi * pos[:, :, :, None] * inv).flatten(2, 3).tile(2).unsqueeze(2)
    return ang.cos(), ang.sin()


def bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


@pytest.mark.parametrize("B,S,H,D,R,dtype", [pytest.param(2, 9, 4, 64, 48, torch.float16,
                                                          marks=pytest.mark.slow),  # ~3 s
                                             (1, 5, 3, 32, 24, torch.float16),
                                             (1, 4, 2, 64, 48, torch.bfloat16)])
def test_vae_qk_exact(cuda_order, B, S, H, D, R, dtype):
    g = torch.Generator().manual_seed(S)
    q = (torch.randn(B, S, H * D, generator=g) * 4).to(dtype).unflatten(2, (H, D))
    k = torch.randn(B, S, H, D, generator=g).to(dtype)
    k[0, 0] = 0.0
    cos, sin = vae_rope(B, S, R)
    got = vae_qk_norm_rope(q, k, cos, sin, 1e-5)
    ref = vae_qk_norm_rope_ref(q, k, cos, sin, 1e-5)
    for a, b in zip(got, ref):
        assert a.shape == (B, S, H, D) and a.is_contiguous() and a.dtype == dtype
        assert torch.equal(bits(a), bits(b)), f"{(bits(a) != bits(b)).sum().item()} differ"
    # (S, R) cos/sin broadcast over the batch too
    got2 = vae_qk_norm_rope(q[:1], k[:1], cos[0, :, 0], sin[0, :, 0], 1e-5)
    assert torch.equal(bits(got2[0]), bits(got[0][:1]))


@pytest.mark.slow  # a diffusers VAE block in the interpreter (~5 s)
def test_matches_diffusers_vae_block(cuda_order, monkeypatch):
    """diffusers' MiniMaxH3VideoTransformerBlock with FP16 attention/FFN and fp32 norms and scales (what
    autocast or an fp16 torch_dtype gives): the processor's q/k after norm + RoPE, and the residual
    h + attn * scale1 the block computes, against the kernels on the captured intermediates."""
    import diffusers.models.autoencoders.autoencoder_kl_minimax_h3 as am

    torch.manual_seed(0)
    dim, H, D, B, S = 96, 3, 32, 2, 10
    blk = am.MiniMaxH3VideoTransformerBlock(dim=dim, heads=H, dim_head=D, ffn_mult=2)
    blk.attn.half()
    blk.ff.half()
    with torch.no_grad():
        blk.scale1.normal_()
        blk.scale2.normal_()
    rope = am.MiniMaxH3VideoRotaryPosEmbed(int(D * 0.75))
    cos, sin = rope(torch.rand(B, S, 3) * 2 - 1)
    seen = {}
    monkeypatch.setattr(am, "dispatch_attention_fn",
                        lambda query, key, value, **kw: seen.update(q=query, k=key) or query.clone())
    blk.attn.to_q.register_forward_hook(lambda mod, i, o: seen.update(pq=o))
    blk.attn.to_k.register_forward_hook(lambda mod, i, o: seen.update(pk=o))
    blk.attn.register_forward_hook(lambda mod, i, o: seen.update(y=o))
    blk.norm2.register_forward_pre_hook(lambda mod, i: seen.update(h1=i[0]))
    for h0 in (torch.randn(B, S, dim), torch.randn(B, S, dim).half()):  # fp32 stream; fp16 into block 0
        with torch.no_grad():
            blk(h0, (cos, sin))
        q, k = vae_qk_norm_rope(seen["pq"].unflatten(2, (H, D)), seen["pk"].unflatten(2, (H, D)), cos, sin,
                                blk.attn.norm_q.eps)
        assert torch.equal(bits(q), bits(seen["q"])) and torch.equal(bits(k), bits(seen["k"]))
        h1 = scaled_residual(h0, seen["y"], blk.scale1)
        assert h1.dtype == seen["h1"].dtype == torch.float32
        assert torch.equal(bits(h1), bits(seen["h1"]))


@pytest.mark.parametrize("shape,hdt,ydt", [((2, 7, 100), torch.float32, torch.float16),
                                           ((3, 2048), torch.float16, torch.float16),
                                           ((1, 5, 64), torch.float32, torch.bfloat16),
                                           ((2, 3, 33), torch.bfloat16, torch.float32)])
def test_scaled_residual_exact(shape, hdt, ydt):
    g = torch.Generator().manual_seed(1)
    h = torch.randn(shape, generator=g).to(hdt)
    y = torch.randn(shape, generator=g).to(ydt)
    scale = torch.randn(shape[-1], generator=g) * 0.5
    out = scaled_residual(h, y, scale)
    ref = scaled_residual_ref(h, y, scale)
    assert out.dtype == ref.dtype == torch.float32
    assert torch.equal(bits(out), bits(ref))
    # an FMA (one rounding of h + y*scale) would differ on some elements: the test can tell
    fma = (h.double() + y.double() * scale.double()).float()
    assert not torch.equal(bits(fma), bits(ref))


def test_vae_guards():
    q = torch.randn(1, 3, 2, 32).half()
    cos, sin = vae_rope(1, 3, 24)
    assert vae_qk_norm_rope_check(q, q, cos, sin, 1e-5) is None
    for args, msg in [
        ((q.flatten(2), q.flatten(2), cos, sin, 1e-5), "(B, S, H, D)"),
        ((q.double(), q.double(), cos, sin, 1e-5), "dtype"),
        ((q.float(), q.float(), cos, sin, 1e-5), "dtype"),  # fp32: torch reduces its RMSNorm in another order
        ((q, q.float(), cos, sin, 1e-5), "dtype"),
        ((q, q, cos.half(), sin.half(), 1e-5), "dtype"),
        ((q, q, cos[:, :2], sin[:, :2], 1e-5), "rows"),
        ((q, q, cos.expand(1, 3, 2, 24), sin.expand(1, 3, 2, 24), 1e-5), "broadcast over heads"),
        ((q, q, cos.expand(2, 3, 1, 24), sin.expand(2, 3, 1, 24), 1e-5), "batch"),
        ((q[..., ::2], q[..., ::2], cos, sin, 1e-5), "contiguous"),
        ((q[..., :30], q[..., :30], cos, sin, 1e-5), "multiple of 4"),
    ]:
        reason = vae_qk_norm_rope_check(*args)
        assert reason is not None and msg in reason, (msg, reason)
        with pytest.raises(ValueError):
            vae_qk_norm_rope(*args)
    h, y, s = torch.randn(2, 8), torch.randn(2, 8).half(), torch.randn(8)
    assert scaled_residual_check(h, y, s) is None
    for args, msg in [((h, y, s.half()), "float32"), ((h, y[:1], s), "shape"), ((h, y, s[:4]), "scale must"),
                      ((h.t(), y.t(), torch.randn(2)), "contiguous"), ((h.long(), y, s), "dtype")]:
        reason = scaled_residual_check(*args)
        assert reason is not None and msg in reason, (msg, reason)
        with pytest.raises(ValueError):
            scaled_residual(*args)


@pytest.mark.slow  # torch.library.opcheck of every VAE op (~2 s)
def test_opcheck_vae_ops():
    q = torch.randn(1, 3, 2, 32).half()
    cos, sin = vae_rope(1, 3, 24)
    torch.library.opcheck(torch.ops.h3plan.vae_qk_norm_rope.default, (q, q, cos, sin, 1e-5))
    torch.library.opcheck(torch.ops.h3plan.scaled_residual.default,
                          (torch.randn(2, 8), torch.randn(2, 8).half(), torch.randn(8)))
