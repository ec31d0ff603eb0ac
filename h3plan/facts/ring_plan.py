"""Planning ring x Ulysses attention, torch-free: degree rules, the mesh, bytes, overlap, numerics.

A world of R*U ranks is a 2-D mesh (ring, ulysses) with the Ulysses index fastest: world rank
g = r*U + u. Ulysses group r = ranks r*U .. r*U+U-1 (consecutive ranks: one node, NVLink, where the
all-to-alls run); ring group u = ranks u, U+u, 2U+u, ... (one rank per Ulysses group: across nodes,
GPU u of every node, the same NIC rail). The sequence is sharded over the whole world as for
Ulysses (sizes.py): rank g holds rows g*S_loc .. (g+1)*S_loc-1, S_loc = ceil(S/(R*U)), so Ulysses
group r holds the contiguous ring block of L = U*S_loc rows, r*L .. (r+1)*L-1.

Per attention call a rank sends (bf16 unless noted):
- Ulysses (U > 1), inside its Ulysses group: q, k, v before and the output after, (U-1)/U of each
  (B, S_loc, H, D) tensor (sizes.a2a_bytes): 4 * (U-1) * B*S_loc*(H/U)*D*2.
- Ring (R > 1), to its ring neighbour: its current K and V block, (B, L, H/U, D) each, R-1 times:
  (R-1) * 2 * B*L*(H/U)*D*2. Every rank sends and receives one block per step.

Overlap: P2P (what ring.py does): step t's transfer runs while step t computes the attention of the
block it holds, so each of the R-1 transfers hides behind one block attention:
exposed = (R-1) * max(0, t_transfer - t_block). An async all_gather of every block (diffusers' rotate
method) moves the same bytes but can hide only behind the local block: max(0, (R-1)*t_transfer - t_block),
and holds all R blocks. The two agree at R = 2; P2P wins from R = 3 on.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Mapping

from .sizes import a2a_bytes, padded_len, shard_len

HEADS = 56  # MiniMax-H3: 56 heads x 128 head_dim

NUMERICS = (
    "ring > 1 is not bitwise equal to one GPU: each key block's softmax is merged in fp32 through its "
    "log-sum-exp (online-softmax rescaling), a different summation order than one kernel. fp32 block outputs "
    "(the reference): relative error ~5e-7 (bound 1e-6); cast to bf16 the two differ by at most one bf16 ulp "
    "per element. bf16 block outputs (FA4, SDPA, cuDNN) are rounded once per block before the merge: per element "
    "|ring - one GPU| <= 2^-8 * (2|o| + sum_t w_t |o_t|) beyond the kernels' own error (2^-8: the bf16 unit "
    "roundoff; w_t: the merge weights); "
    "measured 2.7e-3 relative (Frobenius) on random data at ring 2..5, the size of the gap between two attention "
    "kernels (FA4 vs SDPA: 3e-3). Ulysses inside each ring block stays exact."
)


def _positive(name, n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a positive int, got {n!r}")
    return n


PRESET_NAME = re.compile(r"(?:r(\d+))?u(\d+)")
"""How a parallel preset's name spells its mesh: r<ring>u<ulysses>, or u<ulysses> without a ring."""


def ring_degree(parallel: Mapping) -> int:
    """The ring degree a `parallel` section sets (1 where it sets none: no ring)."""
    return parallel.get("ring") or 1


def world_size(parallel: Mapping) -> int:
    """The ranks of a `parallel` section's mesh: ring x Ulysses."""
    return ring_degree(parallel) * (parallel.get("ulysses") or 1)


def preset_degrees(name: str) -> dict[str, int] | None:
    """{parallel field: degree} that a preset's name gives (PRESET_NAME), or None for a name that gives none."""
    m = PRESET_NAME.fullmatch(name)
    return None if m is None else {"ring": int(m.group(1) or 1), "ulysses": int(m.group(2))}


