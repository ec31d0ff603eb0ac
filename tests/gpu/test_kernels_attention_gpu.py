"""H200 suite for the attention-side and VAE kernels: bit-exact against diffusers' eager modules at real
shapes (S = 19,000 tokens x 56 heads x 128, one input over 2^31 elements, the VAE decoder block under FP16
autocast). Numeric contract everywhere: rtol=0, atol=0 (bits); FP8 codes exact against the torch
amax / scale / clamp / cast reference (the FP8 values themselves are lossy by design; the error is printed).

    python3 -m pytest tests/gpu/test_kernels_attention_gpu.py -m gpu -s

Each test prints one line. The first test also reports which device-numerics variant of the fused
norm (rsqrt approx|rn x reduction cuda_tree|triton) matches eager, so a mismatch names the fix.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F

from h3plan.runtime.kernels import qk_fp8_lean as lean
from h3plan.runtime.kernels import qk_norm_rope as m
from h3plan.runtime.kernels import ulysses_merge as um
from h3plan.runtime.kernels import vae

pytestmark = pytest.mark.gpu

DEV = "cuda"
H, D, HIDDEN = 56, 128, 5376


def ndiff(a, b) -> int:
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    return int((a.contiguous().view(ints) != b.contiguous().view(ints)).sum().item())


def positions(S: int) -> torch.Tensor:
    """(S, 3) int (t, h, w): 300 text rows on the t axis, then a video grid of 34 x 60 latents per frame."""
    text = min(300, S)
    t = torch.arange(text)
    rows = [torch.stack([t, torch.zeros_like(t), torch.zeros_like(t)], -1)]
    n = S - text
    if n:
        s = torch.arange(n)
        rows.append(torch.stack([1 + s // (34 * 60), (s // 60) % 34, s % 60], -1))
    return torch.cat(rows)


@pytest.fixture(scope="module")
def tm():
    import diffusers.models.transformers.transformer_minimax_h3 as tm

    return tm


def _rope(tm, S):
    rope = tm.MiniMaxH3RotaryPosEmbed(rope_freq_dim=16, rope_theta=10000.0).to(DEV)
    return rope(positions(S).to(DEV))


def _weights(seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    wq = (1 + 0.2 * torch.randn(D, device=DEV, generator=g)).bfloat16()
    wk = (1 + 0.2 * torch.randn(D, device=DEV, generator=g)).bfloat16()
    return wq, wk


def _eager(tm, x, w, cos, sin):
    """diffusers' sequence on (B, S, H*D) or (B, S, H, D): nn.RMSNorm's functional + _apply_rotary_emb."""
    x4 = x.unflatten(-1, (H, D)) if x.dim() == 3 else x
    return tm._apply_rotary_emb(F.rms_norm(x4, (D,), w, 1e-5), cos, sin)


@torch.no_grad()
def test_qk_norm_rope_vs_diffusers_attention(tm, monkeypatch):
    """The real MiniMaxH3Attention processor at S=19,000: to_q/to_k -> norm_q/norm_k -> _apply_rotary_emb,
    captured at the attention call; the kernel on the captured norm inputs must give the same bits."""
    S = 19000
    torch.manual_seed(0)
    attn = tm.MiniMaxH3Attention(hidden_size=HIDDEN, heads=H, dim_head=D).to(DEV, torch.bfloat16)
    attn.norm_q.weight.normal_(1.0, 0.2)
    attn.norm_k.weight.normal_(1.0, 0.2)
    cos, sin = _rope(tm, S)
    seen = {}
    attn.norm_q.register_forward_pre_hook(lambda mod, a: seen.update(q=a[0]))
    attn.norm_k.register_forward_pre_hook(lambda mod, a: seen.update(k=a[0]))
    monkeypatch.setattr(tm, "dispatch_attention_fn",
                        lambda query, key, value, **kw: seen.update(qo=query, ko=key) or torch.zeros_like(query))
    attn(torch.randn(1, S, HIDDEN, device=DEV).bfloat16(), (cos, sin))
    q, k = seen["q"], seen["k"]
    wq, wk, eps = attn.norm_q.weight, attn.norm_k.weight, attn.norm_q.eps
    results = {}
    for rs, red in itertools.product(("approx", "rn"), ("cuda_tree", "triton")):
        qo, ko = m._run(q, k, wq, wk, cos, sin, eps, numerics={"rsqrt": rs, "reduction": red})
        results[(rs, red)] = ndiff(qo, seen["qo"]) + ndiff(ko, seen["ko"])
    qo, ko = m.qk_norm_rope(q, k, wq, wk, cos, sin, eps)
    n_def = ndiff(qo, seen["qo"]) + ndiff(ko, seen["ko"])
    exact = [f"rsqrt={a},reduction={b}" for (a, b), n in results.items() if n == 0]
    print(f"\n[gpu] qk_norm_rope S={S} {H}x{D}: default {m.NUMERICS} -> {n_def} of {2 * qo.numel()} differ; "
          f"per variant {results}; exact variants: {exact or 'none'}")
    assert n_def == 0, f"default numerics differ from eager; exact variants: {exact or 'none'}"


@torch.no_grad()
def test_qk_norm_rope_packed_strides_and_ulysses_pack(tm):
    """q, k, v as chunks of one fused QKV projection (row stride 3*H*D); degree 1 exact vs eager, degrees
    2, 4, 8 exact vs the destination-major permutation of degree 1, v copied bit for bit."""
    S = 19000
    qkv = torch.randn(1, S, 3 * H * D, device=DEV).bfloat16()
    q, k, v = qkv.chunk(3, dim=-1)
    wq, wk = _weights(1)
    cos, sin = _rope(tm, S)
    qo, ko, vo = m.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-5, v=v)
    d = ndiff(qo, _eager(tm, q.contiguous(), wq, cos, sin)) + ndiff(ko, _eager(tm, k.contiguous(), wk, cos, sin))
    d += ndiff(vo, v.unflatten(-1, (H, D)).contiguous())
    packs = {}
    for U in (2, 4, 8):
        p = m.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-5, v=v, ulysses_degree=U)
        ref = torch.stack([qo, ko, vo]).view(3, 1, S, U, H // U, D).permute(3, 0, 1, 2, 4, 5)
        packs[U] = ndiff(p, ref.contiguous())
    print(f"\n[gpu] qk_norm_rope fused-QKV strides S={S}: {d} differ; Ulysses packs {packs} differ")
    assert d == 0 and all(n == 0 for n in packs.values())


@torch.no_grad()
def test_qk_norm_rope_over_2_31_elements(tm):
    """q of (1, 300000, 56*128) = 2.15e9 elements (int32 offsets would wrap at 299,593 tokens): every row
    checked against eager in chunks (eager is row-local, so chunking does not change its bits)."""
    S = 300_000
    q = torch.randn(1, S, H * D, device=DEV, dtype=torch.bfloat16)
    assert q.numel() > 2**31
    wq, wk = _weights(2)
    cos, sin = _rope(tm, S)
    qo, ko = m.qk_norm_rope(q, q, wq, wk, cos, sin, 1e-5)  # k = q: one 4.3 GB input, two outputs
    d = 0
    for a in range(0, S, 25_000):
        b = min(S, a + 25_000)
        d += ndiff(qo[:, a:b], _eager(tm, q[:, a:b], wq, cos[a:b], sin[a:b]))
        d += ndiff(ko[:, a:b], _eager(tm, q[:, a:b], wk, cos[a:b], sin[a:b]))
    tail = ndiff(qo[:, -10:], _eager(tm, q[:, -10:], wq, cos[-10:], sin[-10:]))
    print(f"\n[gpu] qk_norm_rope S={S} ({q.numel() / 2**31:.2f} x 2^31 elements): {d} differ (last rows {tail})")
    assert d == 0 and tail == 0


@torch.no_grad()
def test_qk_norm_rope_special_rows(tm):
    """Zero rows (at position 0 and where the angles are non-trivial: the sign of each zero), rows of one
    large value, fp32-underflowing squares: exact vs eager, bit for bit."""
    S = 64
    x = torch.randn(2, S, H * D, device=DEV).bfloat16()
    x[0, 0] = 0.0
    x[0, 1] = 3e4
    x[1, 2] = 1e-20
    x[1, 3, ::7] = -2e5
    x[0, 37] = 0.0  # a zero row where cos < 0 < sin: t1 = -0, and rotate-half must give -0 * sin too
    x[1, 50] = -0.0
    wq, wk = _weights(3)
    cos, sin = _rope(tm, S)
    qo, ko = m.qk_norm_rope(x, x, wq, wk, cos, sin, 1e-5)
    d = ndiff(qo, _eager(tm, x, wq, cos, sin)) + ndiff(ko, _eager(tm, x, wk, cos, sin))
    print(f"\n[gpu] qk_norm_rope special rows: {d} differ")
    assert d == 0


@torch.no_grad()
def test_qk_norm_rope_fp8_vs_ref(tm):
    """Dynamic (valid_len < S, huge padding rows excluded), Ulysses-packed and static FP8 codes + descales
    exact vs the torch reference built on diffusers' eager norm + RoPE; prints the quantisation error."""
    S, valid = 19000, 18963
    q, k, v = (torch.randn(1, S, H * D, device=DEV).bfloat16() for _ in range(3))
    q[:, valid:, 5::D] = 1e4  # padding rows (AdaLN shift only): must not move the scales
    v[:, valid:] = 3e4
    wq, wk = _weights(4)
    cos, sin = _rope(tm, S)
    lines, bad = [], 0
    for label, kw in (("dynamic", dict(valid_len=valid)), ("dynamic U=4", dict(valid_len=valid, ulysses_degree=4)),
                      ("static", dict(scales=[60.0, 40.0, 0.01]))):
        got = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, **kw)
        ref = m.qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, 1e-5, **kw)
        n = sum(ndiff(a, b) for a, b in zip(got, ref))
        bad += n
        lines.append(f"{label}: {n} differ, descales {got[-1].tolist()}")
    qo, ko, vo = m.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-5, v=v)
    q8, k8, v8, ds = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-5, valid_len=valid)
    errs = []
    for x8, x, dd in zip((q8, k8, v8), (qo, ko, vo), ds):
        x = x[:, :valid].float()
        e = (x8[:, :valid].float() * dd - x).abs()
        errs.append(f"{(e.max() / x.abs().max()).item():.2e}")
    assert ds[2] < 3e4 / 448  # padding v excluded
    print(f"\n[gpu] qk_norm_rope_fp8 S={S}: " + "; ".join(lines) + f"; max |err|/amax q,k,v = {errs}")
    assert bad == 0


