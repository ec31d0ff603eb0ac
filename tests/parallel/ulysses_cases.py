"""Cases run inside the spawned gloo workers of test_ulysses.py (one spawn per world size).

Every case builds the full sequence from one seed on every rank, so the single-process reference
(attention over the unpadded sequence with all heads) is computed locally and compared bit for bit
with this rank's Ulysses rows (padding rows must be zero). A case returns None (pass), "skip: why",
or raises. Numeric contract everywhere: rtol=0, atol=0 (bitwise), because the attention below is
per-row and per-head independent (fp64 softmax(QK^T/sqrt(D))V, then one cast).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from datetime import timedelta
from fractions import Fraction

import torch
import torch.distributed as dist

from h3plan.runtime.parallel import UlyssesAttention, amax_allreduce_hook, gather_rows, shard_rows
from h3plan.facts.sizes import a2a_bytes, padded_len, shard_len, valid_rows
from h3plan.runtime.parallel.comm import device_reason

E4M3 = torch.float8_e4m3fn
CASES: dict[str, tuple[tuple[int, ...], object]] = {}


class G:
    """The group a case runs on: a fresh gloo group per case, so a case that fails between two
    collectives on one rank cannot misalign the next case's collectives (it times out instead)."""

    group = None
D = 8
ALL = (2, 3, 4)
CASE_TIMEOUT_S = 20


def case(name, worlds=ALL):
    def deco(fn):
        CASES[name] = (worlds, fn)
        return fn
    return deco


# ---- helpers ------------------------------------------------------------------------------------------

def bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_bits(got, want, what):
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    diff = (bits(got) != bits(want)).nonzero()
    assert diff.numel() == 0, f"{what}: {diff.shape[0]} elements differ, first at {diff[0].tolist()}"


def attn64(q, k, v):
    """Exact reference attention: fp64 softmax(q k^T / sqrt(D)) v, cast once to q's dtype."""
    qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
    p = torch.softmax(qd @ kd.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
    return (p @ vd).transpose(1, 2).to(q.dtype)


class Recorder:
    """attn64 that records the shapes/contiguity it was called with (and writes `out` if given)."""

    def __init__(self, fn=attn64):
        self.fn, self.calls = fn, []

    def __call__(self, q, k, v):
        self.calls.append((tuple(q.shape), tuple(k.shape), q.is_contiguous() and k.is_contiguous()))
        return self.fn(q, k, v)


class OutAttn:
    """attn64 taking `out=` and writing into it (the prefix-in-place path)."""

    def __init__(self):
        self.outs = []

    def __call__(self, q, k, v, out=None):
        o = attn64(q, k, v)
        if out is None:
            return o
        self.outs.append(out.shape)
        out.copy_(o)
        return out


def full_qkv(B, S, H, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, S, H, D, generator=g).to(dtype) for _ in range(3)]


def reference(q, k, v, fn=attn64):
    B, S, H, _ = q.shape
    return fn(q, k, v).reshape(B, S, H * D)


def world():
    return dist.get_world_size(), dist.get_rank()


def lengths(U):
    """S divisible by U, not divisible, and one where the last rank holds only padding."""
    return {"div": 4 * U, "nondiv": 4 * U - 1, "allpad": {2: 1, 3: 4, 4: 5}[U]}


def run_exact(B, S, H, *, padding, chunks, prefix_inplace=False, fn=None, packed=False, seed=1):
    U, r = world()
    q, k, v = full_qkv(B, S, H, seed=seed)
    want = shard_rows(reference(q, k, v), G.group)
    ql, kl, vl = (shard_rows(t, G.group) for t in (q, k, v))
    ua = UlyssesAttention(G.group, chunks=chunks, padding=padding, prefix_inplace=prefix_inplace)
    fn = fn or Recorder()
    if packed:
        got = ua(None, None, None, fn, seq_len=S, packed=pack_by_index(ql, kl, vl, U))
    else:
        got = ua(ql, kl, vl, fn, seq_len=S)
    assert_bits(got, want, f"U={U} rank {r} B={B} S={S} {padding} chunks={chunks}")
    return ua, fn


def pack_by_index(q, k, v, U):
    """Destination-major (U, 3, B, S_loc, H/U, D) built element block by element block."""
    B, S_loc, H, _ = q.shape
    h = H // U
    out = torch.empty((U, 3, B, S_loc, h, D), dtype=q.dtype)
    for d in range(U):
        for t, x in enumerate((q, k, v)):
            for j in range(h):
                out[d, t, :, :, j, :].view(torch.uint8).copy_(x[:, :, d * h + j, :].view(torch.uint8))
    return out


