"""Ring attention, and ring x Ulysses, for MiniMax-H3 (non-causal, unmasked, one packed sequence).

Ulysses is bounded by the 56 heads (degrees 1, 2, 4, 7, 8, 14, 28, 56) and its all-to-alls want
NVLink, so past one node the sequence is also split into R ring blocks: each rank keeps its query
rows and the key/value blocks travel around the ring (ring_plan.py: mesh, bytes, overlap).

API::

    ring = RingAttention(group, attn=attention_with_lse)
    o = ring(q, k, v, seq_len=S)      # q, k, v: (B, L, h, D), this rank's block of the ring sequence
    # o: (B, L, h, D) in q's dtype (out_dtype=... to change); rows of the block past S are garbage

    ring_g, uly_g = ring_ulysses_groups(R, U)          # every rank of the default group calls it
    ru = RingUlysses(ring_g, uly_g, attn=...)
    o = ru(q, k, v, seq_len=S)        # q, k, v: (B, S_loc, H, D), world shard rows (S_loc = ceil(S/(R*U)))
    # o: (B, S_loc, H*D), this rank's rows; padding rows zero (the UlyssesAttention contract)

RingAttention: ring rank i holds rows i*L .. (i+1)*L-1 of a sequence padded to R*L rows, of which
the first `seq_len` are valid (padding only at the tail). Step t = 0 .. R-1 attends the local queries
to the key/value block of ring rank (i - t) mod R, trimmed to that block's valid rows (padded keys
never enter a softmax; a block with none is skipped), and merges (out, lse) in fp32 (lse.LseMerge).
Rotation: torch.distributed.batch_isend_irecv, K and V to rank i+1 and from rank i-1, issued before
step t's attention and waited after it, so each transfer runs under one block attention (two spare
K/V buffers, alternating). An all_gather of all blocks moves the same bytes but can only hide behind
the first block and holds all R blocks; ring_plan.py compares the two.

Block attention `attn(q, k, v) -> (out, lse)` (contract in lse.py): `attention_with_lse` (torch, fp32,
the CPU path and oracle), or lse.LSE_BACKENDS "sdpa_flash" / "sdpa_cudnn" / "fa4" on CUDA;
`pick_lse_backend(q)` picks the first that runs. Hook for the lead: any callable with that contract,
e.g. a method on h3plan.facts.attention's FA4Backend that calls flash_attn_func(..., return_lse=True) under
its 2-CTA switch / tile, or cuDNN with generate_stats=True.

Numerics: not bitwise equal to single-GPU attention (summation order; one bf16 rounding per block
when the block output is bf16): see ring_plan.NUMERICS and tests/parallel/test_ring.py.

RingUlysses: a 2-D mesh (ring_plan.mesh_ranks). Within each Ulysses group UlyssesAttention runs its
head exchange over the group's L = U*S_loc rows with padding="none" (the rows are a full ring block;
padding is handled by the ring's valid key counts) and its attn_fn is this ring over the ring group:
pre all-to-all (Ulysses group) -> R ring steps over H/U heads (ring group) -> post all-to-all. Ulysses
head chunks (`chunks` > 1) run one ring pass per chunk, with the next chunk's all-to-all in flight on
the Ulysses communicator while the ring's P2P runs on the ring communicator (same order on every
rank). UlyssesAttention itself is unchanged: the ring enters only as its attn_fn.

Guards (UsageError, one line, on every rank before any communication): shapes, dtypes (floating point,
not FP8), devices, seq_len against the block rows, the group backend against the device. Tested over
gloo on the CPU (tests/parallel/test_ring.py); the NCCL path is the same code, its GPU tests are
tests/gpu/test_ring_nccl.py. Not under torch.compile (P2P ops and Python-side counters).
"""

from __future__ import annotations

import inspect
from collections import Counter

import torch
import torch.distributed as dist

from h3plan.errors import UsageError

from .comm import backend_name, check_qkv, degree_rank, device_reason, wire
from .lse import LseMerge, attention_with_lse, check_lse_result
from h3plan.facts.ring_plan import degree_reasons, mesh_ranks
from h3plan.facts.sizes import shard_len, valid_rows
from .ulysses import UlyssesAttention

_GROUP_PEER = "group_peer" in inspect.signature(dist.P2POp.__init__).parameters


