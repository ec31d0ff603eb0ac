"""Sequence parallelism: Ulysses (all-to-all attention), ring x Ulysses, row sharding.

Each name imports torch on first use; the traffic sizes and the ring's planning math are torch-free
(h3plan/facts/sizes.py, h3plan/facts/ring_plan.py).
"""

_LAZY = {
    "UlyssesAttention": ".ulysses",
    "PADDING_MODES": ".ulysses",
    "shard_rows": ".comm",
    "gather_rows": ".comm",
    "amax_allreduce_hook": ".comm",
    "degree_rank": ".comm",
    "RingAttention": ".ring",
    "RingUlysses": ".ring",
    "ring_ulysses_groups": ".ring",
    "attention_with_lse": ".lse",
    "pick_lse_backend": ".lse",
}

__all__ = [*_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