@torch.no_grad()
def test_merge_head_chunks():
    U, S_loc, valid = 4, 9455, 9400
    recv = torch.randn(U, 1, S_loc, H // U, D, device=DEV).bfloat16()
    recv[:, :, valid:] = float("nan")  # never read
    out = um.merge_head_chunks(recv, valid)
    d = ndiff(out, um.merge_head_chunks_ref(recv, valid))
    buf = torch.full((1, S_loc + 8, H * D + 64), 7.0, device=DEV, dtype=torch.bfloat16)
    view = buf[:, 4:4 + S_loc, 32:32 + H * D]
    um.merge_head_chunks(recv, valid, out=view)
    d2 = ndiff(view, out)
    keep = torch.ones_like(buf, dtype=torch.bool)
    keep[:, 4:4 + S_loc, 32:32 + H * D] = False
    outside = bool((buf[keep] == 7.0).all())
    print(f"\n[gpu] merge_head_chunks U={U} S_loc={S_loc} valid={valid}: {d} differ; strided out {d2} differ, "
          f"outside untouched={outside}")
    assert d == 0 and d2 == 0 and outside


def _vae_rope(am, B, frames, h, w, registers=4):
    """cos/sin (B, S, 1, 48) exactly as MiniMaxH3VideoViTDecoder3d builds them."""
    grids = [2.0 * (torch.arange(0.5, n, dtype=torch.float32, device=DEV) / n) - 1.0 for n in (frames, h, w)]
    pos = torch.stack(torch.meshgrid(*grids, indexing="ij"), dim=-1).flatten(0, 2)
    pos = pos.unsqueeze(0).expand(B, -1, -1)
    pos = torch.cat([pos, pos.new_zeros((B, registers + 1, 3))], dim=1)
    return am.MiniMaxH3VideoRotaryPosEmbed(48).to(DEV)(pos)


@torch.no_grad()
@pytest.mark.parametrize("B,frames,h,w", [(2, 7, 16, 16), (1, 7, 48, 84)])
def test_vae_kernels_vs_diffusers_block_autocast(monkeypatch, B, frames, h, w):
    """diffusers' MiniMaxH3VideoTransformerBlock (fp32 checkpoint) under torch.autocast(fp16): the processor's
    q/k after norm + RoPE and the block's h + attn * scale1, for an fp32 stream and an fp16 one (block 0)."""
    import diffusers.models.autoencoders.autoencoder_kl_minimax_h3 as am

    torch.manual_seed(0)
    blk = am.MiniMaxH3VideoTransformerBlock(dim=2048, heads=32, dim_head=64).to(DEV)
    blk.scale1.normal_(0.0, 0.1)
    cos, sin = _vae_rope(am, B, frames, h, w)
    S = cos.shape[1]
    seen = {}
    monkeypatch.setattr(am, "dispatch_attention_fn",
                        lambda query, key, value, **kw: seen.update(q=query, k=key) or query.clone())
    blk.attn.to_q.register_forward_hook(lambda mod, i, o: seen.update(pq=o))
    blk.attn.to_k.register_forward_hook(lambda mod, i, o: seen.update(pk=o))
    blk.attn.register_forward_hook(lambda mod, i, o: seen.update(y=o))
    blk.norm2.register_forward_pre_hook(lambda mod, i: seen.update(h1=i[0]))
    res = []
    for h0 in (torch.randn(B, S, 2048, device=DEV) * 3, (torch.randn(B, S, 2048, device=DEV) * 3).half()):
        with torch.autocast("cuda", dtype=torch.float16):
            blk(h0, (cos, sin))
        assert seen["pq"].dtype == torch.float16 and seen["y"].dtype == torch.float16
        q, k = vae.vae_qk_norm_rope(seen["pq"].unflatten(2, (32, 64)), seen["pk"].unflatten(2, (32, 64)), cos, sin,
                                    blk.attn.norm_q.eps)
        dq = ndiff(q, seen["q"]) + ndiff(k, seen["k"])
        dr = ndiff(vae.scaled_residual(h0, seen["y"], blk.scale1), seen["h1"])
        res.append((str(h0.dtype).split(".")[-1], dq, dr))
    print(f"\n[gpu] vae B={B} S={S}: (stream dtype, qk differ, residual differ) = {res}")
    assert all(dq == 0 and dr == 0 for _, dq, dr in res)