# ---- exactness matrix -----------------------------------------------------------------------------------

def _matrix_case(padding, chunks, B, kind):
    def fn():
        U, _ = world()
        S = lengths(U)[kind]
        S_pad = padded_len(S, U)
        ua, rec = run_exact(B, S, 4 * U, padding=padding, chunks=chunks)
        assert len(rec.calls) == chunks, f"attn_fn called {len(rec.calls)} times, expected {chunks}"
        rq = S if padding in ("fixed_valid", "valid_only") else S_pad
        for qs, ks, contig in rec.calls:
            assert qs[1] == rq and ks[1] == S, f"attention on q rows {qs[1]}, k rows {ks[1]}; expected {rq}, {S}"
            assert contig, "attn_fn got non-contiguous q/k"
        assert ua.stats["a2a_async" if chunks > 1 else "a2a_sync"] == 2 * chunks, dict(ua.stats)
    return fn


for _p in ("padded", "fixed_valid", "valid_only"):
    for _c in (1, 2):
        for _B in (1, 2):
            for _k in ("div", "nondiv", "allpad"):
                case(f"exact-{_p}-c{_c}-B{_B}-{_k}")(_matrix_case(_p, _c, _B, _k))


@case("exact-none-div")
def _():
    U, _ = world()
    run_exact(2, 4 * U, 4 * U, padding="none", chunks=1)


@case("exact-chunks3-uneven")
def _():
    U, _ = world()
    for padding in ("padded", "valid_only"):
        ua, rec = run_exact(2, 4 * U - 1, 4 * U, padding=padding, chunks=3)
        assert sorted(c[0][2] for c in rec.calls) == [1, 1, 2], rec.calls  # 4 local heads -> 2, 1, 1


@case("overlap-order")
def _():
    U, _ = world()
    ua = UlyssesAttention(G.group, chunks=2, padding="fixed_valid")
    ua.trace = []
    S = 4 * U - 1
    q, k, v = (shard_rows(t, G.group) for t in full_qkv(1, S, 4 * U))
    ua(q, k, v, attn64, seq_len=S)
    # chunk 1's exchange is in flight while chunk 0 attends
    assert ua.trace == ["pre0", "pre1", "attn0", "post0", "attn1", "post1"], ua.trace
    assert ua.stats["a2a_async"] == 4 and ua.stats["a2a_sync"] == 0, dict(ua.stats)


@case("packed-reference-layout")
def _():
    U, _ = world()
    for chunks in (1, 2):
        for padding in ("padded", "valid_only"):
            run_exact(2, 4 * U - 1, 4 * U, padding=padding, chunks=chunks, packed=True)


# ---- the projection exchange ----------------------------------------------------------------------------

def _projection_case(padding, kind, split=False):
    def fn():
        U, r = world()
        S, H = lengths(U)[kind], 4 * U
        h = H // U
        q, k, v = full_qkv(1, S, H, seed=5)
        want = shard_rows(reference(q, k, v), G.group)
        ql, kl, vl = (shard_rows(t, G.group) for t in (q, k, v))
        order = []

        def produce(d):  # destination d's heads over this rank's rows
            order.append(d)
            return tuple(t[:, :, d * h:(d + 1) * h].contiguous() for t in (ql, kl, vl))

        ua = UlyssesAttention(G.group, padding=padding, split_output=split)
        ua.trace = []
        gathered = ua.exchange_projected(produce, seq_len=S, shape=tuple(ql.shape), dtype=ql.dtype, device=ql.device)
        # every remote destination first, this rank last; the exchanges are in flight before attention
        assert order == [(r + j) % U for j in range(1, U)] + [r], order
        for t, full in zip((q, k, v), gathered):
            rows = padded_len(S, U)
            assert tuple(full.shape) == (1, rows, h, D) and full.is_contiguous(), full.shape
            assert_bits(full[:, :S], t[:, :, r * h:(r + 1) * h].contiguous(), "gathered heads")
        rec = Recorder()
        got = ua(None, None, None, rec, seq_len=S, gathered=gathered)
        assert_bits(got, want, f"U={U} rank {r} S={S} {padding} projection exchange split={split}")
        pre = [f"p2p{j}" for j in range(1, U)]
        if split:  # the other ranks' rows attend and leave first, this rank's rows last
            S_loc = shard_len(S, U)
            post = [x for j in range(1, U) for x in (f"attn-rows{(r + j) % U}", f"post-p2p{j}")]
            assert ua.trace == pre + post + [f"attn-rows{r}"], ua.trace
            assert [(c[0][1], c[1][1]) for c in rec.calls] == [(S_loc, S)] * U, rec.calls
            assert ua.stats["p2p_async"] == 2 * (U - 1) and ua.stats["a2a_sync"] == 0, dict(ua.stats)
            assert ua.last_bytes["post"] == S_loc * h * D * 2 * (U - 1), ua.last_bytes
            return
        assert ua.trace == pre + ["attn0", "post0"], ua.trace
        # valid_only sends uneven row counts (one all-to-all); whole blocks go as send/recv plus a local copy
        post = "a2a_sync" if padding == "valid_only" else "p2p_sync"
        assert ua.stats["p2p_async"] == U - 1 and ua.stats[post] == 1, dict(ua.stats)
        rq = S if padding in ("fixed_valid", "valid_only") else padded_len(S, U)
        assert [(c[0][1], c[1][1]) for c in rec.calls] == [(rq, S)], rec.calls
        per = shard_len(S, U) * h * D * 2  # one (S_loc, h, D) bf16 tensor
        assert ua.last_bytes["pre"] == 3 * per * (U - 1), ua.last_bytes
    return fn


