"""Block elementwise/row-wise kernels at MiniMax-H3 shapes: RMSNorm + AdaLN modulation, gated residual,
SwiGLU. Byte counts are in units of one (rows x D) bf16 tensor, `u`:
- modulation: fused reads x, writes out (2u, plus the weight and the table rows it uses); eager writes
  and rereads norm, both gathered rows, 1 + scale and the product: rms_norm 2u, two index_selects 2u
  each, 1 + scale 2u, mul 3u, add 3u = 14u.
- gated residual: fused 3u (h, y, out); eager index_select 2u, mul 3u, add 3u = 8u.
- swiglu (u = rows x F): fused reads 2u, writes 1u; eager silu 2u, mul 3u = 5u.
The tables' rows are counted once per distinct index (they stay in L2).
"""

from __future__ import annotations

import torch

from benchmarks.cases import Case, bits_equal
from h3plan.actions.bench.ops import gated_residual as gr
from h3plan.actions.bench.ops import modulation as mod
from h3plan.actions.bench.ops import swiglu as sw

HIDDEN, FFN, TIMESTEPS, MODALITIES = 5376, 14336, 2, 3


def _index(S: int, device) -> torch.Tensor:
    """Packed-sequence rows: text, audio, then video; two timesteps; row = t * 3 + modality."""
    idx = torch.empty(S, dtype=torch.int64)
    t_end, a_end = S // 20, S // 10
    idx[:t_end] = 1  # text of timestep 0
    idx[t_end:a_end] = 2  # audio
    idx[a_end:(a_end + S) // 2] = 0  # video, timestep 0
    idx[(a_end + S) // 2:] = 3  # video, timestep 1
    return idx.to(device)


def _tables(D: int, device, seed: int):
    """The block's six (R, D) chunk views of one (R, 6D) AdaLN projection (row stride 6D)."""
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(TIMESTEPS * MODALITIES, 6 * D, generator=g) * 0.5).to(torch.bfloat16).to(device)
    return t.chunk(6, dim=-1)


def _modulation_cases(B: int, S: int, D: int, modes, sweep: bool):
    u = B * S * D * 2
    table_rows = 4 * 2 * D * 2  # four distinct indices, scale and shift rows

    def make(device):
        g = torch.Generator().manual_seed(S)
        x = (torch.randn(B, S, D, generator=g) * 2).to(torch.bfloat16).to(device)
        w = (1 + 0.1 * torch.randn(D, generator=g)).to(torch.bfloat16).to(device)
        shift, scale = _tables(D, device, S)[:2]
        return x, w, scale, shift, _index(S, device)

    cases = []
    for mode in modes:
        def fused(i, mode=mode):
            return mod.rmsnorm_modulate(*i, 1e-5, mode)

        variants = {}
        if sweep:
            variants = {f"cfg={c}": (lambda i, c=c, mode=mode: mod._launch(*i, 1e-5, mode, config=c))
                        for c in mod.SWEEP_CONFIGS}
            if mode == "exact":
                variants["rsqrt=ieee"] = lambda i: mod._launch(*i, 1e-5, "exact", rsqrt="ieee")
        cases.append(Case(
            kernel=f"rmsnorm_modulate[{mode}]", shape=f"{B}x{S}x{D}", dtype="bf16", make=make, fused=fused,
            eager=lambda i: mod.rmsnorm_modulate_ref(*i, 1e-5, "exact"),
            bytes=2 * u + D * 2 + table_rows + S * 8, eager_bytes=14 * u + D * 2 + table_rows + 2 * S * 8,
            exact=bits_equal, note="" if mode == "exact" else "lossy by design (one rounding)",
            variants=variants))
    return cases


def _gated_case(B: int, S: int, D: int, sweep: bool):
    u = B * S * D * 2

    def make(device):
        g = torch.Generator().manual_seed(S + 1)
        h = (torch.randn(B, S, D, generator=g) * 4).to(torch.bfloat16).to(device)
        y = torch.randn(B, S, D, generator=g).to(torch.bfloat16).to(device)
        return h, _tables(D, device, S + 1)[2], _index(S, device), y

    variants = {f"cfg={c}": (lambda i, c=c: gr._launch(*i, config=c)) for c in gr.SWEEP_CONFIGS} if sweep else {}
    return Case(kernel="gated_residual", shape=f"{B}x{S}x{D}", dtype="bf16", make=make,
                fused=lambda i: gr.gated_residual(*i), eager=lambda i: gr.gated_residual_ref(*i),
                bytes=3 * u + 4 * D * 2 + S * 8, eager_bytes=8 * u + 4 * D * 2 + S * 8, exact=bits_equal,
                variants=variants)


def _swiglu_case(M: int, F: int, sweep: bool, dtype=torch.bfloat16):
    u = M * F * 2

    def make(device):
        g = torch.Generator().manual_seed(M)
        return (torch.randn(1, M, 2 * F, generator=g) * 2).to(dtype).to(device)

    variants = {}
    if sweep:
        variants = {f"cfg={c}": (lambda x, c=c: sw._launch(x, config=c)) for c in sw.SWEEP_CONFIGS}
        variants["exp=tl"] = lambda x: sw._launch(x, exp="tl")
    return Case(kernel="swiglu", shape=f"1x{M}x{2 * F}", dtype={torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype],
                make=make, fused=sw.swiglu, eager=sw.swiglu_ref, bytes=3 * u, eager_bytes=5 * u,
                exact=bits_equal, variants=variants)


def cases(sweep: bool = False):
    out = []
    for S in (19000, 104072):
        out += _modulation_cases(1, S, HIDDEN, ("exact", "fp32") if S == 19000 else ("exact",), sweep)
        out.append(_gated_case(1, S, HIDDEN, sweep))
    out.append(_swiglu_case(19000, FFN, sweep))
    return out


def sweep_cases():
    """The same cases, each with its tuning variants (fused_kernels.py --sweep)."""
    return cases(sweep=True)


CASES = cases()
SMOKE_CASES = (_modulation_cases(2, 5, 96, ("exact", "fp32"), False) + [_gated_case(2, 5, 96, False)]
               + [_swiglu_case(6, 64, False)])
