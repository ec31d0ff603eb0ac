"""Block router for sparse attention: per head and query block, which key blocks to attend (FA4's full blocks).

    q (B, Rq, H, D), k (B, S, H, D) -> full_block_cnt (B, H, M) int32, full_block_idx (B, H, M, N) int32
    M = ceil(Rq / block_q), N = ceil(S / block_k); row i of idx holds its kept key blocks ascending, then zeros.

Scoring (a sub-block log-sum-exp, the estimator SGLang's SubBlock published for H3, docs/sources.md#sglang-subblock;
written here from its formula): each block is cut into sub-blocks of `sub` rows, each sub-block is pooled to the
fp32 mean of its rows, and a (query block i, key block j) pair scores

    score(i, j) = log sum_{a in i, b in j} exp(mean(q_a) . mean(k_b) / sqrt(D))

over the sub-block pairs (an estimate of the un-normalised softmax mass the block holds). Rows at or past the
valid length (q: min(Rq, S), so Ulysses' padded query rows never move a mean; k: S) are left out of the means,
and a sub-block with no valid row out of the sum.

Selection, per (b, h, i): a query block routes when all its rows are target-video rows (row >= `video_start`;
`video_only=False`: every query block routes); any other block keeps every key block (dense inside the same call).
A routed block always keeps the key blocks that hold a row before `video_start` (text, conditions, references,
audio) and the key blocks overlapping its own rows (its diagonal), and fills up to `keep_blocks` kept blocks (when
the forced ones are fewer) with the best-scoring others: higher score first, ties to the lower block index (a stable
descending sort with the forced blocks at +inf), so the choice is deterministic. FA4's SM90 forward processes a row's
blocks from the last listed to the first and masks the key tail (S % block_k) only on the first it processes, so the
list is ascending: a kept tail block comes first.

`video_start` is a device int tensor (one element), so a call never syncs with the host.

Runtime: the sub-block means in torch (summed in fp32 from the bf16 rows, no fp32 copy of q or k), then two Triton
kernels: `_scores_kernel` (every sub-block pair's IEEE fp32 dot, scaled and masked, and the log-sum-exp over each
block pair's sub-blocks, in registers: only the (B, H, M, N) scores reach memory) and `_select_kernel` (one program
per (b, h, i): the forced blocks, the k-th best candidate key found by a 32-step bisection on the scores' ordered
bits, ties to the lower index by a running count, and FA4's ascending list written in place: no sort). The torch
form (`block_router_torch`: one fp32 matmul of the means, a logsumexp over the (B, H, M*nsub, N*nsub) products, a
stable sort per row, a scatter and a scan) is the path for CPU tensors (in Triton's interpreter the kernels take
seconds a call, 50x the torch form; tests/kernels/test_block_router.py runs them there against it), and the GPU bench's
comparison (benchmarks/sparse_attention_h200.py). A first Triton router (a bisection per row with its dots on the FMA
path, one query block at a time) took 50.6 ms at 37,820 x 56 heads on the H200, nearly the dense FA4 call's 60.9 ms
(benchmarks/results/probes/sparse-router-triton-h200.json); these kernels tile the dots over 16 query blocks and 16
key blocks at a time. `block_router_ref` is the selection written per row in a loop (the oracle: same rules and tie
order, the scores from an einsum, equal to fp32 rounding). Fallback: the caller runs `block_router_ref`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from h3plan.runtime.kernels._common import LAUNCH_OPTS, guard
from h3plan.runtime.kernels._registry import custom_op

SUB = 32  # rows per pooled sub-block
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def keep_blocks(keep: float, n: int) -> int:
    """Key blocks a routed query block keeps of n (the forced ones included, when fewer): ceil(keep * n), >= 1."""
    return min(n, max(1, math.ceil(keep * n - 1e-9)))


def _shape(q, k, block_q, block_k):
    B, Rq, H, D = q.shape
    S = k.shape[1]
    return B, H, D, Rq, S, -(-Rq // block_q), -(-S // block_k)


def block_router_check(q, k, video_start, keep: float, block_q: int = 128, block_k: int = 128,
                       sub: int = SUB) -> str | None:
    """None if the kernels take these inputs, else the one-line reason."""
    def checks():
        for name, t in (("q", q), ("k", k)):
            yield isinstance(t, torch.Tensor) and t.dim() == 4, f"{name} must be a 4-dim (B, S, H, D) tensor"
            yield t.dtype in DTYPES, f"{name} dtype {t.dtype} not in bf16/fp16/fp32"
            yield t.stride(-1) == 1, f"{name}'s head dim is not contiguous"
        yield (q.shape[0], q.shape[2], q.shape[3]) == (k.shape[0], k.shape[2], k.shape[3]), (
            f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in B, H or D")
        yield q.shape[-1] % 16 == 0 and q.shape[-1] <= 256, f"head_dim {q.shape[-1]} must be a multiple of 16, <= 256"
        yield isinstance(video_start, torch.Tensor) and video_start.numel() == 1 and video_start.device == q.device, (
            "video_start must be a one-element tensor on q's device")
        yield 0.0 < keep <= 1.0, f"keep {keep} must be in (0, 1]"
        yield (sub > 0 and block_q % sub == 0 and block_k % sub == 0,
               f"blocks {block_q}x{block_k} are no multiple of {sub}")
        yield -(-k.shape[1] // block_k) <= 8192, f"{k.shape[1]} keys are over 8192 key blocks"
    return guard(checks())


def _pooled(x, valid: int, block: int, sub: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(sub-block means (B, H, nblocks * nsub, D) fp32, sub-block holds a valid row (nblocks * nsub,), every one
    does): rows at or past `valid` are zeros and left out of the counts; the sums accumulate in fp32 without an fp32
    copy of x."""
    B, R, H, D = x.shape
    nb, ns = -(-R // block), block // sub
    full = valid // block * block  # the whole blocks' rows are summed in place (a view); the one partial block,
    sums = x[:, :full].reshape(B, full // sub, sub, H, D).sum(2, dtype=torch.float32)  # zero-padded to a whole block
    if nb * block > full:  # alone, so the rows are never copied whole
        tail = torch.nn.functional.pad(x[:, full:valid], (0, 0, 0, 0, 0, (nb * block - full) - (valid - full)))
        sums = torch.cat([sums, tail.reshape(B, (nb * block - full) // sub, sub, H, D).sum(2, dtype=torch.float32)], 1)
    n = (torch.arange(nb * block, device=x.device) < valid).view(nb * ns, sub).sum(-1).to(torch.float32)
    means = (sums / n.clamp(min=1.0)[None, :, None, None]).permute(0, 2, 1, 3)
    return means, n > 0, valid > (nb * ns - 1) * sub  # the last flag, from the shapes: every sub-block holds a row


def _launch_torch(q, k, video_start, keep, block_q, block_k, video_only, sub=SUB):
    """The router in torch ops (the module docstring's torch form)."""
    B, H, D, Rq, S, M, N = _shape(q, k, block_q, block_k)
    dev = q.device
    nqs, nks = block_q // sub, block_k // sub
    qm, qv, q_full = _pooled(q, min(Rq, S), block_q, sub)
    km, kv, k_full = _pooled(k, S, block_k, sub)
    x = torch.matmul(qm, km.transpose(-1, -2)).div_(math.sqrt(D))  # (B, H, M*nqs, N*nks): every sub-block pair
    if not (q_full and k_full):
        x.masked_fill_(~(qv[:, None] & kv[None, :]), float("-inf"))
    scores = torch.logsumexp(x.view(B, H, M, nqs, N, nks), dim=(3, 5))  # (B, H, M, N)
    i, j = torch.arange(M, device=dev)[:, None], torch.arange(N, device=dev)[None, :]
    vs = video_start.reshape(()).to(device=dev, dtype=torch.int64)
    forced = (j * block_k < vs) | ((j * block_k < (i + 1) * block_q) & ((j + 1) * block_k > i * block_q))
    kb = keep_blocks(keep, N)
    routed = (torch.arange(M, device=dev) * block_q >= (vs if video_only else 0)) & (kb < N)
    # forced blocks first, then the best scores; a stable descending sort puts equal scores lower index first
    order = torch.sort(scores.masked_fill(forced, float("inf")), dim=-1, descending=True, stable=True).indices
    take = torch.arange(N, device=dev) < forced.sum(-1).clamp(min=kb)[:, None]  # (M, N): ranks kept
    kept = torch.zeros((B, H, M, N), dtype=torch.bool, device=dev).scatter_(-1, order, take.expand(B, H, M, N))
    return mask_to_blocks(kept | ~routed[:, None])



TILE = 64  # sub-block rows and columns per scores program (16 blocks of 4 sub-blocks each way at 128 / 32)
CHUNK_D = 32  # head-dim slice per dot


@triton.jit
def _scores_kernel(qm_ptr, km_ptr, out_ptr, H, M, N, q_subs, k_subs, sqb, sqh, sqr, skb, skh, skr, root_d,
                   D: tl.constexpr, CHUNK: tl.constexpr, NQS: tl.constexpr, NKS: tl.constexpr,
                   TQ: tl.constexpr, TK: tl.constexpr):
    """scores[b, h, i, j] = log sum over the (query sub a of block i, key sub c of block j) pairs with a valid row of
    exp(qm[a] . km[c] / sqrt(D)); TQ query blocks x TK key blocks per program."""
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // H, bh % H
    rows = tl.program_id(1).to(tl.int64) * (TQ * NQS) + tl.arange(0, TQ * NQS)
    cols = tl.program_id(2).to(tl.int64) * (TK * NKS) + tl.arange(0, TK * NKS)
    d = tl.arange(0, CHUNK)
    qp = qm_ptr + b * sqb + h * sqh + rows[:, None] * sqr
    kp = km_ptr + b * skb + h * skh + cols[:, None] * skr
    acc = tl.zeros((TQ * NQS, TK * NKS), dtype=tl.float32)
    for d0 in tl.static_range(0, D, CHUNK):
        qa = tl.load(qp + d0 + d[None, :], mask=rows[:, None] < M * NQS, other=0.0)
        ka = tl.load(kp + d0 + d[None, :], mask=cols[:, None] < N * NKS, other=0.0)
        acc += tl.dot(qa, tl.trans(ka), input_precision="ieee")
    x = acc / root_d
    x = tl.where((rows[:, None] < q_subs) & (cols[None, :] < k_subs), x, float("-inf"))
    x4 = tl.reshape(x, (TQ, NQS, TK, NKS))
    m = tl.max(tl.max(x4, axis=3), axis=1)  # (TQ, TK)
    m = tl.where(m == float("-inf"), 0.0, m)  # a pair with no valid sub-block: log(0) = -inf below
    e = tl.exp(x4 - m[:, None, :, None])
    lse = m + tl.log(tl.sum(tl.sum(e, axis=3), axis=1))
    i = tl.program_id(1).to(tl.int64) * TQ + tl.arange(0, TQ)
    j = tl.program_id(2).to(tl.int64) * TK + tl.arange(0, TK)
    tl.store(out_ptr + (bh * M + i[:, None]) * N + j[None, :], lse, mask=(i[:, None] < M) & (j[None, :] < N))


@triton.jit
def _select_kernel(scores_ptr, cnt_ptr, idx_ptr, vs_ptr, M, N, kb, block_q, block_k,
                   VIDEO_ONLY: tl.constexpr, BLOCK_N: tl.constexpr):
    """One (b, h, i) row: kept = forced | the (kb - forced) best others (ties to the lower index), or every block when
    the row is not routed; writes the kept count and the ascending list (then zeros)."""
    row = tl.program_id(0).to(tl.int64)
    i = row % M
    j = tl.arange(0, BLOCK_N).to(tl.int64)
    inb = j < N
    vs = tl.load(vs_ptr).to(tl.int64)
    s = tl.load(scores_ptr + row * N + j, mask=inb, other=float("-inf"))
    forced = inb & ((j * block_k < vs) | ((j * block_k < (i + 1) * block_q) & ((j + 1) * block_k > i * block_q)))
    if VIDEO_ONLY:
        routed = (i * block_q >= vs) & (kb < N)
    else:
        routed = kb < N
    need = tl.maximum(kb - tl.sum(forced.to(tl.int32), 0), 0)
    bits = s.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    key = tl.where(bits >= 0x80000000, 0xFFFFFFFF - bits, bits | 0x80000000)  # ordered as the scores
    key = tl.where(inb & ~forced, key, -1)
    t = (need * 0).to(tl.int64)  # the largest t with at least `need` candidates at key >= t
    for bit in tl.static_range(31, -1, -1):
        c = t + (1 << bit)
        t = tl.where(tl.sum((key >= c).to(tl.int32), 0) >= need, c, t)
    above = key > t
    tie = (key == t).to(tl.int32)
    take = (above | ((tie > 0) & (tl.cumsum(tie, 0) <= need - tl.sum(above.to(tl.int32), 0)))) & (need > 0)
    kept = tl.where(routed, forced | take, inb) & inb
    incl = tl.cumsum(kept.to(tl.int32), 0)
    cnt = tl.sum(kept.to(tl.int32), 0)
    pos = tl.where(kept, incl - 1, cnt + j - incl)  # kept: its rank; dropped: after the kept, in order (zeros)
    tl.store(idx_ptr + row * N + pos, tl.where(kept, j, 0).to(tl.int32), mask=inb)
    tl.store(cnt_ptr + row, cnt)


def _launch_triton(q, k, video_start, keep, block_q, block_k, video_only, sub=SUB):
    """The router in the two Triton kernels (the module docstring's runtime)."""
    B, H, D, Rq, S, M, N = _shape(q, k, block_q, block_k)
    nqs, nks = block_q // sub, block_k // sub
    qm, _, _ = _pooled(q, min(Rq, S), block_q, sub)
    km, _, _ = _pooled(k, S, block_k, sub)
    scores = torch.empty((B, H, M, N), dtype=torch.float32, device=q.device)
    tq, tk = max(1, TILE // nqs), max(1, TILE // nks)
    chunk = CHUNK_D if D % CHUNK_D == 0 else 16
    _scores_kernel[(B * H, triton.cdiv(M, tq), triton.cdiv(N, tk))](
        qm, km, scores, H, M, N, -(-min(Rq, S) // sub), -(-S // sub), qm.stride(0), qm.stride(1), qm.stride(2),
        km.stride(0), km.stride(1), km.stride(2), math.sqrt(D), D=D, CHUNK=chunk, NQS=nqs, NKS=nks, TQ=tq,
        TK=tk, **LAUNCH_OPTS)
    cnt = torch.empty((B, H, M), dtype=torch.int32, device=q.device)
    idx = torch.empty((B, H, M, N), dtype=torch.int32, device=q.device)
    vs = video_start.reshape(1).to(device=q.device, dtype=torch.int64)
    _select_kernel[(B * H * M,)](scores, cnt, idx, vs, M, N, keep_blocks(keep, N), block_q, block_k,
                                 VIDEO_ONLY=bool(video_only), BLOCK_N=triton.next_power_of_2(N), **LAUNCH_OPTS)
    return cnt, idx


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _launch(q, k, video_start, keep, block_q, block_k, video_only):
    if q.is_cuda and _pow2(block_q // SUB) and _pow2(block_k // SUB):
        return _launch_triton(q, k, video_start, keep, block_q, block_k, video_only)
    return _launch_torch(q, k, video_start, keep, block_q, block_k, video_only)


def _fake(q, k, video_start, keep, block_q, block_k, video_only):
    B, H, _, _, _, M, N = _shape(q, k, block_q, block_k)
    return (q.new_empty((B, H, M), dtype=torch.int32), q.new_empty((B, H, M, N), dtype=torch.int32))


@custom_op("block_router", fake=_fake)
def _block_router_op(q: torch.Tensor, k: torch.Tensor, video_start: torch.Tensor, keep: float, block_q: int,
                     block_k: int, video_only: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(q, k, video_start, keep, block_q, block_k, video_only)


def block_router(q, k, video_start, keep: float, *, block_q: int = 128, block_k: int = 128, video_only: bool = True):
    """(full_block_cnt, full_block_idx) for FA4's block-sparse forward; ValueError on inputs the check refuses."""
    reason = block_router_check(q, k, video_start, keep, block_q, block_k)
    if reason is not None:
        raise ValueError(reason)
    return torch.ops.h3plan.block_router(q, k, video_start, float(keep), int(block_q), int(block_k), bool(video_only))


def block_router_torch(q, k, video_start, keep: float, *, block_q: int = 128, block_k: int = 128,
                       video_only: bool = True):
    """The router in torch ops (no Triton): the CPU path without the interpreter, and the bench's comparison."""
    reason = block_router_check(q, k, video_start, keep, block_q, block_k)
    if reason is not None:
        raise ValueError(reason)
    return _launch_torch(q, k, video_start, float(keep), int(block_q), int(block_k), bool(video_only))


# ---------------------------------------------------------------------------------------------- reference

def _pooled_ref(x, valid: int, block: int, sub: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(means (B, H, nblocks, nsub, D) fp32, sub-block has a valid row (nblocks, nsub))."""
    B, R, H, D = x.shape
    nb = -(-R // block)
    xf = torch.zeros((B, nb * block, H, D), dtype=torch.float32, device=x.device)
    xf[:, :valid] = x[:, :valid].float()
    rows = torch.arange(nb * block, device=x.device)
    n = (rows < valid).float().view(nb, block // sub, sub).sum(-1)
    means = xf.view(B, nb, block // sub, sub, H, D).sum(3) / n.clamp(min=1.0)[None, :, :, None, None]
    return means.permute(0, 3, 1, 2, 4), n > 0


def block_scores_ref(q, k, block_q: int = 128, block_k: int = 128, sub: int = SUB) -> torch.Tensor:
    """The sub-block log-sum-exp scores (B, H, M, N) fp32."""
    S, D = k.shape[1], q.shape[-1]
    qm, qv = _pooled_ref(q, min(q.shape[1], S), block_q, sub)
    km, kv = _pooled_ref(k, S, block_k, sub)
    x = torch.einsum("bhiad,bhjcd->bhijac", qm, km) / math.sqrt(D)
    ok = qv[:, None, :, None] & kv[None, :, None, :]  # (M, N, a, c)
    x = torch.where(ok, x, torch.tensor(float("-inf")))
    return torch.logsumexp(x.flatten(-2), dim=-1)


def block_mask_ref(q, k, video_start: int, keep: float, *, block_q: int = 128, block_k: int = 128,
                   video_only: bool = True, sub: int = SUB) -> torch.Tensor:
    """The kept blocks (B, H, M, N) bool, by the rules of the module docstring."""
    scores = block_scores_ref(q, k, block_q, block_k, sub)
    B, H, M, N = scores.shape
    i, j = torch.arange(M)[:, None], torch.arange(N)[None, :]
    forced = (j * block_k < video_start) | ((j * block_k < (i + 1) * block_q) & ((j + 1) * block_k > i * block_q))
    start = video_start if video_only else 0
    kb = keep_blocks(keep, N)
    routed = (torch.arange(M) * block_q >= start) & (kb < N)
    out = torch.ones((B, H, M, N), dtype=torch.bool)
    for r in torch.nonzero(routed).flatten().tolist():
        f = forced[r]
        need = max(kb - int(f.sum()), 0)
        cand = torch.nonzero(~f).flatten()
        s = scores[:, :, r, cand].cpu()
        order = torch.sort(-s, dim=-1, stable=True).indices[..., :need]  # ties: the lower block index first
        row = f.expand(B, H, N).clone()
        row.scatter_(-1, cand[order], True)
        out[:, :, r] = row
    return out.to(q.device)


def mask_to_blocks(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A (B, H, M, N) bool block mask as FA4's (full_block_cnt, full_block_idx): ascending, then zeros. Each kept
    block's slot is its rank among the kept (a running count), so one scan and one scatter write the list: no sort
    (the dropped blocks all land in a spare column past N, cut off)."""
    N = mask.shape[-1]
    cnt = mask.sum(-1, dtype=torch.int32)
    slot = torch.where(mask, torch.cumsum(mask, -1) - 1, N)
    cols = torch.arange(N, dtype=torch.int32, device=mask.device).expand(mask.shape)
    idx = torch.zeros((*mask.shape[:-1], N + 1), dtype=torch.int32, device=mask.device)
    return cnt, idx.scatter_(-1, slot, cols)[..., :N]


def blocks_to_mask(cnt: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """(full_block_cnt, full_block_idx) -> the (B, H, M, N) bool block mask they list."""
    N = idx.shape[-1]
    listed = torch.arange(N, device=idx.device) < cnt[..., None].long()
    out = torch.zeros((*idx.shape[:-1], N + 1), dtype=torch.bool, device=idx.device)
    return out.scatter_(-1, torch.where(listed, idx.long(), N), True)[..., :N]


def block_router_ref(q, k, video_start, keep: float, *, block_q: int = 128, block_k: int = 128,
                     video_only: bool = True):
    """The router in torch: (full_block_cnt, full_block_idx), the kernels' oracle and fallback."""
    vs = int(video_start.reshape(-1)[0]) if isinstance(video_start, torch.Tensor) else int(video_start)
    return mask_to_blocks(block_mask_ref(q, k, vs, keep, block_q=block_q, block_k=block_k, video_only=video_only))


# the kernel ops of this module a lever names (SPEC.kernels): op -> (function, its check), read by table.py
OPS = {"block_router": ("block_router", "block_router_check")}


__all__ = ["SUB", "block_router", "block_router_check", "block_router_torch", "block_router_ref", "block_mask_ref",
           "block_scores_ref",
           "keep_blocks", "mask_to_blocks", "blocks_to_mask"]
