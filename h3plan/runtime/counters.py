"""Per-call counters: which installed path each call really took.

Every guarded call site records exactly one event: `<lever>.fused` when the fused kernel / backend ran,
`<lever>.fallback` (with its one-line reason) when a guard routed the call to diffusers' own eager
path. Tests and `action=verify` read them to prove the fused path ran (a guard that always falls
back cannot pass). Process-global and not thread-safe: inference runs one forward at a time.
"""

from __future__ import annotations

from collections import Counter, defaultdict

_COUNTS: Counter = Counter()
_REASONS: dict[str, Counter] = defaultdict(Counter)


def fused(lever: str) -> None:
    _COUNTS[f"{lever}.fused"] += 1


def fallback(lever: str, reason: str) -> None:
    _COUNTS[f"{lever}.fallback"] += 1
    _REASONS[lever][reason] += 1


def counters() -> dict[str, int]:
    """{"<lever>.fused": n, "<lever>.fallback": n, ...} since the last reset (sorted by key)."""
    return dict(sorted(_COUNTS.items()))


def fallback_reasons() -> dict[str, dict[str, int]]:
    """{lever: {reason: n}} for every fallback since the last reset."""
    return {lever: dict(r) for lever, r in sorted(_REASONS.items())}


def reset_counters() -> None:
    _COUNTS.clear()
    _REASONS.clear()


def format_counters(counts: dict[str, int] | None = None, reasons: dict[str, dict[str, int]] | None = None) -> str:
    """One line per lever: `lever: fused n, fallback m (reason x k; ...)`."""
    counts = counters() if counts is None else counts
    reasons = fallback_reasons() if reasons is None else reasons
    levers = sorted({k.rsplit(".", 1)[0] for k in counts})
    lines = []
    for lever in levers:
        line = f"{lever}: fused {counts.get(lever + '.fused', 0)}, fallback {counts.get(lever + '.fallback', 0)}"
        why = reasons.get(lever)
        if why:
            line += " (" + "; ".join(f"{r} x{n}" for r, n in why.items()) + ")"
        lines.append(line)
    return "\n".join(lines) if lines else "(no guarded calls)"
