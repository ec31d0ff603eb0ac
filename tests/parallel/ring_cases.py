"""Cases run inside the 4 spawned gloo workers of test_ring.py (one spawn for every case).

Each case builds the full sequence from one seed on every rank and compares this rank's rows with
single-process attention over the unpadded sequence. Contracts (derivations in ring_plan.NUMERICS):
- fp32 inputs, fp32 block outputs (attention_with_lse): relative (Frobenius) error <= 1e-6 against the
  single-process fp32 result and against fp64 attention (measured ~5e-7: fp32 sums in another order).
- bf16 inputs, fp32 block outputs, bf16 result: every element within one bf16 ulp of the
  single-process bf16 result (the fp32 values differ by ~1e-7 relative, far below half an ulp, so
  round-to-nearest moves an element by at most one ulp).
- bf16 block outputs (what FA4/SDPA give): bitwise equal to the same merge done locally in the ring's
  block order (rank i merges blocks i, i-1, ...): the merge is deterministic elementwise math.
Padding rows of RingUlysses are zero. A case returns None (pass), "skip: why", or raises.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from h3plan.errors import UsageError
from h3plan.runtime.parallel import shard_rows
from h3plan.facts.sizes import shard_len, valid_rows
from h3plan.runtime.parallel.lse import LseMerge, attention_with_lse
from h3plan.runtime.parallel.ring import RingAttention, RingUlysses, block_valid, ring_ulysses_groups
from h3plan.facts.ring_plan import ring_ulysses_cost
from h3plan.facts.sizes import a2a_bytes

D = 16
TIMEOUT = timedelta(seconds=20)
CASES: dict = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


# ---- helpers ------------------------------------------------------------------------------------------

def full_qkv(B, S, H, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, S, H, D, generator=g).to(dtype) for _ in range(3)]


def attn64(q, k, v):
    qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
    p = torch.softmax(qd @ kd.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
    return (p @ vd).transpose(1, 2)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def ulp_bf16(x):
    """One bf16 ulp at |x| (2^(e-7) for normal numbers)."""
    e = torch.floor(torch.log2(x.abs().float().clamp_min(2.0 ** -126)))
    return torch.pow(2.0, e - 7)


def within_one_ulp(got, want, what):
    assert got.dtype == want.dtype == torch.bfloat16, (got.dtype, want.dtype)
    diff = (got.float() - want.float()).abs()
    bound = torch.maximum(ulp_bf16(got), ulp_bf16(want))
    bad = (diff > bound).nonzero()
    assert bad.numel() == 0, f"{what}: {bad.shape[0]} elements off by more than one bf16 ulp, first {bad[0].tolist()}"


def sub_group(ranks):
    """A gloo group of `ranks` (every rank calls new_group) and this rank's place in it (None: outside)."""
    g = dist.new_group(ranks, timeout=TIMEOUT)
    me = dist.get_rank()
    return (g, ranks.index(me)) if me in ranks else (None, None)


def ring_rows(x, R, i, L):
    """Rows i*L .. (i+1)*L of x padded at the tail to R*L rows."""
    B, S = x.shape[:2]
    out = torch.zeros((B, L, *x.shape[2:]), dtype=x.dtype)
    n = max(0, min(S - i * L, L))
    if n:
        out[:, :n] = x[:, i * L : i * L + n]
    return out


def check_ring(group, i, R, B, S, H, dtype, attn=attention_with_lse):
    """RingAttention on this rank's block against single-process attention (contracts above)."""
    L = shard_len(S, R)
    q, k, v = full_qkv(B, S, H, dtype, seed=S * 10 + R)
    ring = RingAttention(group, attn)
    got = ring(*(ring_rows(t, R, i, L) for t in (q, k, v)), seq_len=S)
    n = max(0, min(S - i * L, L))
    full, _ = attention_with_lse(q, k, v)
    want = full[:, i * L : i * L + n]
    assert got.shape == (B, L, H, D) and torch.isfinite(got).all(), "padding query rows must stay finite"
    if n == 0:  # this rank holds only padding
        pass
    elif dtype == torch.float32:
        assert rel(got[:, :n], want) <= 1e-6, f"R={R} S={S}: {rel(got[:, :n], want):.2e} vs single process"
        assert rel(got[:, :n], attn64(q, k, v)[:, i * L : i * L + n]) <= 1e-6, "vs fp64"
    else:
        within_one_ulp(got[:, :n], want.to(dtype), f"R={R} S={S} bf16")
    assert ring.last_bytes == (R - 1) * 2 * B * L * H * D * q.element_size(), ring.last_bytes
    return ring


