"""Attention-side and VAE kernels at MiniMax-H3 shapes: Q/K RMSNorm + partial RoPE (bf16, Ulysses pack, FP8),
the Ulysses head-chunk merge, and the VAE decoder's FP16 Q/K norm + RoPE and scaled residual.

Byte counts, in units of one (B, S, H, D) tensor `u` (R/D = 3/4 of it rotated; cos/sin counted apart):
- qk_norm_rope: fused reads q, k and writes them (4u) + cos/sin fp32 once. Eager per tensor: rms_norm 2u,
  rotary * cos 1.5u, -x2 0.75u, cat 1.5u, rotated * sin 1.5u, add 2.25u, final cat 2u = 11.5u, plus four
  cos/sin casts (fp32 read, bf16 write) and their bf16 reads in the products.
- with v and Ulysses degree U: fused also reads and writes v (6u); eager adds the pack (stack + permute
  copy of q, k, v: 3u read + 3u write, twice).
- qk_norm_rope_fp8_lean dynamic: two passes over q, k, v (an amax over the whole tensor must finish before the
  first cast, and 3 x 272 MB do not fit on chip): 6u read + 1.5u of e4m3 written, cos/sin twice. Static: one
  pass, 3u + 1.5u. Eager per tensor, after the bf16 norm + RoPE: amax (float 1u -> 2u, abs 4u, amax 2u) and
  cast (float 3u, * scale 4u, clamp 4u, to e4m3 2.5u) = 22.5u; v is read from the projection.
- merge_head_chunks: reads the valid rows once, writes every row (2u at valid = S); eager is the same
  bytes in two kernels (permuted copy, zero fill).
- VAE qk: fused 4u + cos/sin; eager per tensor: float 3u, rms_norm fp32 4u, to fp16 3u, RoPE 9.5u = 19.5u.
- scaled_residual (per element): fused reads h fp32 and y fp16, writes fp32 (10 B); eager y*scale 6 B and
  h + p 12 B (18 B).
"""

from __future__ import annotations

import math

import torch

from benchmarks.cases import Case, bits_equal
from h3plan.actions.bench.ops import fp8, vae
from h3plan.actions.bench.ops import qk_fp8_lean as lean
from h3plan.actions.bench.ops import qk_norm_rope as qk
from h3plan.actions.bench.ops import ulysses_merge as um

scale_from_amax = fp8.scale_from_amax

H, D, R = 56, 128, 96
VAE_H, VAE_D, VAE_R, VAE_DIM = 32, 64, 48, 2048


