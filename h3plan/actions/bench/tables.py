"""The tables every bench prints: a cell (`fmt`), an error in one line, a markdown table and a console table
built from columns, where a failed record keeps its leading cells and says why. Pure Python."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

Column = tuple  # (title, alignment or format spec, cell: record -> value)


def fmt(x, spec="{:.2f}", none="-"):
    """A table cell: `spec` applied, `none` for a missing value, NaN as "NaN"."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none if x is None else "NaN"
    return spec.format(x)


def one_line(exc: BaseException) -> str:
    """An exception as one line of a record or a table: its type and the first line of its message."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300]}" if text else type(exc).__name__


def cell(key: str) -> Callable[[Mapping], Any]:
    """The cell that shows a record's `key` as it is (None where it is missing)."""
    return lambda r: r.get(key)


def md_table(columns: Sequence[Column], records: Sequence[Mapping], lead: int = 0) -> list[str]:
    """Markdown lines: a column per (title, "l" or "r", cell); a record with an "error" shows its first `lead`
    cells, then "failed: <error>", then empty cells."""
    out = ["| " + " | ".join(t for t, _, _ in columns) + " |",
           "|" + "|".join("---:" if a == "r" else "---" for _, a, _ in columns) + "|"]
    for r in records:
        if r.get("error"):
            head = [str(cell(r)) for _, _, cell in columns[:lead]] + [f"failed: {r['error'][:160]}"]
            out.append("| " + " | ".join(head) + " |" * (len(columns) - lead))
        else:
            out.append("| " + " | ".join(str(cell(r)) for _, _, cell in columns) + " |")
    return out


def text_table(columns: Sequence[Column], records: Sequence[Mapping], lead: int,
               free: tuple[str, Callable[[Mapping], Any]] | None = None) -> str:
    """Console lines: a column per (title, format spec such as "<22" or ">9", cell), one space apart, and a `free`
    (title, cell) column of any width two spaces after them; a record with an "error": its first `lead` cells and
    "failed: <error>"."""
    def line(cells):
        return " ".join(f"{c:{spec}}" for c, (_, spec, _) in zip(cells, columns))

    tail = (lambda r: "") if free is None else (lambda r: f"  {free[1](r)}")
    rows = [line([t for t, _, _ in columns]) + ("" if free is None else f"  {free[0]}")]
    for r in records:
        if r.get("error"):
            rows.append(line([cell(r) for _, _, cell in columns[:lead]]) + f"  failed: {r['error'][:80]}")
        else:
            rows.append(line([cell(r) for _, _, cell in columns]) + tail(r))
    return "\n".join(rows)
