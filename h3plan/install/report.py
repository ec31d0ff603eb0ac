"""What an install did: every module swap (`lever: fqn Old -> New`), every lever skipped and why."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from h3plan.levers import scope_options

logger = logging.getLogger("h3plan.install")


@dataclass(frozen=True)
class Swap:
    lever: str
    fqn: str
    old: str
    new: str

    def __str__(self) -> str:
        return f"{self.lever}: {self.fqn} {self.old} -> {self.new}"


@dataclass
class InstallReport:
    """levers: the plan's levers in order; options: what the levers recorded (block / attention / vae /
    quant); swaps: module swaps in the order applied; skipped: (lever, reason) for levers with nothing
    to install on this model; notes: anything else a user must know (e.g. a path never run on hardware);
    placement (install(..., device=) only): device, the bytes and tensors moved there ("moved", "tensors") and
    what stayed on the host ("host": what -> bytes); warnings: the notes install logged."""

    levers: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    swaps: list[Swap] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    placement: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    """The notes install also logs as warnings (one line each on the h3plan.install logger): the plan cannot run
    where the model is, or it replaced a plan installed before."""

    def warn(self, line: str) -> None:
        self.notes.append(line)
        self.warnings.append(line)

    def swap(self, lever: str, fqn: str, old: str, new: str) -> None:
        """Log one module swap (`lever: fqn Old -> New`) and list it."""
        s = Swap(lever, fqn, old, new)
        self.swaps.append(s)
        logger.info("%s", s)

    def option_swaps(self, builder, scope: str, values: dict, fqn: str) -> None:
        """One swap per non-default option of `scope` whose lever declared how it is logged (Option.swap)."""
        for key, opt in scope_options(scope).items():
            if opt.swap is None or key not in values:
                continue
            logged = opt.swap(values[key])
            if logged is not None:
                suffix, old, new = logged
                self.swap(builder.lever_of(key), f"{fqn}{suffix}", old, str(new))

    def swapped_levers(self) -> list[str]:
        seen: dict[str, None] = {}
        for s in self.swaps:
            seen.setdefault(s.lever, None)
        return list(seen)

    def summary(self, max_swaps: int = 12) -> str:
        lines = [f"installed levers: {', '.join(self.swapped_levers()) or '(none)'}; {len(self.swaps)} swaps"]
        for s in self.swaps[:max_swaps]:
            lines.append(f"  {s}")
        if len(self.swaps) > max_swaps:
            lines.append(f"  ... {len(self.swaps) - max_swaps} more swaps")
        for lever, reason in self.skipped:
            lines.append(f"  skipped {lever}: {reason}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()