def _rope(S: int, device):
    """cos/sin (S, 96) fp32 from MiniMaxH3RotaryPosEmbed's formula over a (t, h, w) video grid."""
    W = 60
    s = torch.arange(S)
    pos = torch.stack([s // (W * 34), (s // W) % 34, s % W], -1).float()
    inv = 1.0 / (10000.0 ** (torch.arange(0, 32, 2).float() / 32))
    f = (pos[:, :, None] * inv).flatten(1)
    f = torch.cat([f, f], -1).to(device)
    return f.cos(), f.sin()


def _qk_inputs(S: int, with_v: bool):
    def make(device):
        g = torch.Generator().manual_seed(S)
        q, k, v = ((torch.randn(1, S, H * D, generator=g) * 2).to(torch.bfloat16).to(device) for _ in range(3))
        wq, wk = ((1 + 0.2 * torch.randn(D, generator=g)).to(torch.bfloat16).to(device) for _ in range(2))
        cos, sin = _rope(S, device)
        return dict(q=q, k=k, v=v if with_v else None, wq=wq, wk=wk, cos=cos, sin=sin)
    return make


def _qk_case(S: int, U: int = 1, with_v: bool = False, sweep: bool = False):
    u = S * H * D * 2
    cs = 2 * S * R * 4
    n = 3 if with_v else 2
    eager_bytes = 2 * 11.5 * u + 4 * S * R * (4 + 2) + 4 * S * R * 2
    if U > 1:
        eager_bytes += 2 * (2 * n * u)

    def fused(i, **launch):
        if launch:
            return qk._run(i["q"], i["k"], i["wq"], i["wk"], i["cos"], i["sin"], 1e-5, i["v"], U, **launch)
        out = qk.qk_norm_rope(i["q"], i["k"], i["wq"], i["wk"], i["cos"], i["sin"], 1e-5, v=i["v"], ulysses_degree=U)
        return list(out) if U == 1 else [out]

    def eager(i):
        out = qk.qk_norm_rope_ref(i["q"], i["k"], i["wq"], i["wk"], i["cos"], i["sin"], 1e-5, v=i["v"],
                                  ulysses_degree=U)
        return list(out) if U == 1 else [out]

    variants = {}
    if sweep:
        variants = {f"bt={c['block_t']},bh={c['block_h']},w={c['num_warps']}": (lambda i, c=c: fused(i, **c))
                    for c in qk.SWEEP_CONFIGS}
        variants["reduction=triton (not exact)"] = lambda i: fused(i,
                                                                   numerics={"rsqrt": "approx", "reduction": "triton"})
    label = "qk_norm_rope" + (f"[U={U},+v]" if U > 1 else "")
    return Case(kernel=label, shape=f"1x{S}x{H}x{D}", dtype="bf16", make=_qk_inputs(S, with_v), fused=fused,
                eager=eager, bytes=2 * n * u + cs, eager_bytes=int(eager_bytes), exact=bits_equal,
                note="packed destination-major (U,3,B,S,H/U,D)" if U > 1 else "", variants=variants)


def _fp8_case(S: int, static: bool, sweep: bool = False):
    u = S * H * D * 2
    cs = 2 * S * R * 4
    valid = S - min(37, S // 2) if not static else None  # Ulysses padding rows at the tail
    scales = [60.0, 40.0, 50.0] if static else None

    def fused(i, **launch):
        if launch:
            a = lean._amax(i["q"], i["k"], i["v"], i["wq"], i["wk"], i["cos"], i["sin"], 1e-5, valid, launch=launch)
            return lean._cast(i["q"], i["k"], i["v"], i["wq"], i["wk"], i["cos"], i["sin"], 1e-5, scale_from_amax(a),
                              None, 1, launch=launch)
        return list(lean.qk_norm_rope_fp8_lean(i["q"], i["k"], i["v"], i["wq"], i["wk"], i["cos"], i["sin"], 1e-5,
                                               scales=scales, valid_len=valid))

    def eager(i):
        return list(qk.qk_norm_rope_fp8_ref(i["q"], i["k"], i["v"], i["wq"], i["wk"], i["cos"], i["sin"], 1e-5,
                                            scales=scales, valid_len=valid))

    variants = {}
    if sweep and not static:
        variants = {f"bt={c['block_t']},bh={c['block_h']},w={c['num_warps']}": (lambda i, c=c: fused(i, **c))
                    for c in lean.SWEEP_CONFIGS}
    passes = 1 if static else 2
    return Case(kernel=f"qk_norm_rope_fp8_lean[{'static' if static else 'dynamic'}]", shape=f"1x{S}x{H}x{D}",
                dtype="bf16->e4m3", make=_qk_inputs(S, True), fused=fused, eager=eager,
                bytes=passes * (3 * u + cs) + 3 * u // 2,
                eager_bytes=int(2 * 11.5 * u + 4 * S * R * 8 + 3 * 22.5 * u),
                exact=bits_equal, note="lossy vs bf16 by design; codes exact vs ref" + ("" if static else
                                                                                     "; 2 passes (dynamic amax)"),
                variants=variants)


def _merge_case(U: int, S_loc: int, valid: int):
    Hl = H // U
    u = S_loc * H * D * 2

    def make(device):
        g = torch.Generator().manual_seed(U)
        return torch.randn(U, 1, S_loc, Hl, D, generator=g).to(torch.bfloat16).to(device)

    return Case(kernel=f"merge_head_chunks[U={U}]", shape=f"{U}x1x{S_loc}x{Hl}x{D}", dtype="bf16", make=make,
                fused=lambda r: um.merge_head_chunks(r, valid), eager=lambda r: um.merge_head_chunks_ref(r, valid),
                bytes=u * valid // S_loc + u, eager_bytes=u * valid // S_loc + u, exact=bits_equal,
                note=f"valid rows {valid} of {S_loc}; eager = copy + zero fill")


def _vae_qk_case(B: int, S: int):
    u = B * S * VAE_H * VAE_D * 2

    def make(device):
        g = torch.Generator().manual_seed(S)
        q, k = ((torch.randn(B, S, VAE_H * VAE_D, generator=g) * 2).half().to(device).unflatten(2, (VAE_H, VAE_D))
                for _ in range(2))
        pos = torch.rand(B, S, 3, generator=g) * 2 - 1
        inv = 1.0 / 100.0 ** torch.arange(0, 1, 6 / VAE_R)
        ang = (2.0 * math.pi * pos[:, :, :, None] * inv).flatten(2, 3).tile(2).unsqueeze(2).to(device)
        return q, k, ang.cos(), ang.sin()

    cs = 2 * B * S * VAE_R * 4
    return Case(kernel="vae_qk_norm_rope", shape=f"{B}x{S}x{VAE_H}x{VAE_D}", dtype="fp16", make=make,
                fused=lambda i: list(vae.vae_qk_norm_rope(*i, 1e-5)),
                eager=lambda i: list(vae.vae_qk_norm_rope_ref(*i, 1e-5)),
                bytes=4 * u + cs, eager_bytes=int(2 * 19.5 * u + 4 * B * S * VAE_R * 8), exact=bits_equal)


def _scaled_residual_case(B: int, S: int, hdtype=torch.float32):
    n = B * S * VAE_DIM
    hb = 4 if hdtype == torch.float32 else 2

    def make(device):
        g = torch.Generator().manual_seed(S + 1)
        h = torch.randn(B, S, VAE_DIM, generator=g).to(hdtype).to(device)
        y = torch.randn(B, S, VAE_DIM, generator=g).half().to(device)
        return h, y, (torch.randn(VAE_DIM, generator=g) * 0.1).to(device)

    return Case(kernel="scaled_residual" + ("" if hdtype == torch.float32 else "[h fp16]"),
                shape=f"{B}x{S}x{VAE_DIM}", dtype="fp32+fp16", make=make,
                fused=lambda i: vae.scaled_residual(*i), eager=lambda i: vae.scaled_residual_ref(*i),
                bytes=n * (hb + 2 + 4), eager_bytes=n * (2 + 4 + hb + 4 + 4), exact=bits_equal)


def cases(sweep: bool = False):
    out = [_qk_case(19000, sweep=sweep), _qk_case(37820, sweep=sweep),
           _qk_case(9455, U=4, with_v=True), _qk_case(4728, U=8, with_v=True),
           _fp8_case(19000, static=False, sweep=sweep), _fp8_case(19000, static=True),
           _merge_case(4, 9455, 9455), _merge_case(8, 4728, 4724),
           _vae_qk_case(2, 1797), _vae_qk_case(1, 7 * 48 * 84 + 5),
           _scaled_residual_case(2, 1797), _scaled_residual_case(2, 1797, torch.float16)]
    return out


def sweep_cases():
    return cases(sweep=True)


CASES = cases()
SMOKE_CASES = [_qk_case(3), _qk_case(2, U=4, with_v=True), _fp8_case(3, static=False), _fp8_case(3, static=True),
               _merge_case(4, 3, 2), _vae_qk_case(1, 3), _scaled_residual_case(1, 3)]