def block_valid(seq_len: int, L: int, R: int) -> list[int]:
    """Valid rows of each ring block of L rows: clamp(S - j*L, 0, L)."""
    return [max(0, min(seq_len - j * L, L)) for j in range(R)]


def _p2p(op, t, group, peer):
    if _GROUP_PEER:
        return dist.P2POp(op, t, group=group, group_peer=peer)
    return dist.P2POp(op, t, peer=dist.get_global_rank(group, peer), group=group)


class RingAttention:
    """Ring attention over a process group; see the module docstring for the contract.

    After each call `last_bytes` holds the bytes this rank sent; `stats` counts calls, rotations and
    block attentions (skipped empty blocks too); set `trace = []` to record the order of rotations
    (`send{t}`), block attentions (`attn{t}`) and waits (`wait{t}`).
    """

    def __init__(self, group, attn=attention_with_lse, *, out_dtype: torch.dtype | None = None):
        if not callable(attn):
            raise UsageError(f"attn must be a callable (q, k, v) -> (out, lse), got {type(attn).__name__}")
        self.group = group
        self.degree, self.rank = degree_rank(group)
        self.attn = attn
        self.out_dtype = out_dtype
        self.stats: Counter = Counter()
        self.last_bytes = 0
        self.trace: list | None = None

    def _check(self, q, k, v, seq_len):
        check_qkv(q, k, v, "(B, L, h, D)", UsageError)
        if not q.dtype.is_floating_point or torch.finfo(q.dtype).bits == 8:
            raise UsageError(f"ring attention takes bf16/fp16/fp32 q/k/v, got {q.dtype}")
        L = q.shape[1]
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= self.degree * L:
            raise UsageError(f"seq_len must be an int in [1, R*L = {self.degree * L}], got {seq_len!r}")
        if self.degree > 1:
            reason = device_reason(self.group, q.device)
            if reason:
                raise UsageError(reason.replace("Ulysses", "ring"))

    def _rotate(self, k, v, k_in, v_in, t):
        R, i = self.degree, self.rank
        nxt, prv = (i + 1) % R, (i - 1) % R
        ops = [_p2p(dist.isend, wire(k), self.group, nxt), _p2p(dist.isend, wire(v), self.group, nxt),
               _p2p(dist.irecv, wire(k_in), self.group, prv), _p2p(dist.irecv, wire(v_in), self.group, prv)]
        self.stats["rotations"] += 1
        if self.trace is not None:
            self.trace.append(f"send{t}")
        return dist.batch_isend_irecv(ops)

    def __call__(self, q, k, v, *, seq_len: int, out: torch.Tensor | None = None) -> torch.Tensor:
        self._check(q, k, v, seq_len)
        R, i = self.degree, self.rank
        L = q.shape[1]
        valid = block_valid(seq_len, L, R)
        self.stats["calls"] += 1
        merge = LseMerge()
        k_cur, v_cur = k.contiguous(), v.contiguous()
        spare = [(torch.empty_like(k_cur), torch.empty_like(v_cur)) for _ in range(min(2, R - 1))]
        sent = 0
        for t in range(R):
            works = None
            if t < R - 1:
                k_in, v_in = spare[t % 2]
                works = self._rotate(k_cur, v_cur, k_in, v_in, t)
                sent += k_cur.numel() * k_cur.element_size() + v_cur.numel() * v_cur.element_size()
            n = valid[(i - t) % R]
            try:
                if n:
                    if self.trace is not None:
                        self.trace.append(f"attn{t}")
                    o, lse = self.attn(q, k_cur[:, :n], v_cur[:, :n])
                    check_lse_result(o, lse, q, n)
                    merge.add(o, lse)
                    self.stats["blocks"] += 1
                else:
                    self.stats["blocks_empty"] += 1
            finally:  # a failing block function still lets the transfer in flight finish
                for w in works or ():
                    w.wait()
            if works is not None:
                if self.trace is not None:
                    self.trace.append(f"wait{t}")
                k_cur, v_cur = k_in, v_in
        self.last_bytes = sent
        return merge.result(self.out_dtype or q.dtype, out)

    def __repr__(self):
        be = backend_name(self.group) if self.degree > 1 else "local"
        attn = getattr(self.attn, "__name__", self.attn)
        return f"RingAttention(degree={self.degree}, rank={self.rank}, backend={be}, attn={attn})"