def degree_reasons(world: int, ring: int, ulysses: int, heads: int | None = HEADS,
                   gpus_per_node: int | None = None) -> list[str]:
    """Why (ring, ulysses) cannot run on `world` ranks; empty when it can (heads=None: not checked)."""
    out = []
    for name, n in (("world", world), ("ring", ring), ("ulysses", ulysses)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            out.append(f"{name} must be a positive int, got {n!r}")
    if out:
        return out
    if ring * ulysses != world:
        out.append(f"ring {ring} x ulysses {ulysses} = {ring * ulysses} ranks, but the world has {world}")
    if heads is not None and heads % ulysses:
        out.append(f"ulysses {ulysses} does not divide the {heads} heads")
    if gpus_per_node is not None and ulysses > 1 and gpus_per_node % ulysses:
        out.append(f"a Ulysses group of {ulysses} ranks would span nodes of {gpus_per_node} GPUs "
                   f"(its all-to-alls must stay on NVLink: pick ulysses dividing {gpus_per_node})")
    return out


def mesh_ranks(ring: int, ulysses: int) -> tuple[list[list[int]], list[list[int]]]:
    """(ring groups, Ulysses groups) as lists of world ranks; rank g = r*U + u (see the module docstring)."""
    R, U = _positive("ring", ring), _positive("ulysses", ulysses)
    rings = [[r * U + u for r in range(R)] for u in range(U)]
    ulysses_groups = [[r * U + u for u in range(U)] for r in range(R)]
    return rings, ulysses_groups


def mesh_coords(rank: int, ring: int, ulysses: int) -> tuple[int, int]:
    """(ring rank, Ulysses rank) of world rank `rank`."""
    if not 0 <= rank < ring * ulysses:
        raise ValueError(f"rank {rank} outside a world of {ring} x {ulysses}")
    return divmod(rank, ulysses)


@dataclass(frozen=True)
class RingCost:
    """Per rank, per attention call (one layer). Times are None where their rate was not given."""

    seq_len: int
    ring: int
    ulysses: int
    rows_per_rank: int          # S_loc = ceil(S / (R*U))
    block_rows: int             # L = U * S_loc: rows of one ring block (query and key)
    padded_len: int             # R * L
    heads_per_rank: int         # H / U
    ring_block_bytes: int       # K + V of one block: one ring transfer
    ring_bytes: int             # transfers
    a2a_bytes: int              # Ulysses: q, k, v and the output, the (U-1)/U that leaves the rank
    total_bytes: int
    block_attention_ms: float | None   # one (L x L) block attention over H/U heads
    ring_transfer_ms: float | None     # one block over the ring link
    attention_ms: float | None         # R block attentions
    ring_exposed_ms_p2p: float | None  # (R-1) * max(0, transfer - block)
    ring_exposed_ms_allgather: float | None
    hidden_share: float | None         # share of each ring transfer hidden behind a block attention
    merge_ms: float | None             # the fp32 merges over (B, L, H/U, D), HBM-bound
    a2a_ms: float | None
    total_ms: float | None             # attention + exposed ring + merge + a2a (no a2a overlap)

    def as_dict(self) -> dict:
        return asdict(self)


def ring_ulysses_cost(seq_len: int, *, ring: int, ulysses: int, heads: int = HEADS, head_dim: int = 128,
                      batch: int = 1, elem_bytes: int = 2, attention_tflops: float | None = None,
                      ring_gbps: float | None = None, a2a_gbps: float | None = None,
                      hbm_tbps: float | None = None) -> RingCost:
    """Bytes and time estimates of one ring x Ulysses attention call on one rank.

    attention_tflops: block attention throughput at (L rows, H/U heads), 4*L^2*h*D per block (the
    plan's measured table, e.g. FA4 on the H200 ~700). ring_gbps: GB/s one way between ring neighbours
    (across nodes: the NIC, e.g. one 400 Gb/s ConnectX-7 per GPU = 50). a2a_gbps: Ulysses all-to-all
    GB/s leaving a rank (measured: hardware.measured.ulysses.a2a). hbm_tbps: for the merge.
    """
    for name, n in (("seq_len", seq_len), ("heads", heads), ("head_dim", head_dim), ("batch", batch),
                    ("elem_bytes", elem_bytes)):
        _positive(name, n)
    R, U = _positive("ring", ring), _positive("ulysses", ulysses)
    if heads % U:
        raise ValueError(f"ulysses {U} does not divide the {heads} heads")
    W = R * U
    S_loc = shard_len(seq_len, W)
    L, h, D, B = U * S_loc, heads // U, head_dim, batch
    block = 2 * B * L * h * D * elem_bytes
    ring_bytes = (R - 1) * block
    a2a = 0 if U == 1 else 4 * a2a_bytes(B, S_loc, heads, D, elem_bytes, U)

    def ms(x):
        return None if x is None else round(x * 1e3, 4)

    t_blk = None if attention_tflops is None else 4 * B * L * L * h * D / (attention_tflops * 1e12)
    t_xfer = None if (ring_gbps is None or R == 1) else block / (ring_gbps * 1e9)
    if R == 1:
        exp_p2p, exp_ag, hidden = 0.0, 0.0, None
    elif t_blk is None or t_xfer is None:
        exp_p2p = exp_ag = hidden = None
    else:
        exp_p2p = (R - 1) * max(0.0, t_xfer - t_blk)
        exp_ag = max(0.0, (R - 1) * t_xfer - t_blk)
        hidden = round(min(1.0, t_blk / t_xfer), 4)
    # merge, bytes per element: steps of acc*a (read+write fp32) then acc += o*b (read acc and o,
    # write acc), plus the first block's fp32 copy and the final cast
    per_elem = (R - 1) * (16 + elem_bytes) + 2 * (4 + elem_bytes)
    t_merge = None if hbm_tbps is None else B * L * h * D * per_elem / (hbm_tbps * 1e12)
    t_a2a = 0.0 if U == 1 else (None if a2a_gbps is None else a2a / (a2a_gbps * 1e9))
    t_att = None if t_blk is None else R * t_blk
    parts = [t_att, exp_p2p, t_merge if R > 1 else 0.0, t_a2a]
    total = None if any(p is None for p in parts) else sum(parts)
    return RingCost(
        seq_len=seq_len, ring=R, ulysses=U, rows_per_rank=S_loc, block_rows=L, padded_len=padded_len(seq_len, W),
        heads_per_rank=h, ring_block_bytes=block, ring_bytes=ring_bytes, a2a_bytes=a2a, total_bytes=ring_bytes + a2a,
        block_attention_ms=ms(t_blk), ring_transfer_ms=ms(t_xfer), attention_ms=ms(t_att),
        ring_exposed_ms_p2p=ms(exp_p2p), ring_exposed_ms_allgather=ms(exp_ag), hidden_share=hidden,
        merge_ms=ms(t_merge) if R > 1 else 0.0, a2a_ms=ms(t_a2a), total_ms=ms(total))


def describe(c: RingCost) -> list[str]:
    """The lines a plan prints for `parallel.ring` (what each number is, per rank and attention call)."""

    def mb(n):
        return f"{n / 1e6:.1f} MB"

    def t(x):
        return "n/a (no rate given)" if x is None else f"{x:.3f} ms"

    lines = [f"ring {c.ring} x ulysses {c.ulysses} = {c.ring * c.ulysses} ranks; {c.rows_per_rank:,} rows per rank "
             f"(padded {c.padded_len:,} for {c.seq_len:,}); ring block {c.block_rows:,} rows x "
             f"{c.heads_per_rank} heads"]
    if c.ring > 1:
        lines.append(f"ring: K+V block {mb(c.ring_block_bytes)} sent {c.ring - 1}x = {mb(c.ring_bytes)} per rank; "
                     f"transfer {t(c.ring_transfer_ms)} vs block attention {t(c.block_attention_ms)}"
                     + ("" if c.hidden_share is None else f" ({c.hidden_share:.0%} of each transfer hidden)"))
        lines.append(f"ring exposed: P2P {t(c.ring_exposed_ms_p2p)}, all_gather {t(c.ring_exposed_ms_allgather)}; "
                     f"fp32 merge {t(c.merge_ms)}")
    if c.ulysses > 1:
        lines.append(f"ulysses: all-to-all {mb(c.a2a_bytes)} leaving the rank (q, k, v, out), {t(c.a2a_ms)}")
    lines.append(f"attention call: {t(c.attention_ms)} compute, {t(c.total_ms)} total; {mb(c.total_bytes)} sent")
    if c.ring > 1:
        lines.append("numerics: " + NUMERICS)
    return lines


__all__ = ["HEADS", "NUMERICS", "degree_reasons", "mesh_ranks", "mesh_coords", "RingCost", "ring_ulysses_cost",
           "describe"]
