"""H200 suite for the block kernels: rmsnorm_modulate, gated_residual, swiglu.

Bit-exactness (rtol=0, atol=0, bits compared as int16) against the pieces of a real diffusers
MiniMaxH3TransformerBlock at H3 width (hidden 5376, ffn 14336) on S=19,000 rows; every bf16/fp16 gate
value for silu; one input over 2^31 elements per kernel (int64 offsets); which exact-mode formulation
matches torch (rsqrt, exp variants: reported, the shipped default asserted); the fp32 mode's error.
Each test prints one summary line.

    python -m pytest tests/gpu/test_kernels_block_gpu.py -m gpu -q -s
"""

import pytest
import torch

from h3plan.runtime.kernels import gated_residual as gr
from h3plan.runtime.kernels import modulation as mm
from h3plan.runtime.kernels import swiglu as sw

pytestmark = pytest.mark.gpu

HIDDEN, HEADS, HEAD_DIM, FFN, TEMB, EPS = 5376, 56, 128, 14336, 2688, 1e-5
S, TIMESTEPS = 19000, 2
BIG_ROWS = 400_000  # 400,000 x 5376 = 2.15e9 elements > 2^31


def mismatches(a, b):
    return int((a.contiguous().view(torch.int16) != b.contiguous().view(torch.int16)).sum().item())