for _p in ("padded", "fixed_valid", "valid_only"):
    for _k in ("div", "nondiv", "allpad"):
        case(f"projection-{_p}-{_k}")(_projection_case(_p, _k))
for _k in ("div", "nondiv", "allpad"):
    case(f"projection-split-padded-{_k}")(_projection_case("padded", _k, split=True))
case("projection-split-none-div")(_projection_case("none", "div", split=True))


@case("projection-errors")
def _():
    U, r = world()
    S, H = 4 * U - 1, 4 * U
    h = H // U
    ql, kl, vl = (shard_rows(t, G.group) for t in full_qkv(1, S, H))
    ua = UlyssesAttention(G.group)
    shape = tuple(ql.shape)

    def good(d):
        return tuple(t[:, :, d * h:(d + 1) * h].contiguous() for t in (ql, kl, vl))

    _raises(lambda: ua.exchange_projected(good, seq_len=S, shape=(2, *shape[1:]), dtype=ql.dtype, device=ql.device),
            "takes batch 1")
    for kw in (dict(padding="valid_only"), dict(padding="fixed_valid"), dict(chunks=2), dict(fp8_codes=True)):
        _raises(lambda: UlyssesAttention(G.group, split_output=True, **kw), "split_output needs")
    _raises(lambda: UlyssesAttention(G.group, chunks=2).exchange_projected(good, seq_len=S, shape=shape, dtype=ql.dtype,
                                                                            device=ql.device), "chunks=1")
    _raises(lambda: ua.exchange_projected(lambda d: good(d)[:2], seq_len=S, shape=shape, dtype=ql.dtype,
                                          device=ql.device), "must return (q, k, v)")
    _raises(lambda: ua.exchange_projected(lambda d: (good(d)[0][:, :-1], *good(d)[1:]), seq_len=S, shape=shape,
                                          dtype=ql.dtype, device=ql.device), "expected a contiguous")
    _raises(lambda: ua.exchange_projected(good, seq_len=S + U, shape=shape, dtype=ql.dtype, device=ql.device),
            "rows per rank")
    g = ua.exchange_projected(good, seq_len=S, shape=shape, dtype=ql.dtype, device=ql.device)
    _raises(lambda: ua(ql, None, None, attn64, seq_len=S, gathered=g), "pass gathered alone")
    _raises(lambda: ua(None, None, None, attn64, seq_len=S, gathered=g[:2]), "exchange_projected's")
    _raises(lambda: ua(None, None, None, attn64, seq_len=S, gathered=(g[0][:, :-1], g[1][:, :-1], g[2][:, :-1])),
            "U*S_loc")
    from h3plan.runtime.parallel.comm import high_priority_group

    assert high_priority_group(G.group) is G.group  # gloo has no stream priority: the group itself
    dist.barrier(group=G.group)
    ua(None, None, None, attn64, seq_len=S, gathered=g)  # the group still works after the refused calls


