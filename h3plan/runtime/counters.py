"""Per-call counters: which installed path each call really took.

Every guarded call site records exactly one event: `<lever>.fused` when the fused kernel / backend ran,
`<lever>.fallback` (with its one-line reason) when a guard routed the call to diffusers' own eager
path. Tests and `action=verify` read them to prove the fused path ran (a guard that always falls
back cannot pass). Process-global and not thread-safe: inference runs one forward at a time.

Compile safety: inside a region torch.compile traces, the event goes through the custom op
`h3plan::count` instead of the Python dicts. The op is opaque to dynamo (nothing in the graph reads or
guards on the counts) and runs at every call of the compiled graph, so counting stays exact and the
graph never recompiles because a count changed. It mutates nothing (count_op.py: an op with an ordered
effect, which no compiler pass drops as dead code), so torch.export and functionalization take it too.
"""

from __future__ import annotations

from .tally import COUNTS as _COUNTS, REASONS as _REASONS, record as _record


def _compiling() -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def _count_op():
    from .count_op import count  # registered on import, before any tracing (runtime/guards imports it)

    return count


def fused(lever: str) -> None:
    if _compiling():
        _count_op()(lever, "", True)
    else:
        _record(lever, None)


def fallback(lever: str, reason: str) -> None:
    if _compiling():
        _count_op()(lever, str(reason), False)
    else:
        _record(lever, str(reason))


def event(lever: str, name: str) -> None:
    """Count `<lever>.<name>` (a lever's own events beside fused / fallback, e.g. step_cache.skipped); eager code
    only."""
    _COUNTS[f"{lever}.{name}"] += 1


class Counts(dict):
    """{"<lever>.fused": n, "<lever>.fallback": n, ...} (sorted by key), with `.reasons` {lever: {reason: n}};
    str() prints one line per lever with its fallback reasons."""

    def __init__(self, counts=(), reasons=None):
        super().__init__(counts)
        self.reasons = dict(reasons or {})

    def __str__(self) -> str:
        return format_counters(dict(self), self.reasons)


def counters() -> Counts:
    """The counts since the last reset, with the reasons of every fallback (`.reasons`; str() shows both)."""
    return Counts(sorted(_COUNTS.items()), fallback_reasons())


def fallback_reasons() -> dict[str, dict[str, int]]:
    """{lever: {reason: n}} for every fallback since the last reset."""
    return {lever: dict(r) for lever, r in sorted(_REASONS.items())}


def reset_counters() -> None:
    _COUNTS.clear()
    _REASONS.clear()


def format_counters(counts: dict[str, int] | None = None, reasons: dict[str, dict[str, int]] | None = None) -> str:
    """One line per lever: `lever: fused n, fallback m (reason x k; ...)`."""
    counts = dict(counters()) if counts is None else counts
    reasons = fallback_reasons() if reasons is None else reasons
    levers = sorted({k.rsplit(".", 1)[0] for k in counts})
    lines = []
    for lever in levers:
        line = f"{lever}: fused {counts.get(lever + '.fused', 0)}, fallback {counts.get(lever + '.fallback', 0)}"
        line += "".join(f", {k[len(lever) + 1:]} {n}" for k, n in sorted(counts.items())
                        if k.rsplit(".", 1)[0] == lever and k.rsplit(".", 1)[1] not in ("fused", "fallback"))
        why = reasons.get(lever)
        if why:
            line += " (" + "; ".join(f"{r} x{n}" for r, n in why.items()) + ")"
        lines.append(line)
    return "\n".join(lines) if lines else "(no guarded calls)"
