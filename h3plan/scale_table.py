"""Static FP8 attention scale tables (torch-free, so the planner validates them before any install).

JSON: {"<attention module fqn>" | "default": {"q": amax, "k": amax, "v": amax}, ...}: calibrated
per-tensor absolute maxima of the attention's Q, K and V for each transformer-block attention (e.g.
"transformer_blocks.3.attn"), "default" for every layer without its own row. The installer turns a
row into scales 448 / (amax * margin).
"""

from __future__ import annotations

import json
import math
import os


class ScaleTableError(ValueError):
    """A missing or malformed table; str() is one line naming the file and what is wrong."""


def load(path: str) -> dict[str, tuple[float, float, float]]:
    """{fqn or "default": (q, k, v) amax}; raises ScaleTableError."""
    if not os.path.isfile(path):
        raise ScaleTableError(f"scale table {path}: no such file")
    try:
        with open(path) as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise ScaleTableError(f"scale table {path}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(raw, dict) or not raw:
        raise ScaleTableError(f"scale table {path}: expected a non-empty object of {{fqn: {{q, k, v}}}}")
    table = {}
    for key, row in raw.items():
        if not isinstance(row, dict) or sorted(row) != ["k", "q", "v"]:
            raise ScaleTableError(f"scale table {path}: row {key!r} must be {{\"q\": amax, \"k\": amax, \"v\": amax}}")
        vals = tuple(row[c] for c in ("q", "k", "v"))
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in vals)
        if not ok:
            raise ScaleTableError(f"scale table {path}: row {key!r} amax must be finite numbers > 0, got {list(vals)}")
        table[str(key)] = tuple(float(v) for v in vals)
    return table


def row_for(table: dict[str, tuple[float, float, float]], fqn: str, path: str = "") -> tuple[float, float, float]:
    row = table.get(fqn, table.get("default"))
    if row is None:
        raise ScaleTableError(f"scale table {path}: no entry for {fqn} and no 'default'")
    return row