def ring_ulysses_groups(ring: int, ulysses: int, *, backend: str | None = None, timeout=None):
    """(ring group, Ulysses group) of this rank in the (ring, ulysses) mesh over the default group.

    Collective: every rank of the default group must call it (dist.new_group). World rank
    g = r*U + u (ring_plan.mesh_ranks), so Ulysses groups are consecutive ranks (one node).
    """
    world = dist.get_world_size()
    reasons = degree_reasons(world, ring, ulysses, heads=None)  # heads: checked per call
    if reasons:
        raise UsageError("; ".join(reasons))
    me = dist.get_rank()
    rings, ulys = mesh_ranks(ring, ulysses)
    mine = {}
    kw = {"backend": backend} if backend else {}
    if timeout is not None:
        kw["timeout"] = timeout
    for kind, groups in (("ring", rings), ("ulysses", ulys)):
        for ranks in groups:
            g = dist.new_group(ranks, **kw)
            if me in ranks:
                mine[kind] = g
    return mine["ring"], mine["ulysses"]


class RingUlysses:
    """Ulysses inside each ring block, ring across blocks; see the module docstring.

    `last_bytes` = {"pre", "post", "ring"} bytes this rank sent in the last call; `stats` merges the
    ring's and Ulysses' counters.
    """

    def __init__(self, ring_group, ulysses_group, attn=attention_with_lse, *, chunks: int = 1):
        self.ring = RingAttention(ring_group, attn)
        U, u = degree_rank(ulysses_group)
        self.ulysses = UlyssesAttention(ulysses_group, chunks=chunks, padding="none") if U > 1 else None
        self.ring_degree, self.ulysses_degree = self.ring.degree, U
        self.world_rank = self.ring.rank * U + u
        self.last_bytes = {"pre": 0, "post": 0, "ring": 0}

    @property
    def stats(self) -> Counter:
        return self.ring.stats + (self.ulysses.stats if self.ulysses is not None else Counter())

    def __call__(self, q, k, v, *, seq_len: int, packed=None) -> torch.Tensor:
        R, U = self.ring_degree, self.ulysses_degree
        if packed is not None and U == 1:
            if not isinstance(packed, torch.Tensor) or packed.dim() != 6 or packed.shape[:2] != (1, 3):
                raise UsageError("packed must be (1, 3, B, S_loc, H, D) at Ulysses degree 1")
            q, k, v, packed = packed[0, 0], packed[0, 1], packed[0, 2], None
        if packed is not None:
            if not isinstance(packed, torch.Tensor) or packed.dim() != 6:
                raise UsageError("packed must be a 6-dim (U, 3, B, S_loc, H/U, D) tensor")
            B, S_loc, H, D = packed.shape[2], packed.shape[3], packed.shape[0] * packed.shape[4], packed.shape[5]
        elif isinstance(q, torch.Tensor) and q.dim() == 4:
            B, S_loc, H, D = q.shape
        else:
            raise UsageError("q must be a 4-dim (B, S_loc, H, D) tensor (or pass packed)")
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise UsageError(f"seq_len must be a positive int, got {seq_len!r}")
        if shard_len(seq_len, R * U) != S_loc:
            raise UsageError(f"seq_len={seq_len} needs ceil(S/(R*U))={shard_len(seq_len, R * U)} rows per rank at "
                             f"ring {R} x ulysses {U}, got S_loc={S_loc}")
        ring_bytes = [0]

        def ring_fn(qq, kk, vv):
            o = self.ring(qq, kk, vv, seq_len=seq_len)
            ring_bytes[0] += self.ring.last_bytes
            return o

        if self.ulysses is None:
            o = ring_fn(q, k, v).reshape(B, S_loc, H * D)
            pre = post = 0
        else:
            o = self.ulysses(q, k, v, ring_fn, seq_len=U * S_loc, packed=packed)
            pre, post = self.ulysses.last_bytes["pre"], self.ulysses.last_bytes["post"]
        vr = valid_rows(seq_len, R * U, self.world_rank)
        if vr < S_loc:
            o[:, vr:] = 0
        self.last_bytes = {"pre": pre, "post": post, "ring": ring_bytes[0]}
        return o

    def __repr__(self):
        return (f"RingUlysses(ring={self.ring_degree}, ulysses={self.ulysses_degree}, world_rank={self.world_rank}, "
                f"attn={getattr(self.ring.attn, '__name__', self.ring.attn)})")


__all__ = ["RingAttention", "RingUlysses", "ring_ulysses_groups", "block_valid"]
