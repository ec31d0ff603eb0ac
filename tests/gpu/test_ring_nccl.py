"""Ring attention and ring x Ulysses over NCCL on >= 2 GPUs, against single-GPU attention.

    torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_ring_nccl.py -q -p no:cacheprovider
    torchrun --standalone --nproc-per-node=4 -m pytest tests/gpu/test_ring_nccl.py -q -p no:cacheprovider

or plainly (`python -m pytest tests/gpu/test_ring_nccl.py -q`: one spawned process per GPU, at most 8).
`check_lse_backends` also runs on one GPU.

Numeric contracts (ring_plan.NUMERICS):
- fp32 inputs, the fp32 reference block function (TF32 off): relative error <= 1e-6 against the same
  function over the whole sequence on one GPU.
- bf16 at H3 width (56 x 128, S = 19,001 rows: the length does not divide), the fastest LSE backend
  (FA4, else SDPA flash): the ring's relative error against an fp32 reference stays within the
  one-GPU kernel's own error + 2^-8 (one more bf16 rounding of each block output, unit roundoff 2^-8).
- LSE backends: lse within 1e-3 (absolute, natural log) of fp64 logsumexp and output within 1e-2
  relative of fp64 attention (bf16 inputs, P rounded to bf16 inside the kernels).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from nccl_launch import N_GPU, NEEDS_2_GPUS, run_check, torchrun_world

from h3plan.runtime.parallel import shard_rows
from h3plan.facts.sizes import valid_rows
from h3plan.runtime.parallel.lse import LSE_BACKENDS, attention_with_lse, lse_reason, pick_lse_backend
from h3plan.runtime.parallel.ring import RingAttention, RingUlysses, ring_ulysses_groups
from h3plan.facts.ring_plan import ring_ulysses_cost

pytestmark = [pytest.mark.gpu]
HEADS, D = 56, 128


def full_qkv(B, S, H, Dh, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, S, H, Dh, generator=g, device="cuda").to(dtype) for _ in range(3)]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def ref32(q, k, v):
    """fp32 attention of the rows of q over all of k, v (TF32 off), cast nowhere."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return attention_with_lse(q, k, v, max_score_bytes=2 << 30)[0]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def mesh_for(W):
    """(ring, ulysses) pairs to test on W ranks: pure ring, and ring 2 x Ulysses W/2 where heads allow."""
    out = [(W, 1)]
    if W > 2 and W % 2 == 0 and HEADS % (W // 2) == 0:
        out.append((2, W // 2))
    return out


# ---- checks (run on every rank) ------------------------------------------------------------------------

def check_lse_backends():
    q, k, v = full_qkv(1, 1000, 4, D, seed=1)
    k, v = k[:, :777], v[:, :777]
    qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
    s = qd @ kd.transpose(-1, -2) * D ** -0.5
    lse64, o64 = torch.logsumexp(s, -1), (torch.softmax(s, -1) @ vd).transpose(1, 2)
    ran = []
    for name in LSE_BACKENDS:
        if lse_reason(name, q) is not None:
            continue
        o, lse = LSE_BACKENDS[name](q, k, v)
        assert lse.shape == (1, 4, 1000) and lse.dtype == torch.float32, (name, lse.shape, lse.dtype)
        err = (lse.double() - lse64).abs().max().item()
        assert err <= 1e-3, f"{name}: lse off by {err:.2e}"
        assert rel(o, o64) <= 1e-2, f"{name}: out rel {rel(o, o64):.2e}"
        ran.append(name)
    assert "sdpa_flash" in ran and "reference" in ran, ran
    print(f"LSE backends checked: {ran}; picked: {pick_lse_backend(q)[0]}")


def check_ring_fp32_exact_bound():
    W, r = dist.get_world_size(), dist.get_rank()
    B, S, H, Dh = 2, 64 * W - 3, 4, 64
    q, k, v = full_qkv(B, S, H, Dh, torch.float32, seed=2)
    for R, U in mesh_for(W):
        if H % U:
            continue
        ring_g, uly_g = ring_ulysses_groups(R, U)
        ru = RingUlysses(ring_g, uly_g, attn=lambda a, b, c: attention_with_lse(a, b, c))
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            got = ru(*(shard_rows(t, None) for t in (q, k, v)), seq_len=S)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        want = shard_rows(ref32(q, k, v).reshape(B, S, H * Dh), None)
        vr = valid_rows(S, W, r)
        if vr:
            assert rel(got[:, :vr], want[:, :vr]) <= 1e-6, f"{R}x{U}: {rel(got[:, :vr], want[:, :vr]):.2e}"
        assert torch.count_nonzero(got[:, vr:]) == 0


def check_ring_h3_width():
    W, r = dist.get_world_size(), dist.get_rank()
    B, S = 1, 19_001
    q, k, v = full_qkv(B, S, HEADS, D, seed=3)
    name, _ = pick_lse_backend(q, prefer=("fa4", "sdpa_flash"))
    attn = LSE_BACKENDS[name]
    for R, U in mesh_for(W):
        ring_g, uly_g = ring_ulysses_groups(R, U)
        ru = RingUlysses(ring_g, uly_g, attn=attn)
        got = ru(*(shard_rows(t, None) for t in (q, k, v)), seq_len=S)
        vr = valid_rows(S, W, r)
        S_loc = got.shape[1]
        rows = slice(r * S_loc, r * S_loc + vr)
        one = attn(q, k, v)[0][:, rows].reshape(B, vr, HEADS * D)
        ref = ref32(q[:, rows], k, v).reshape(B, vr, HEADS * D)
        e_one, e_ring = rel(one, ref), rel(got[:, :vr], ref)
        print(f"rank {r} {name} ring {R} x ulysses {U}: ring vs fp32 {e_ring:.2e}, one GPU vs fp32 {e_one:.2e}, "
              f"ring vs one GPU {rel(got[:, :vr], one):.2e}")
        assert e_ring <= e_one + 2.0 ** -8, (e_ring, e_one)
        assert torch.count_nonzero(got[:, vr:]) == 0
        cost = ring_ulysses_cost(S, ring=R, ulysses=U)
        assert ru.last_bytes["ring"] == cost.ring_bytes, (ru.last_bytes, cost.ring_bytes)
        assert ru.last_bytes["pre"] + ru.last_bytes["post"] == cost.a2a_bytes, (ru.last_bytes, cost.a2a_bytes)


def check_overlap_order():
    W = dist.get_world_size()
    ring = RingAttention(None)
    ring.trace = []
    q = torch.randn(1, 256, 2, 64, device="cuda", dtype=torch.bfloat16)
    ring(q, q, q, seq_len=256 * W)
    want = [x for t in range(W - 1) for x in (f"send{t}", f"attn{t}", f"wait{t}")] + [f"attn{W - 1}"]
    assert ring.trace == want, ring.trace


CHECKS = {f.__name__: f for f in (check_ring_fp32_exact_bound, check_ring_h3_width, check_overlap_order)}


# ---- launch ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def torchrun_group():
    yield torchrun_world()


@pytest.mark.skipif(N_GPU < 1, reason="needs a CUDA GPU")
def test_lse_backends():
    check_lse_backends()


@NEEDS_2_GPUS
@pytest.mark.parametrize("name", list(CHECKS))
def test_ring_nccl(name, torchrun_group):
    run_check(CHECKS, name, min(N_GPU, 8))
