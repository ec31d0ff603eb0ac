"""Support: the one typed answer to "can this apply here, and if not, why not" at the planning boundary.

Truthy when it can apply (no reasons); falsy with every reason it cannot, in the order found. str() joins the
reasons with "; " (empty when supported). Iterating gives the reasons, and it compares equal to another Support
or to the list (or tuple) of its reasons, so code that collected reasons in a list reads it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator


@dataclass(frozen=True, eq=False)
class Support:
    reasons: tuple[str, ...] = ()

    @classmethod
    def yes(cls) -> Support:
        return cls()

    @classmethod
    def no(cls, *reasons: str) -> Support:
        if not reasons:
            raise ValueError("Support.no needs at least one reason")
        return cls(tuple(str(r) for r in reasons))

    @classmethod
    def of(cls, reasons: Iterable[str] | str | None) -> Support:
        """From the older conventions: None or [] (supported), one reason, or a list of reasons."""
        if reasons is None:
            return cls()
        if isinstance(reasons, str):
            return cls((reasons,))
        return cls(tuple(str(r) for r in reasons))

    @property
    def ok(self) -> bool:
        return not self.reasons

    @property
    def reason(self) -> str | None:
        """The per-call convention: None when supported, else the reasons on one line."""
        return None if self.ok else str(self)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return "; ".join(self.reasons)

    def __iter__(self) -> Iterator[str]:
        return iter(self.reasons)

    def __add__(self, other: Support | Iterable[str]) -> Support:
        return Support(self.reasons + tuple(other))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Support):
            return self.reasons == other.reasons
        if isinstance(other, (list, tuple)):
            return self.reasons == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.reasons)


__all__ = ["Support"]