# ---- ring alone ----------------------------------------------------------------------------------------

@case
def ring2_fp32_bf16():
    (ga, ia), (gb, ib) = sub_group([0, 1]), sub_group([2, 3])  # two rings side by side
    g, i = (ga, ia) if ga is not None else (gb, ib)
    for S in (16, 13):  # divides, does not divide
        for dtype in (torch.float32, torch.bfloat16):
            check_ring(g, i, 2, 2, S, 4, dtype)


@case
def ring3_nondividing():
    g, i = sub_group([0, 1, 2])
    if g is None:
        return None  # rank 3 sits this one out
    for S in (10, 7, 4):  # blocks 4,4,2 / 3,3,1 / 2,2,0 (rank 2 holds only padding)
        for dtype in (torch.float32, torch.bfloat16):
            ring = check_ring(g, i, 3, 2, S, 4, dtype)
        if S == 4:
            assert ring.stats["blocks_empty"] == 1 and ring.stats["blocks"] == 2, dict(ring.stats)


@case
def ring4_all_ranks():
    g, i = sub_group([0, 1, 2, 3])
    for S in (16, 5):  # 5: blocks 2, 2, 1, 0
        check_ring(g, i, 4, 1, S, 2, torch.float32)
        check_ring(g, i, 4, 1, S, 2, torch.bfloat16)


@case
def ring_bf16_blocks_bitwise_vs_local_merge():
    """bf16 block outputs (as FA4 gives): the ring equals the local merge in ring order, bit for bit."""
    g, i = sub_group([0, 1, 2])
    if g is None:
        return None
    R, B, S, H = 3, 2, 11, 4
    L = shard_len(S, R)

    def attn_bf16(q, k, v):
        o, lse = attention_with_lse(q, k, v)
        return o.to(torch.bfloat16), lse

    q, k, v = full_qkv(B, S, H, torch.bfloat16, seed=5)
    got = RingAttention(g, attn_bf16)(*(ring_rows(t, R, i, L) for t in (q, k, v)), seq_len=S)
    merge = LseMerge()
    qi = ring_rows(q, R, i, L)
    for t in range(R):
        j = (i - t) % R
        n = block_valid(S, L, R)[j]
        if n:
            merge.add(*attn_bf16(qi, k[:, j * L : j * L + n], v[:, j * L : j * L + n]))
    assert torch.equal(got, merge.result(torch.bfloat16)), "ring != local merge in ring order"


@case
def ring_overlap_order():
    g, i = sub_group([0, 1, 2])
    if g is None:
        return None
    ring = RingAttention(g)
    ring.trace = []
    q = torch.randn(1, 4, 2, D)
    ring(q, q, q, seq_len=12)
    assert ring.trace == ["send0", "attn0", "wait0", "send1", "attn1", "wait1", "attn2"], ring.trace
    assert ring.stats["rotations"] == 2, dict(ring.stats)


# ---- ring x Ulysses ------------------------------------------------------------------------------------

