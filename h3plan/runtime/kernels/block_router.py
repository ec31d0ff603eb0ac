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
the forced ones are fewer) with the best-scoring others: higher score first, ties to the lower block index (an
order-preserving int32 key of the fp32 score, a bisection for the k-th largest, the ties by a prefix count), so the
choice is deterministic. FA4's SM90 forward processes a row's blocks from the last listed to the first and masks
the key tail (S % block_k) only on the first it processes, so the list is ascending: a kept tail block comes first.

`video_start` is a device int tensor (one element), so a call never syncs with the host.

Kernels: `_pool` (means), `_score` (tl.dot in IEEE fp32 over 16 query blocks x 64 key blocks per step), `_select`
(one program per (b, h, i)). `block_router_ref` is the same arithmetic in torch (the oracle; tie order and the
selection are identical, the scores agree to fp32 rounding). Fallback: the caller runs `block_router_ref`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from h3plan.runtime.kernels._common import INTERPRET, guard, next_pow2, to_f32
from h3plan.runtime.kernels._registry import custom_op

SUB = 32  # rows per pooled sub-block
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_TQ, _TK = 16, 64  # query blocks, key blocks per _score step (tl.dot needs 16 rows at least)
_NEG = tl.constexpr(-1.0e30)  # a finite "no score": no NaN from (-inf) - (-inf)


@triton.jit
def _pool(x_ptr, out_ptr, valid, H, NSUB_BLOCK, NBLOCKS, D, sb, ss, sh,
          SUB: tl.constexpr, BLOCK_D: tl.constexpr, HW: tl.constexpr):
    # out (B, H, NSUB_BLOCK, NBLOCKS, D) fp32: sub-block a of block j at [.., a, j, :]
    bh = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1).to(tl.int64)  # global sub-block: block s // NSUB_BLOCK, sub s % NSUB_BLOCK
    b, h = bh // H, bh % H
    rows = s * SUB + tl.arange(0, SUB).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    m = (rows < valid)[:, None] & (d < D)[None, :]
    x = to_f32(tl.load(x_ptr + b * sb + rows[:, None] * ss + h * sh + d[None, :], mask=m, other=0.0), HW)
    n = tl.sum((rows < valid).to(tl.float32), axis=0)
    mean = tl.sum(x, axis=0) / tl.maximum(n, 1.0)
    j, a = s // NSUB_BLOCK, s % NSUB_BLOCK
    tl.store(out_ptr + ((bh * NSUB_BLOCK + a) * NBLOCKS + j) * D + d, mean, mask=d < D)


@triton.jit
def _score(qp_ptr, kp_ptr, out_ptr, q_valid, k_valid, M, N, D, scale,
           NQS: tl.constexpr, NKS: tl.constexpr, SUB: tl.constexpr, TQ: tl.constexpr, TK: tl.constexpr,
           BLOCK_D: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1).to(tl.int64) * TQ + tl.arange(0, TQ).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    for j0 in range(0, N, TK):
        j = j0 + tl.arange(0, TK).to(tl.int64)
        mx = tl.full((TQ, TK), _NEG, tl.float32)
        acc = tl.zeros((TQ, TK), tl.float32)
        for a in tl.static_range(NQS):
            qa = tl.load(qp_ptr + ((bh * NQS + a) * M + i[:, None]) * D + d[None, :],
                         mask=(i < M)[:, None] & dm[None, :], other=0.0)
            qv = (i * NQS + a) * SUB < q_valid
            for c in tl.static_range(NKS):
                kc = tl.load(kp_ptr + ((bh * NKS + c) * N + j[:, None]) * D + d[None, :],
                             mask=(j < N)[:, None] & dm[None, :], other=0.0)
                kv = (j * NKS + c) * SUB < k_valid
                x = tl.dot(qa, tl.trans(kc), input_precision="ieee") * scale
                ok = qv[:, None] & kv[None, :]
                x = tl.where(ok, x, _NEG)
                m_new = tl.maximum(mx, x)
                acc = acc * tl.exp(mx - m_new) + tl.where(ok, tl.exp(x - m_new), 0.0)
                mx = m_new
        lse = mx + tl.log(tl.maximum(acc, 1e-38))
        tl.store(out_ptr + (bh * M + i[:, None]) * N + j[None, :], lse, mask=(i < M)[:, None] & (j < N)[None, :])


@triton.jit
def _select(score_ptr, cnt_ptr, idx_ptr, vs_ptr, M, N, BQ, BK, keep_blocks, video_only,
            NP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # (b * H + h) * M + i
    i = row % M
    vs = tl.load(vs_ptr).to(tl.int64)
    j = tl.arange(0, NP).to(tl.int64)
    valid = j < N
    q_lo, q_hi = i * BQ, (i + 1) * BQ
    forced = valid & ((j * BK < vs) | ((j * BK < q_hi) & ((j + 1) * BK > q_lo)))
    start = tl.where(video_only != 0, vs, 0)
    routed = (q_lo >= start) & (keep_blocks < N)
    cand = valid & (forced == 0)
    n_forced = tl.sum(forced.to(tl.int32), axis=0)
    need = tl.maximum(keep_blocks - n_forced, 0)
    s = tl.load(score_ptr + row * N + j, mask=valid, other=0.0)
    bits = s.to(tl.int32, bitcast=True)
    key = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)  # orders as the fp32 scores do
    lo = tl.full((), -2147483649, tl.int64)  # count(key >= lo) = every candidate >= need
    hi = tl.full((), 2147483648, tl.int64)  # count(key >= hi) = 0 < need
    for _ in range(33):
        mid = (lo + hi) >> 1
        c = tl.sum(((key >= mid) & cand).to(tl.int32), axis=0)
        lo = tl.where(c >= need, mid, lo)
        hi = tl.where(c >= need, hi, mid)
    gt = cand & (key > lo)
    eq = cand & (key == lo)
    rank = tl.cumsum(eq.to(tl.int32), axis=0)
    chosen = (gt | (eq & (rank <= need - tl.sum(gt.to(tl.int32), axis=0)))) & (need > 0)
    kept = tl.where(routed, forced | chosen, valid)
    k32 = kept.to(tl.int32)
    pos = tl.cumsum(k32, axis=0) - 1
    tl.store(cnt_ptr + row, tl.sum(k32, axis=0))
    tl.store(idx_ptr + row * N + pos, j.to(tl.int32), mask=k32 != 0)


