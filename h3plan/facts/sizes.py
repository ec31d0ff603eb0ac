"""Ulysses sizes and traffic, torch-free so the planner and the CLI can use them.

Row sharding: the packed sequence of S rows is padded at the tail to U * S_loc rows, S_loc = ceil(S/U),
and rank r holds rows r*S_loc .. (r+1)*S_loc - 1. Padding is fewer than U rows and only the last
rank(s) hold any; a rank may hold none but padding (S=5, U=4: rank 3).
"""

from __future__ import annotations


def _positive(name: str, n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a positive int, got {n!r}")
    return n


def shard_len(S: int, U: int) -> int:
    """Rows per rank, S_loc = ceil(S / U)."""
    return -(-_positive("S", S) // _positive("U", U))


def padded_len(S: int, U: int) -> int:
    """Length of the padded sequence, U * ceil(S / U)."""
    return U * shard_len(S, U)


def valid_rows(S: int, U: int, rank: int) -> int:
    """Valid (non-padding) rows held by `rank`: clamp(S - rank*S_loc, 0, S_loc)."""
    if not 0 <= rank < _positive("U", U):
        raise ValueError(f"rank {rank} outside the group of size {U}")
    S_loc = shard_len(S, U)
    return max(0, min(S - rank * S_loc, S_loc))


def a2a_bytes(B: int, S_loc: int, H: int, D: int, elem_bytes: int, U: int) -> int:
    """Bytes one rank sends to the other ranks in one all-to-all of one (B, S_loc, H, D) tensor.

    (U-1)/U * B*S_loc*H*D*elem_bytes: the rank keeps its own head group (pre-attention) or its own
    row block (post-attention) and sends the other U-1 equal parts. Integer because H % U == 0.
    The pre-attention exchange moves q, k and v (3 tensors), the post-attention one the output (1).
    `valid_only` sends fewer post-attention bytes (only valid rows; see UlyssesAttention.last_bytes).
    FP8 codes: q/k/v at 1 byte instead of 2 halve the pre-attention exchange; with a bf16 attention
    output a layer moves (3*1 + 2) / (3*2 + 2) = 5/8 of the bf16 bytes (37.5% fewer), with an FP8
    output (cuDNN FP8 on Hopper) 4/8 (50% fewer).
    """
    for name, n in (("B", B), ("S_loc", S_loc), ("H", H), ("D", D), ("elem_bytes", elem_bytes), ("U", U)):
        _positive(name, n)
    if H % U:
        raise ValueError(f"heads H={H} not divisible by the Ulysses degree U={U}")
    return (U - 1) * B * S_loc * (H // U) * D * elem_bytes