# ---- prefix in place -----------------------------------------------------------------------------------

@case("prefix-inplace-out-kw")
def _():
    U, _ = world()
    S = 4 * U - 1
    for padding, B, chunks in (("fixed_valid", 1, 1), ("fixed_valid", 2, 2), ("padded", 2, 1)):
        fn = OutAttn()
        ua, _ = run_exact(B, S, 4 * U, padding=padding, chunks=chunks, prefix_inplace=True, fn=fn)
        rq = S if padding == "fixed_valid" else padded_len(S, U)
        assert ua.stats["prefix_out_kw"] == chunks, dict(ua.stats)
        assert [s[1] for s in fn.outs] == [rq] * chunks, fn.outs


@case("prefix-inplace-plain-fn")
def _():
    U, _ = world()
    ua, _ = run_exact(2, 4 * U - 1, 4 * U, padding="fixed_valid", chunks=1, prefix_inplace=True, fn=attn64)
    assert ua.stats["prefix_out_kw"] == 0, dict(ua.stats)

    def kw_attn(q, k, v, **kw):
        o = attn64(q, k, v)
        if "out" in kw:
            kw["out"].copy_(o)
            return kw["out"]
        return o

    ua, _ = run_exact(2, 4 * U - 1, 4 * U, padding="fixed_valid", chunks=2, prefix_inplace=True, fn=kw_attn)
    assert ua.stats["prefix_out_kw"] == 2, dict(ua.stats)


# ---- FP8 codes and the amax hook -----------------------------------------------------------------------

def _local_amax(ts, vr):
    return torch.stack([t[:, :vr].float().abs().amax() if vr else torch.zeros(()) for t in ts])


def _cast(t, scale):
    return (t.float() * scale).clamp(-448, 448).to(E4M3)


@case("amax-hook-padding-excluded")
def _():
    U, r = world()
    S = 4 * U - 1 if U != 3 else 4  # U=3, S=4: rank 2 holds only padding
    full = full_qkv(1, S, 4 * U, seed=7)
    full = [t * (1 + i + 2 * torch.arange(S).view(1, S, 1, 1)) for i, t in enumerate(full)]  # amax grows with rows
    loc = [shard_rows(t, G.group) for t in full]
    vr = valid_rows(S, U, r)
    for t in loc:
        t[:, vr:] = 1e4  # padding rows must not set the scale
    amax = _local_amax(loc, vr)
    before = amax.clone()
    amax_allreduce_hook(G.group)(amax)
    want = torch.stack([t.float().abs().amax() for t in full])
    assert torch.equal(amax, want), f"rank {r}: {amax.tolist()} != global {want.tolist()}"
    everyone = [torch.empty(3) for _ in range(U)]
    dist.all_gather(everyone, before, group=G.group)
    assert len({tuple(e.tolist()) for e in everyone}) > 1, "ranks had equal local amax: the case shows nothing"


def _fp8_attn(descale, out_fp8):
    def fn(q8, k8, v8):
        q, k, v = (t.double() * descale[i].double() for i, t in enumerate((q8, k8, v8)))
        o = attn64(q, k, v)
        return _cast(o, 448.0 / 4.0) if out_fp8 else o.to(torch.bfloat16)
    return fn


def _fp8_inputs(B, S, H, seed=3):
    """Global-scale e4m3 codes of the full q, k, v and this rank's shards (scale via the hook)."""
    U, r = world()
    full = full_qkv(B, S, H, seed=seed)
    loc = [shard_rows(t, G.group) for t in full]
    amax = _local_amax(loc, valid_rows(S, U, r))
    amax_allreduce_hook(G.group)(amax)
    scale = 448.0 / amax
    codes_full = [_cast(t, scale[i]) for i, t in enumerate(full)]
    codes_loc = [_cast(t, scale[i]) for i, t in enumerate(loc)]
    return codes_full, codes_loc, 1.0 / scale