def check_ring_ulysses(R, U, B, S, H, dtype, chunks=1, packed=False):
    ring_g, uly_g = ring_ulysses_groups(R, U, backend="gloo", timeout=TIMEOUT)
    W, g = R * U, dist.get_rank()
    S_loc = shard_len(S, W)
    q, k, v = full_qkv(B, S, H, dtype, seed=S + 100 * R + U)
    full, _ = attention_with_lse(q, k, v)
    want = shard_rows(full.reshape(B, S, H * D), dist.group.WORLD)
    loc = [shard_rows(t, dist.group.WORLD) for t in (q, k, v)]
    ru = RingUlysses(ring_g, uly_g, chunks=chunks)
    assert ru.world_rank == g, (ru.world_rank, g)
    if packed:  # destination-major (U, 3, B, S_loc, H/U, D), as qk_norm_rope(..., ulysses_degree=U) packs
        p = torch.stack([t.unflatten(2, (U, H // U)).permute(2, 0, 1, 3, 4) for t in loc], 1).contiguous()
        got = ru(None, None, None, seq_len=S, packed=p)
    else:
        got = ru(*loc, seq_len=S)
    vr = valid_rows(S, W, g)
    assert torch.count_nonzero(got[:, vr:]) == 0, "padding rows are not zero"
    if vr == 0:
        pass
    elif dtype == torch.float32:
        assert rel(got[:, :vr], want[:, :vr]) <= 1e-6, f"{R}x{U} S={S}: {rel(got[:, :vr], want[:, :vr]):.2e}"
    else:
        within_one_ulp(got[:, :vr], want[:, :vr].to(dtype), f"{R}x{U} S={S} bf16")
    cost = ring_ulysses_cost(S, ring=R, ulysses=U, heads=H, head_dim=D, batch=B, elem_bytes=q.element_size())
    assert ru.last_bytes["ring"] == cost.ring_bytes, (ru.last_bytes, cost.ring_bytes)
    assert ru.last_bytes["pre"] + ru.last_bytes["post"] == cost.a2a_bytes, (ru.last_bytes, cost.a2a_bytes)
    if U > 1:
        assert ru.last_bytes["pre"] == 3 * a2a_bytes(B, S_loc, H, D, q.element_size(), U)
    return ru


@case
def ring2_x_ulysses2():
    for S in (16, 13, 5):  # 5: S_loc 2, ring blocks 4 + 1 valid rows; world rank 3 holds only padding
        for dtype in (torch.float32, torch.bfloat16):
            check_ring_ulysses(2, 2, 2, S, 4, dtype)


@case
def ring2_x_ulysses2_chunks_packed():
    ru = check_ring_ulysses(2, 2, 1, 13, 8, torch.bfloat16, chunks=2)
    assert ru.ring.stats["calls"] == 2, dict(ru.ring.stats)  # one ring pass per head chunk
    check_ring_ulysses(2, 2, 2, 13, 4, torch.float32, packed=True)


@case
def degenerate_meshes():
    check_ring_ulysses(4, 1, 2, 13, 4, torch.float32)
    check_ring_ulysses(4, 1, 1, 13, 4, torch.bfloat16, packed=True)
    check_ring_ulysses(1, 4, 2, 13, 4, torch.bfloat16)


# ---- guards ---------------------------------------------------------------------------------------------

def _raises(fn, text):
    try:
        fn()
    except UsageError as e:
        assert text in str(e), f"error {str(e)!r} lacks {text!r}"
        assert "\n" not in str(e)
        return
    raise AssertionError(f"no UsageError (expected {text!r})")


@case
def errors():
    g, i = sub_group([0, 1, 2, 3])
    ring = RingAttention(g)
    q = torch.randn(1, 4, 2, D)
    _raises(lambda: ring(q, q[:, :3], q, seq_len=16), "shapes differ")
    _raises(lambda: ring(q, q.double(), q, seq_len=16), "dtypes differ")
    _raises(lambda: ring(q, q, q, seq_len=17), "seq_len must be an int in [1, R*L = 16]")
    _raises(lambda: ring(q, q, q, seq_len=0), "seq_len must be")
    _raises(lambda: ring(q.int(), q.int(), q.int(), seq_len=16), "bf16/fp16/fp32")
    _raises(lambda: RingAttention(g, attn="fa4"), "attn must be a callable")
    _raises(lambda: ring_ulysses_groups(3, 2), "ring 3 x ulysses 2 = 6 ranks, but the world has 4")
    rg, ug = ring_ulysses_groups(2, 2, timeout=TIMEOUT)
    ru = RingUlysses(rg, ug)
    _raises(lambda: ru(torch.randn(1, 5, 4, D), q, q, seq_len=13), "rows per rank")
    bad = RingAttention(g, lambda a, b, c: (a, torch.zeros(1)))
    _raises(lambda: bad(q, q, q, seq_len=16), "returned lse")
    dist.barrier(group=g)
    check_ring(g, i, 4, 1, 13, 2, torch.float32)  # the group still works after the refused calls


# ---- worker ---------------------------------------------------------------------------------------------

def worker(rank, world_size, port, outdir):
    if os.environ.get("RING_CASE_TIMES"):
        print(f"rank {rank} TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')}", flush=True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    results = {}
    for name, fn in CASES.items():
        dist.barrier()
        t0 = time.perf_counter()
        try:
            results[name] = fn() or "ok"
        except Exception as e:  # recorded per case; the parent test reports it
            tb = traceback.extract_tb(e.__traceback__)[-1]
            results[name] = f"FAIL {type(e).__name__}: {e} ({os.path.basename(tb.filename)}:{tb.lineno})"
        if os.environ.get("RING_CASE_TIMES"):
            print(f"rank {rank} {name} {time.perf_counter() - t0:.2f}s", flush=True)
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()