def keep_blocks(keep: float, n: int) -> int:
    """Key blocks a routed query block keeps of n (the forced ones included, when fewer): ceil(keep * n), >= 1."""
    return min(n, max(1, math.ceil(keep * n - 1e-9)))


def _shape(q, k, block_q, block_k):
    B, Rq, H, D = q.shape
    S = k.shape[1]
    return B, H, D, Rq, S, -(-Rq // block_q), -(-S // block_k)


def block_router_check(q, k, video_start, keep: float, block_q: int = 128, block_k: int = 128, sub: int = SUB) -> str | None:
    """None if the kernels take these inputs, else the one-line reason."""
    def checks():
        for name, t in (("q", q), ("k", k)):
            yield isinstance(t, torch.Tensor) and t.dim() == 4, f"{name} must be a 4-dim (B, S, H, D) tensor"
            yield t.dtype in DTYPES, f"{name} dtype {t.dtype} not in bf16/fp16/fp32"
            yield t.device.type == "cuda" or INTERPRET, f"{name} is on {t.device.type}; Triton needs CUDA (or TRITON_INTERPRET=1)"
            yield t.stride(-1) == 1, f"{name}'s head dim is not contiguous"
        yield (q.shape[0], q.shape[2], q.shape[3]) == (k.shape[0], k.shape[2], k.shape[3]), (
            f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in B, H or D")
        yield q.shape[-1] % 16 == 0 and q.shape[-1] <= 256, f"head_dim {q.shape[-1]} must be a multiple of 16, <= 256"
        yield isinstance(video_start, torch.Tensor) and video_start.numel() == 1 and video_start.device == q.device, (
            "video_start must be a one-element tensor on q's device")
        yield 0.0 < keep <= 1.0, f"keep {keep} must be in (0, 1]"
        yield sub > 0 and block_q % sub == 0 and block_k % sub == 0, f"blocks {block_q}x{block_k} are no multiple of {sub}"
        yield -(-k.shape[1] // block_k) <= 8192, f"{k.shape[1]} keys are over 8192 key blocks"
    return guard(checks())


def _launch(q, k, video_start, keep, block_q, block_k, video_only, sub=SUB):
    B, H, D, Rq, S, M, N = _shape(q, k, block_q, block_k)
    dev = q.device
    nqs, nks, bd = block_q // sub, block_k // sub, next_pow2(D)
    qp = torch.empty((B, H, nqs, M, D), dtype=torch.float32, device=dev)
    kp = torch.empty((B, H, nks, N, D), dtype=torch.float32, device=dev)
    q_valid = min(Rq, S)
    _pool[(B * H, M * nqs)](q, qp, q_valid, H, nqs, M, D, q.stride(0), q.stride(1), q.stride(2),
                            SUB=sub, BLOCK_D=bd, HW=not INTERPRET)
    _pool[(B * H, N * nks)](k, kp, S, H, nks, N, D, k.stride(0), k.stride(1), k.stride(2),
                            SUB=sub, BLOCK_D=bd, HW=not INTERPRET)
    scores = torch.empty((B, H, M, N), dtype=torch.float32, device=dev)
    _score[(B * H, triton.cdiv(M, _TQ))](qp, kp, scores, q_valid, S, M, N, D, 1.0 / math.sqrt(D),
                                          NQS=nqs, NKS=nks, SUB=sub, TQ=_TQ, TK=_TK, BLOCK_D=bd, num_warps=4)
    cnt = torch.empty((B, H, M), dtype=torch.int32, device=dev)
    idx = torch.zeros((B, H, M, N), dtype=torch.int32, device=dev)
    vs = video_start.reshape(1).to(torch.int64)
    _select[(B * H * M,)](scores, cnt, idx, vs, M, N, block_q, block_k, keep_blocks(keep, N), int(video_only),
                          NP=next_pow2(max(N, 16)), num_warps=4)
    return cnt, idx


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
    """A (B, H, M, N) bool block mask as FA4's (full_block_cnt, full_block_idx): ascending, then zeros."""
    N = mask.shape[-1]
    cnt = mask.sum(-1).to(torch.int32)
    order = torch.sort((~mask).long() * N + torch.arange(N, device=mask.device), dim=-1).values % N
    idx = torch.where(torch.arange(N, device=mask.device) < cnt[..., None], order, 0).to(torch.int32)
    return cnt, idx


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


__all__ = ["SUB", "block_router", "block_router_check", "block_router_ref", "block_mask_ref", "block_scores_ref",
           "keep_blocks", "mask_to_blocks", "blocks_to_mask"]