@case("fp8-codes")
def _():
    U, r = world()
    B, H = 2, 4 * U
    for kind in ("div", "nondiv", "allpad"):
        S = lengths(U)[kind]
        codes_full, codes_loc, descale = _fp8_inputs(B, S, H)
        for out_fp8 in (False, True):
            fn = _fp8_attn(descale, out_fp8)
            want = shard_rows(reference(*codes_full, fn=fn), G.group)
            for padding in ("padded", "fixed_valid", "valid_only"):
                for chunks in (1, 2):
                    ua = UlyssesAttention(G.group, chunks=chunks, padding=padding, fp8_codes=True)
                    got = ua(*codes_loc, fn, seq_len=S)
                    assert_bits(got, want, f"fp8 {kind} out_fp8={out_fp8} {padding} c{chunks}")
                    packed = pack_by_index(*codes_loc, U)
                    got = ua(None, None, None, fn, seq_len=S, packed=packed)
                    assert_bits(got, want, f"fp8 packed {kind} out_fp8={out_fp8} {padding} c{chunks}")


@case("bytes-formula")
def _():
    U, r = world()
    B, H, S = 2, 4 * U, 4 * U - 1
    S_loc = shard_len(S, U)
    q, k, v = (shard_rows(t, G.group) for t in full_qkv(B, S, H))
    ua = UlyssesAttention(G.group, chunks=2, padding="padded")
    ua(q, k, v, attn64, seq_len=S)
    bf16 = ua.last_bytes
    assert bf16 == {"pre": 3 * a2a_bytes(B, S_loc, H, D, 2, U), "post": a2a_bytes(B, S_loc, H, D, 2, U)}, bf16

    ua = UlyssesAttention(G.group, padding="valid_only")
    ua(q, k, v, attn64, seq_len=S)
    sent = sum(B * valid_rows(S, U, d) * (H // U) * D * 2 for d in range(U) if d != r)
    assert ua.last_bytes == {"pre": bf16["pre"], "post": sent}, ua.last_bytes

    _, codes, descale = _fp8_inputs(B, S, H)
    ua = UlyssesAttention(G.group, padding="padded", fp8_codes=True)
    ua(*codes, _fp8_attn(descale, False), seq_len=S)
    f8 = ua.last_bytes
    assert f8 == {"pre": 3 * a2a_bytes(B, S_loc, H, D, 1, U), "post": bf16["post"]}, f8
    ratio = Fraction(f8["pre"] + f8["post"], bf16["pre"] + bf16["post"])
    assert ratio == Fraction(5, 8), f"FP8 codes move {ratio} of the bf16 bytes, expected 5/8 (37.5% fewer)"


# ---- the real qk_norm_rope kernels (TRITON_INTERPRET=1 on this machine) --------------------------------

def _kernel_inputs(B, S, H, U, r, seed=11):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, S, H, D, generator=g).to(torch.bfloat16) for _ in range(3))
    wq, wk = ((1 + 0.1 * torch.randn(D, generator=g)).to(torch.bfloat16) for _ in range(2))
    pos = torch.arange(padded_len(S, U), dtype=torch.float32)[:, None] * torch.tensor([1.0, 0.1])
    cos, sin = torch.cat([pos.cos()] * 2, -1), torch.cat([pos.sin()] * 2, -1)  # (S_pad, R=4)
    S_loc = shard_len(S, U)
    rows = slice(r * S_loc, (r + 1) * S_loc)
    return [shard_rows(t, G.group) for t in (q, k, v)], wq, wk, cos[rows].contiguous(), sin[rows].contiguous()


@case("kernel-packed-bf16", worlds=(3, 4))  # Triton interpreter: keep it to two world sizes
def _():
    try:
        from h3plan.runtime.kernels import qk_norm_rope as m
    except ImportError as e:
        return f"skip: h3plan.runtime.kernels.qk_norm_rope not importable ({e})"
    U, r = world()
    B, S, H = 2, 4 * U - 1, 4 * U
    (q, k, v), wq, wk, cos, sin = _kernel_inputs(B, S, H, U, r)
    reason = m.qk_norm_rope_check(q, k, wq, wk, cos, sin, 1e-6, v=v, ulysses_degree=U)
    if reason:
        return f"skip: qk_norm_rope_check refuses CPU tensors: {reason}"
    qn, kn, vn = m.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6, v=v, ulysses_degree=1)
    packed = m.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6, v=v, ulysses_degree=U)
    assert_bits(packed, pack_by_index(qn, kn, vn, U), "kernel destination-major layout")
    for padding in ("padded", "valid_only"):
        for chunks in (1, 2):
            ua = UlyssesAttention(G.group, chunks=chunks, padding=padding)
            want = ua(qn, kn, vn, attn64, seq_len=S)
            assert_bits(ua(None, None, None, attn64, seq_len=S, packed=packed), want, f"kernel packed {padding}")


