"""Ulysses attention over NCCL on >= 2 GPUs: bitwise equality with single-GPU attention (padding modes,
chunked async overlap, FP8 codes, prefix in place, the real qk_norm_rope pack), byte counts, merge
engagement.

Run on a host with >= 2 GPUs, either launched by torchrun (one pytest process per GPU):

    torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_ulysses_nccl.py -q -p no:cacheprovider
    torchrun --standalone --nproc-per-node=8 -m pytest tests/gpu/test_ulysses_nccl.py -q -p no:cacheprovider

or plainly (`python -m pytest tests/gpu/test_ulysses_nccl.py -q`), which spawns one process per GPU
(at most 8) on tcp://127.0.0.1 for every check.

Numeric contract: rtol=0, atol=0. The attention functions are per-row and per-head independent:
fp64 softmax(QK^T)V cast once (small shapes), and SDPA's flash kernel at S=19,001 rows, where every
call (56 heads down to 3 per chunk) has enough row blocks that FlashAttention's split-KV heuristic
stays at one split, so a row's key loop is the same in every call.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from nccl_launch import N_GPU, NEEDS_2_GPUS, run_check, torchrun_world

from h3plan.runtime.parallel import UlyssesAttention, amax_allreduce_hook, shard_rows
from h3plan.facts.sizes import a2a_bytes, padded_len, shard_len, valid_rows

pytestmark = [pytest.mark.gpu, NEEDS_2_GPUS]
E4M3 = torch.float8_e4m3fn


# ---- helpers -------------------------------------------------------------------------------------------

def bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_bits(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    n = int((bits(got) != bits(want)).sum())
    assert n == 0, f"rank {dist.get_rank()} {what}: {n} of {got.numel()} elements differ"


def attn64(q, k, v):
    qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
    p = torch.softmax(qd @ kd.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
    return (p @ vd).transpose(1, 2).to(q.dtype)


def flash(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


def full_qkv(B, S, H, D, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, S, H, D, generator=g, device="cuda").to(dtype) for _ in range(3)]


def reference(q, k, v, fn):
    B, S, H, D = q.shape
    return fn(q, k, v).reshape(B, S, H * D)


def heads_for(U):
    return 56 if 56 % U == 0 else 8 * U


# ---- checks (run on every rank) ------------------------------------------------------------------------

def check_exact_small():
    U = dist.get_world_size()
    for B, S in ((2, 4 * U - 1), (1, 4 * U), (1, 256 * U + 1)):
        H, D = 4 * U, 64
        q, k, v = full_qkv(B, S, H, D, seed=S)
        want = shard_rows(reference(q, k, v, attn64), None)
        loc = [shard_rows(t, None) for t in (q, k, v)]
        for padding in ("padded", "fixed_valid", "valid_only"):
            for chunks in (1, 2):
                ua = UlyssesAttention(None, chunks=chunks, padding=padding)
                assert_bits(ua(*loc, attn64, seq_len=S), want, f"fp64 B={B} S={S} {padding} c{chunks}")


def check_flash_h3_shape():
    U = dist.get_world_size()
    B, S, H, D = 1, 19_001, heads_for(U), 128
    q, k, v = full_qkv(B, S, H, D, seed=1)
    want = shard_rows(reference(q, k, v, flash), None)
    loc = [shard_rows(t, None) for t in (q, k, v)]
    for padding in ("padded", "fixed_valid", "valid_only"):
        for chunks in (1, 2):
            ua = UlyssesAttention(None, chunks=chunks, padding=padding)
            assert_bits(ua(*loc, flash, seq_len=S), want, f"flash {padding} c{chunks}")
    for padding in ("padded", "fixed_valid"):  # SDPA has no out=: the copy fallback into the buffer
        ua = UlyssesAttention(None, chunks=2, padding=padding, prefix_inplace=True)
        assert_bits(ua(*loc, flash, seq_len=S), want, f"flash prefix_inplace {padding}")
        assert ua.stats["prefix_out_kw"] == 0


def check_prefix_out_kw():
    U = dist.get_world_size()
    B, S, H, D = 1, 4 * U - 1, 4 * U, 64
    q, k, v = full_qkv(B, S, H, D, seed=2)
    want = shard_rows(reference(q, k, v, attn64), None)
    loc = [shard_rows(t, None) for t in (q, k, v)]
    ptrs = []

    def attn_out(q, k, v, out=None):
        ptrs.append(out.data_ptr())
        out.copy_(attn64(q, k, v))
        return out

    ua = UlyssesAttention(None, chunks=1, padding="fixed_valid", prefix_inplace=True)
    assert_bits(ua(*loc, attn_out, seq_len=S), want, "prefix out=")
    assert ua.stats["prefix_out_kw"] == 1 and len(ptrs) == 1


def check_fp8_codes():
    U, r = dist.get_world_size(), dist.get_rank()
    B, S, H, D = 1, 19_001, heads_for(U), 128
    full = full_qkv(B, S, H, D, seed=3)
    loc = [shard_rows(t, None) for t in full]
    vr = valid_rows(S, U, r)
    amax = torch.stack([t[:, :vr].float().abs().amax() if vr else torch.zeros((), device="cuda") for t in loc])
    amax_allreduce_hook(None)(amax)
    assert torch.equal(amax, torch.stack([t.float().abs().amax() for t in full])), "hook amax != global amax"
    scale = 448.0 / amax

    def cast(t, i):
        return (t.float() * scale[i]).clamp(-448, 448).to(E4M3)

    def attn8(q8, k8, v8):
        return flash(*((t.float() / scale[i]).to(torch.bfloat16) for i, t in enumerate((q8, k8, v8))))

    want = shard_rows(reference(*(cast(t, i) for i, t in enumerate(full)), attn8), None)
    codes = [cast(t, i) for i, t in enumerate(loc)]
    S_loc = shard_len(S, U)
    for padding in ("padded", "valid_only"):
        for chunks in (1, 2):
            ua = UlyssesAttention(None, chunks=chunks, padding=padding, fp8_codes=True)
            assert_bits(ua(*codes, attn8, seq_len=S), want, f"fp8 codes {padding} c{chunks}")
            assert ua.last_bytes["pre"] == 3 * a2a_bytes(B, S_loc, H, D, 1, U), ua.last_bytes


def check_packed_kernel():
    from h3plan.runtime.kernels import qk_fp8_lean as lean
    from h3plan.runtime.kernels import qk_norm_rope as m

    U, r = dist.get_world_size(), dist.get_rank()
    B, S, H, D, R = 1, 19_001, heads_for(U), 128, 96
    g = torch.Generator(device="cuda").manual_seed(4)
    q, k, v = (torch.randn(B, S, H * D, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
    wq, wk = ((1 + 0.1 * torch.randn(D, generator=g, device="cuda")).to(torch.bfloat16) for _ in range(2))
    pos = torch.arange(padded_len(S, U), device="cuda", dtype=torch.float32)[:, None]
    ang = pos * torch.logspace(0, -3, R // 2, device="cuda")
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    S_loc = shard_len(S, U)
    rows = slice(r * S_loc, (r + 1) * S_loc)
    ql, kl, vl = (shard_rows(t, None) for t in (q, k, v))
    cl, sl = cos[rows].contiguous(), sin[rows].contiguous()
    reason = m.qk_norm_rope_check(ql, kl, wq, wk, cl, sl, 1e-6, v=vl, ulysses_degree=U)
    assert reason is None, reason
    qn, kn, vn = m.qk_norm_rope(ql, kl, wq, wk, cl, sl, 1e-6, v=vl)
    packed = m.qk_norm_rope(ql, kl, wq, wk, cl, sl, 1e-6, v=vl, ulysses_degree=U)
    for chunks in (1, 2):
        ua = UlyssesAttention(None, chunks=chunks, padding="fixed_valid")
        assert_bits(ua(None, None, None, flash, seq_len=S, packed=packed), ua(qn, kn, vn, flash, seq_len=S),
                    f"kernel pack c{chunks}")
    vr = valid_rows(S, U, r)
    hook = amax_allreduce_hook(None)
    p8, d8 = lean.qk_norm_rope_fp8_lean(ql, kl, vl, wq, wk, cl, sl, 1e-6, valid_len=vr, amax_hook=hook,
                                        ulysses_degree=U)
    q8, k8, v8, d1 = lean.qk_norm_rope_fp8_lean(ql, kl, vl, wq, wk, cl, sl, 1e-6, valid_len=vr, amax_hook=hook)
    everyone = [torch.empty_like(d8) for _ in range(U)]
    dist.all_gather(everyone, d8)
    assert all(torch.equal(e, d8) for e in everyone) and torch.equal(d1, d8), "descales differ over ranks"

    def attn8(a, b, c):
        return flash(*((t.float() * d8[i]).to(torch.bfloat16) for i, t in enumerate((a, b, c))))

    ua = UlyssesAttention(None, chunks=2, padding="valid_only", fp8_codes=True)
    assert_bits(ua(None, None, None, attn8, seq_len=S, packed=p8), ua(q8, k8, v8, attn8, seq_len=S), "kernel fp8 pack")


def check_overlap_and_merge():
    U = dist.get_world_size()
    B, S, H, D = 1, 19_001, heads_for(U), 128
    loc = [shard_rows(t, None) for t in full_qkv(B, S, H, D, seed=5)]
    ua = UlyssesAttention(None, chunks=2, padding="valid_only")
    ua.trace = []
    ua(*loc, flash, seq_len=S)
    assert ua.trace == ["pre0", "pre1", "attn0", "post0", "attn1", "post1"], ua.trace
    assert ua.stats["a2a_async"] == 4, dict(ua.stats)
    try:
        import h3plan.runtime.kernels.ulysses_merge  # noqa: F401
    except ImportError:
        return
    ua = UlyssesAttention(None, chunks=1, padding="padded")  # recv (U, B, S_loc, H/U, D): the merge contract
    ua(*loc, flash, seq_len=S)
    assert ua.stats["merge_kernel"] == 1, f"fused merge did not run on CUDA bf16: {dict(ua.stats)}"


CHECKS = {f.__name__: f for f in (check_exact_small, check_flash_h3_shape, check_prefix_out_kw, check_fp8_codes,
                                  check_packed_kernel, check_overlap_and_merge)}


# ---- launch ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def torchrun_group():
    yield torchrun_world()


@pytest.mark.parametrize("name", list(CHECKS))
def test_ulysses_nccl(name, torchrun_group):
    run_check(CHECKS, name, min(N_GPU, 8))