def index_for(S, device="cuda"):
    """Packed rows: text, audio, video runs over two timesteps (row = t * 3 + modality), plus a random tail."""
    idx = torch.empty(S, dtype=torch.int64)
    idx[: S // 20], idx[S // 20 : S // 10] = 1, 2
    idx[S // 10 : S // 2], idx[S // 2 :] = 0, 3
    g = torch.Generator().manual_seed(S)
    tail = S - S // 8
    idx[tail:] = torch.randint(0, 3 * TIMESTEPS, (S - tail,), generator=g)
    return idx.to(device)


def activations(shape, seed, kmax=7):
    """Residual-stream-like bf16 rows: unit normal, each row scaled by 2^k, k in [-4, kmax]."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", generator=g)
    k = torch.randint(-4, kmax + 1, shape[:-1] + (1,), device="cuda", generator=g).float()
    return (x * torch.exp2(k)).to(torch.bfloat16)


@pytest.fixture(scope="module")
def block():
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3TransformerBlock

    torch.manual_seed(0)
    with torch.device("cuda"):
        b = MiniMaxH3TransformerBlock(hidden_size=HIDDEN, num_attention_heads=HEADS, attention_head_dim=HEAD_DIM,
                                      ffn_dim=FFN, time_embed_dim=TEMB, norm_eps=EPS, qk_norm_eps=EPS)
    b = b.to(torch.bfloat16).eval()
    with torch.no_grad():  # nn.RMSNorm starts at ones, which would hide where the weight product rounds
        for norm in (b.norm1, b.norm2):
            norm.weight.copy_(1 + 0.1 * torch.randn(HIDDEN, device="cuda"))
    temb = torch.randn(TIMESTEPS, TEMB, device="cuda")  # time_embedder output is fp32
    with torch.no_grad():
        tables = b.adaln_proj(temb)  # shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp
    assert tables[0].shape == (3 * TIMESTEPS, HIDDEN) and tables[0].stride(0) == 6 * HIDDEN
    return b, tables


@torch.no_grad()
def test_modulation_exact_vs_block(block):
    b, (shift_msa, scale_msa, _, shift_mlp, scale_mlp, _) = block
    x, idx = activations((1, S, HIDDEN), 1), index_for(S)
    for name, norm, shift, scale in (("norm1", b.norm1, shift_msa, scale_msa),
                                     ("norm2", b.norm2, shift_mlp, scale_mlp)):
        # the block's own lines (MiniMaxH3TransformerBlock.forward)
        eager = norm(x) * (1.0 + scale.index_select(0, idx)) + shift.index_select(0, idx)
        fused = mm.rmsnorm_modulate(x, norm.weight, scale, shift, idx, norm.eps)
        n = mismatches(fused, eager)
        print(f"modulation exact {name} 1x{S}x{HIDDEN}: {n} of {eager.numel()} elements differ")
        assert n == 0


@torch.no_grad()
def test_modulation_variants_report(block):
    """Which rsqrt matches torch (reported), the shipped default (asserted), and every tuning config."""
    b, (shift, scale) = block[0], block[1][:2]
    x, idx = activations((2, S // 2, HIDDEN), 2), index_for(S // 2)
    eager = b.norm1(x) * (1.0 + scale.index_select(0, idx)) + shift.index_select(0, idx)
    res = {r: mismatches(mm._launch(x, b.norm1.weight, scale, shift, idx, EPS, "exact", rsqrt=r), eager)
           for r in ("tl", "ieee")}
    cfgs = {c: mismatches(mm._launch(x, b.norm1.weight, scale, shift, idx, EPS, "exact", config=c), eager)
            for c in mm.SWEEP_CONFIGS}
    no_w = mismatches(mm._launch(x, None, scale, shift, idx, EPS, "exact"),
                      torch.nn.functional.rms_norm(x, (HIDDEN,), None, EPS) * (1.0 + scale.index_select(0, idx))
                      + shift.index_select(0, idx))
    print(f"modulation variants 2x{S // 2}x{HIDDEN} mismatches: rsqrt {res}; configs {cfgs}; no weight {no_w}")
    assert res[mm.RSQRT] == 0 and all(v == 0 for v in cfgs.values()) and no_w == 0


@torch.no_grad()
def test_modulation_fp32_error(block):
    b, (shift, scale) = block[0], block[1][:2]
    x, idx = activations((1, S, HIDDEN), 3), index_for(S)
    w = b.norm1.weight
    exact = mm.rmsnorm_modulate(x, w, scale, shift, idx, EPS)
    fp32 = mm.rmsnorm_modulate(x, w, scale, shift, idx, EPS, mode="fp32")
    # Bound: the exact chain's half-ulp roundings (n, 1 + scale, product, sum) carried to the output,
    # half an ulp of each output, and fp32 slack; |n32| <= |n| (1 + 2^-8).
    zeros = torch.zeros_like(scale)
    n = mm.rmsnorm_modulate(x, w, zeros, zeros, idx, EPS).float()  # == norm1(x)
    sc, sh = scale.index_select(0, idx).float(), shift.index_select(0, idx).float()
    s1b = (1.0 + sc).bfloat16().float()
    m = (n * s1b).bfloat16().float()
    bound = (0.5 * _ulp(n) * s1b.abs() + 0.5 * n.abs() * (1 + 2 ** -8) * _ulp(s1b) + 0.5 * _ulp(m)
             + 0.5 * _ulp(exact) + 0.5 * _ulp(fp32) + 2.0 ** -20 * (n.abs() * (1 + sc).abs() + sh.abs()))
    err = (exact.float() - fp32.float()).abs()
    big = exact.float().abs() > 1e-2
    ulps = err / _ulp(torch.maximum(exact.float().abs(), fp32.float().abs()))
    print(f"modulation fp32 vs exact 1x{S}x{HIDDEN}: max abs {err.max().item():.4g}, max rel (|exact| > 1e-2) "
          f"{(err[big] / exact.float().abs()[big]).max().item():.4g}, differing "
          f"{(err > 0).float().mean().item():.2%}, max {ulps.max().item():.0f} ulps of the exact output, "
          f"mean |err| {err.mean().item():.3g}; bound violated at {(err > bound).sum().item()} elements")
    assert torch.all(err <= bound)


def _ulp(t):
    e = torch.floor(torch.log2(t.float().abs().clamp_min(2.0 ** -126)))
    return torch.exp2(e - 7)


@torch.no_grad()
def test_gated_residual_exact_vs_block(block):
    _, (_, _, gate_msa, _, _, gate_mlp) = block
    h, y, idx = activations((1, S, HIDDEN), 4), activations((1, S, HIDDEN), 5), index_for(S)
    for name, gate in (("gate_msa", gate_msa), ("gate_mlp", gate_mlp)):
        eager = h + gate.index_select(0, idx) * y  # the block's line
        n = mismatches(gr.gated_residual(h, gate, idx, y), eager)
        cfgs = {c: mismatches(gr._launch(h, gate, idx, y, config=c), eager) for c in gr.SWEEP_CONFIGS}
        print(f"gated_residual {name} 1x{S}x{HIDDEN}: {n} differ; configs {cfgs}")
        assert n == 0 and all(v == 0 for v in cfgs.values())


@torch.no_grad()
def test_swiglu_exact_vs_feedforward(block):
    act = block[0].ff.net[0]  # diffusers SwiGLU: proj, chunk, hidden * silu(gate)
    xin = activations((1, S, HIDDEN), 6)
    hidden = act.proj(xin)
    h, g = hidden.chunk(2, dim=-1)
    eager = h * act.activation(g)
    fused = sw.swiglu(hidden)
    n = mismatches(fused, eager)
    module = mismatches(fused, act(xin))  # the module re-runs its GEMM: equal if cuBLAS is deterministic
    cfgs = {c: mismatches(sw._launch(hidden, config=c), eager) for c in sw.SWEEP_CONFIGS}
    print(f"swiglu 1x{S}x{2 * FFN}: {n} differ (whole module call: {module}); configs {cfgs}")
    assert n == 0 and all(v == 0 for v in cfgs.values())


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_swiglu_every_gate_value(dtype):
    gate = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).reshape(64, 1024).cuda()
    res = {}
    for hidden in ("ones", "random"):
        h = torch.ones_like(gate) if hidden == "ones" else torch.randn(64, 1024, device="cuda").to(dtype)
        x = torch.cat([h, gate], dim=-1)
        eager = sw.swiglu_ref(x)
        nan = torch.isnan(eager)
        for exp in ("libdevice", "tl"):
            out = sw._launch(x, exp=exp)
            res[(hidden, exp)] = (mismatches(out[~nan], eager[~nan]), int((torch.isnan(out) != nan).sum()),
                                  mismatches(out[nan], eager[nan]))
    print(f"swiglu every {dtype} gate value, (finite mismatches, NaN-position mismatches, NaN-bit mismatches): {res}")
    assert all(v[0] == 0 and v[1] == 0 for k, v in res.items() if k[1] == sw.EXP)


@torch.no_grad()
def test_special_values():
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-39, -3e-40, 3e38, 1e-20, 2e-38])
    g = torch.Generator().manual_seed(0)

    def sprinkle(t):
        flat = t.view(-1)
        pos = torch.randint(0, flat.numel(), (4000,), generator=g).cuda()
        flat[pos] = specials.repeat(400).to(t.dtype).cuda()
        return t

    h, y = sprinkle(activations((1, 512, 1024), 7)), sprinkle(activations((1, 512, 1024), 8))
    gate = sprinkle((torch.randn(6, 6 * 1024, device="cuda")).bfloat16()).chunk(6, -1)[2]
    idx = torch.randint(0, 6, (512,), device="cuda")
    eg, fg = gr.gated_residual_ref(h, gate, idx, y), gr.gated_residual(h, gate, idx, y)
    x = sprinkle(activations((1, 512, 2048), 9))
    es, fs = sw.swiglu_ref(x), sw.swiglu(x)
    out = {}
    for name, e, f in (("gated_residual", eg, fg), ("swiglu", es, fs)):
        nan = torch.isnan(e)
        out[name] = (mismatches(f[~nan], e[~nan]), int((torch.isnan(f) != nan).sum()), mismatches(f[nan], e[nan]))
    print(f"special values (finite mismatches, NaN-position mismatches, NaN-bit mismatches): {out}")
    assert all(v[0] == 0 and v[1] == 0 for v in out.values())


@torch.no_grad()
def test_int64_offsets_over_2_31(block):
    """Inputs over 2^31 elements: the int32 products would wrap; the whole output is compared."""
    b, (shift, scale, gate) = block[0], block[1][:3]
    idx = index_for(BIG_ROWS)
    x = activations((1, BIG_ROWS, HIDDEN), 10)
    assert x.numel() > 2 ** 31
    n_mod = mismatches(mm.rmsnorm_modulate(x, b.norm1.weight, scale, shift, idx, EPS),
                       b.norm1(x) * (1.0 + scale.index_select(0, idx)) + shift.index_select(0, idx))
    torch.cuda.empty_cache()
    y = activations((1, BIG_ROWS, HIDDEN), 11)
    n_gr = mismatches(gr.gated_residual(x, gate, idx, y), x + gate.index_select(0, idx) * y)
    del x, y
    torch.cuda.empty_cache()
    xs = activations((1, 150_000, 2 * FFN), 12)  # 4.3e9 elements in, 2.15e9 out
    assert xs.numel() // 2 > 2 ** 31
    n_sw = mismatches(sw.swiglu(xs), sw.swiglu_ref(xs))
    del xs
    torch.cuda.empty_cache()
    print(f"int64 offsets: modulation 1x{BIG_ROWS}x{HIDDEN} {n_mod} differ, gated_residual {n_gr} differ, "
          f"swiglu 1x150000x{2 * FFN} {n_sw} differ")
    assert n_mod == 0 and n_gr == 0 and n_sw == 0