@case("kernel-packed-fp8-hook", worlds=(2, 4))
def _():
    try:
        from h3plan.runtime.kernels import qk_norm_rope as m
    except ImportError as e:
        return f"skip: h3plan.runtime.kernels.qk_norm_rope not importable ({e})"
    U, r = world()
    B, S, H = 1, 4 * U - 1, 4 * U
    (q, k, v), wq, wk, cos, sin = _kernel_inputs(B, S, H, U, r, seed=12)
    vr = valid_rows(S, U, r)
    q[:, vr:] = 100.0  # padding rows would dominate the amax if they were counted
    reason = m.qk_norm_rope_fp8_check(q, k, v, wq, wk, cos, sin, 1e-6, valid_len=vr, ulysses_degree=U)
    if reason:
        return f"skip: qk_norm_rope_fp8_check refuses CPU tensors: {reason}"
    hook = amax_allreduce_hook(G.group)
    from h3plan.runtime.kernels import qk_fp8_lean as lean  # the FP8 q/k/v cast the plan runs (its only one)

    packed, descale = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-6, valid_len=vr, amax_hook=hook,
                                                 ulysses_degree=U)
    q8, k8, v8, descale1 = lean.qk_norm_rope_fp8_lean(q, k, v, wq, wk, cos, sin, 1e-6, valid_len=vr, amax_hook=hook)
    assert torch.equal(descale, descale1)
    all_d = [torch.empty(3) for _ in range(U)]
    dist.all_gather(all_d, descale.float(), group=G.group)
    assert all(torch.equal(d, all_d[0]) for d in all_d), f"descales differ over ranks: {all_d}"
    fn = _fp8_attn(descale, False)
    ua = UlyssesAttention(G.group, chunks=2, padding="valid_only", fp8_codes=True)
    assert_bits(ua(None, None, None, fn, seq_len=S, packed=packed), ua(q8, k8, v8, fn, seq_len=S), "kernel fp8 packed")


# ---- degree 1, helpers, merge path ---------------------------------------------------------------------

@case("degree-one-group")
def _():
    U, r = world()
    groups = [dist.new_group([i]) for i in range(U)]  # every rank creates every group
    g = groups[r]
    B, S, H = 2, 5, 4
    q, k, v = full_qkv(B, S, H)
    ua = UlyssesAttention(g, chunks=2, padding="valid_only")
    assert ua.degree == 1
    assert_bits(ua(q, k, v, attn64, seq_len=S), reference(q, k, v), "degree 1")
    assert_bits(ua(None, None, None, attn64, seq_len=S, packed=torch.stack([q, k, v])[None]), reference(q, k, v),
                "degree 1 packed")
    assert ua.stats["a2a_sync"] == ua.stats["a2a_async"] == 0, dict(ua.stats)


@case("shard-gather-rows")
def _():
    U, r = world()
    for S in lengths(U).values():
        x = torch.randn(2, S, 3, generator=torch.Generator().manual_seed(S)).to(torch.bfloat16)
        loc = shard_rows(x, G.group)
        n = valid_rows(S, U, r)
        assert loc.shape == (2, shard_len(S, U), 3) and torch.equal(loc[:, n:], torch.zeros_like(loc[:, n:]))
        assert_bits(gather_rows(loc, G.group, seq_len=S), x, "gather_rows")
        x8 = x.to(E4M3)
        assert_bits(gather_rows(shard_rows(x8, G.group, dim=1), G.group, seq_len=S), x8, "gather_rows fp8")
        assert gather_rows(loc, G.group).shape[1] == padded_len(S, U)


@case("merge-path")
def _():
    """With the fused merge kernel importable, unchunked calls use it (valid_only through its short
    receive viewed as (U, B, S_loc, h, D)); chunked calls and a missing kernel use the eager merge."""
    U, _ = world()
    try:
        from h3plan.runtime.kernels import ulysses_merge as mk
    except ImportError:
        mk = None
    for kind in ("nondiv", "allpad"):
        S = lengths(U)[kind]
        for padding in ("padded", "valid_only"):
            ua, _ = run_exact(2, S, 4 * U, padding=padding, chunks=1)
            path = "merge_kernel" if mk is not None else "merge_eager"
            assert ua.stats[path] == 1, f"{padding} {kind}: {dict(ua.stats)}"
    ub, _ = run_exact(2, 4 * U - 1, 4 * U, padding="valid_only", chunks=2)
    assert ub.stats["merge_eager"] == 1, dict(ub.stats)


