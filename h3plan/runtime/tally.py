"""The process-global tallies behind the counters: `record` writes them (counters.py in eager code, the
`h3plan::count` op of count_op.py in traced code); counters.py reads and resets them. Torch-free."""

from __future__ import annotations

from collections import Counter, defaultdict

COUNTS: Counter = Counter()
REASONS: dict[str, Counter] = defaultdict(Counter)


def record(lever: str, reason: str | None) -> None:
    if reason is None:
        COUNTS[f"{lever}.fused"] += 1
    else:
        COUNTS[f"{lever}.fallback"] += 1
        REASONS[lever][reason] += 1