# ---- guards --------------------------------------------------------------------------------------------

def _raises(fn, text):
    try:
        fn()
    except ValueError as e:
        assert text in str(e), f"error {str(e)!r} lacks {text!r}"
        assert "\n" not in str(e), f"error is not one line: {str(e)!r}"
        return
    raise AssertionError(f"no ValueError (expected {text!r})")


@case("errors")
def _():
    U, r = world()
    S, H = 4 * U - 1, 4 * U
    q, k, v = (shard_rows(t, G.group) for t in full_qkv(2, S, H))
    ua = UlyssesAttention(G.group)
    _raises(lambda: UlyssesAttention(G.group, chunks=0), "chunks must be")
    _raises(lambda: UlyssesAttention(G.group, padding="tail"), "padding must be one of")
    _raises(lambda: UlyssesAttention(G.group, padding="valid_only", prefix_inplace=True), "prefix_inplace")
    bad = full_qkv(2, S, H + 1)
    _raises(lambda: ua(*(shard_rows(t, G.group) for t in bad), attn64, seq_len=S), "not divisible by the Ulysses")
    _raises(lambda: ua(q, k[:, :-1], v, attn64, seq_len=S), "shapes differ")
    _raises(lambda: ua(q, k.float(), v, attn64, seq_len=S), "dtypes differ")
    _raises(lambda: ua(q, k, v, attn64, seq_len=S + U), "rows per rank")
    _raises(lambda: ua(q, k, v, attn64, seq_len=float(S)), "seq_len must be a positive int")
    _raises(lambda: ua(q.int(), k.int(), v.int(), attn64, seq_len=S), "floating point")
    _raises(lambda: UlyssesAttention(G.group, fp8_codes=True)(q, k, v, attn64, seq_len=S), "fp8_codes=True expects")
    _raises(lambda: ua(q.to(E4M3), k.to(E4M3), v.to(E4M3), attn64, seq_len=S), "fp8_codes=False")
    packed = pack_by_index(q, k, v, U)
    _raises(lambda: ua(q, k, v, attn64, seq_len=S, packed=packed), "not both")
    _raises(lambda: ua(q, None, v, attn64, seq_len=S), "all required")
    _raises(lambda: ua(None, None, None, attn64, seq_len=S, packed=packed[:, :2]), "is not (U=")
    _raises(lambda: ua(None, None, None, attn64, seq_len=S, packed=packed[0]), "6-dim")
    _raises(lambda: UlyssesAttention(G.group, chunks=H // U + 1)(q, k, v, attn64, seq_len=S), "exceeds the")
    _raises(lambda: UlyssesAttention(G.group, padding="none")(q, k, v, attn64, seq_len=S), "padding='none'")
    _raises(lambda: gather_rows(q, G.group, seq_len=S + U), "does not match")
    assert "CUDA tensors need NCCL" in device_reason(G.group, torch.device("cuda", 0))
    # a wrong attention output shape fails on every rank after the pre-attention exchange
    _raises(lambda: ua(q, k, v, lambda a, b, c: a[:, :1], seq_len=S), "attn_fn returned")
    _raises(lambda: UlyssesAttention(G.group, padding="fixed_valid", prefix_inplace=True)(
        q, k, v, lambda a, b, c: attn64(a, b, c).float(), seq_len=S), "prefix_inplace allocated")
    dist.barrier(group=G.group)
    run_exact(2, S, H, padding="valid_only", chunks=2)  # the group still works after the refused calls


# ---- worker --------------------------------------------------------------------------------------------

def worker(rank, world_size, port, outdir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    results = {}
    for name, (worlds, fn) in CASES.items():
        if world_size not in worlds:
            continue
        dist.barrier()  # the default group carries only this per-case sync
        G.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=CASE_TIMEOUT_S))
        t0 = time.perf_counter()
        try:
            results[name] = fn() or "ok"
        except Exception as e:  # recorded per case; the parent test reports it
            tb = traceback.extract_tb(e.__traceback__)[-1]
            results[name] = f"FAIL {type(e).__name__}: {e} ({os.path.basename(tb.filename)}:{tb.lineno})"
        if results[name] == "ok":
            dist.destroy_process_group(G.group)
        if os.environ.get("ULYSSES_CASE_TIMES"):
            print(f"rank {rank} {name} {time.perf_counter() - t0:.2f}s", flush=True)
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()
