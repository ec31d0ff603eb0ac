"""Static FP8 scale tables (torch-free, so the planner validates them before any install).

Version 2 (written by `python -m h3plan action=calibrate`, h3plan/actions/calibrate.py):

    {"format": "h3plan.fp8_scales", "version": 2,
     "provenance": {"model", "config_hash", "num_layers", "request", "inputs", "heldout", "date", "margin",
                    "statistic", "h3plan_version", "values_sha256"?},
     "attention": {"<attention fqn>" | "default": {"q": amax, "k": amax, "v": amax}},
     "linears": {"<block linear fqn>": amax},
     "percentile": {"p": 99.99, "attention": {...}, "linears": {...}}?}

`attention`: per-tensor absolute maxima of each transformer-block attention's Q, K, V after per-head
RMSNorm + RoPE (what cuDNN FP8 attention quantises; "default" covers layers without their own row).
`linears`: the input amax of every FP8 block linear (e.g. "transformer_blocks.3.attn.to_q"); to_q, to_k
and to_v read one tensor (norm1's modulated output), so their rows must be equal. Consumers turn an
amax into the scale 448 / (amax * margin) (h3plan.runtime.kernels.fp8.scale_from_amax).

Version 1 (still read): the flat `{"<fqn>" | "default": {"q", "k", "v"}}` object, no linears, no provenance.

Refused with one line naming the file (ScaleTableError): not JSON, a missing or unknown key, an amax that
is not a finite number > 0, to_q/to_k/to_v rows that differ, a table of another table version (stale),
a table calibrated for another model (its `config_hash` differs from the model's: `config_hash` covers
every diffusers_config key except num_layers, so a truncated stack of the same model still matches and
a missing layer is caught by `row_for` instead), a table whose held-out check failed, or values edited
after calibration (`values_sha256`; delete that key from the provenance to accept hand-edited values).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field

from h3plan.errors import H3PlanError

NAME = "fp8_scales"
"""The table's name: the lever that reads it (levers.fp8_scales=static), calibrate.target's default, the default file
name (<NAME>.json) and, in FORMAT, the file's format tag."""
FORMAT = f"h3plan.{NAME}"
VERSION = 2
TOP_KEYS = ("format", "version", "provenance", "attention", "linears", "percentile")
PROVENANCE_KEYS = ("model", "config_hash", "num_layers", "request", "inputs", "heldout", "date", "margin", "statistic",
                   "h3plan_version")
QKV = ("q", "k", "v")
SHARED_INPUT = ("attn.to_q", "attn.to_k", "attn.to_v")  # one input tensor, so one amax
HASH_EXCLUDES = ("num_layers",)


class ScaleTableError(H3PlanError):
    """A missing, malformed, stale, foreign or rejected table; str() is one line naming the file."""


@dataclass(frozen=True)
class ScaleTable:
    """A validated table: attention rows {fqn: (q, k, v)}, linears {fqn: amax}; provenance as written (v2)."""

    path: str
    version: int
    attention: dict[str, tuple[float, float, float]]
    linears: dict[str, float] = field(default_factory=dict)
    provenance: dict | None = None
    percentile: dict | None = None


def config_hash(config) -> str:
    """sha256 (16 hex) of a diffusers MiniMaxH3Transformer3DModel config: the cfg.model.diffusers_config
    mapping or an instantiated model's `model.config`. Private keys ("_class_name", ...) and num_layers
    are left out; numbers compare as floats, tuples as lists, so YAML and the model's config agree."""

    def norm(v):
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, (list, tuple)):
            return [norm(x) for x in v]
        if isinstance(v, dict):
            return {str(k): norm(x) for k, x in v.items()}
        return str(v)

    items = {str(k): norm(v) for k, v in dict(config).items() if not str(k).startswith("_") and k not in HASH_EXCLUDES}
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()[:16]


def values_hash(attention: dict, linears: dict) -> str:
    """sha256 (16 hex) of the table's values as calibrated (canonical JSON, floats as repr)."""
    canon = {"attention": {k: [float(x) for x in (r[c] for c in QKV)] if isinstance(r, dict) else [float(x) for x in r]
                           for k, r in sorted(attention.items())},
             "linears": {k: float(v) for k, v in sorted(linears.items())}}
    return hashlib.sha256(json.dumps(canon, sort_keys=True).encode()).hexdigest()[:16]


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _qkv_rows(path: str, rows, where: str, *, min_value=_positive, what="finite numbers > 0") -> dict:
    if not isinstance(rows, dict) or not rows:
        raise ScaleTableError(f"scale table {path}: {where} must be a non-empty object of {{fqn: {{q, k, v}}}}")
    out = {}
    for key, row in rows.items():
        if not isinstance(row, dict) or sorted(row) != ["k", "q", "v"]:
            raise ScaleTableError(f"scale table {path}: row {key!r} must be {{\"q\": amax, \"k\": amax, \"v\": amax}}")
        vals = tuple(row[c] for c in QKV)
        if not all(min_value(v) for v in vals):
            raise ScaleTableError(f"scale table {path}: row {key!r} amax must be {what}, got {list(vals)}")
        out[str(key)] = tuple(float(v) for v in vals)
    return out


def _linear_rows(path: str, rows, where: str, *, min_value=_positive, what="a finite number > 0") -> dict:
    if not isinstance(rows, dict):
        raise ScaleTableError(f"scale table {path}: {where} must be an object of {{linear fqn: amax}}")
    bad = next(((k, v) for k, v in rows.items() if not min_value(v)), None)
    if bad is not None:
        raise ScaleTableError(f"scale table {path}: {where} row {bad[0]!r} amax must be {what}, got {bad[1]!r}")
    out = {str(k): float(v) for k, v in rows.items()}
    blocks = {k[: -len(s) - 1] for k in out for s in SHARED_INPUT if k.endswith("." + s)}
    for b in sorted(blocks):
        trio = [out.get(f"{b}.{s}") for s in SHARED_INPUT]
        if None in trio or len(set(trio)) != 1:
            raise ScaleTableError(f"scale table {path}: {where} {b}.attn.to_q/to_k/to_v read one input and need three "
                                  f"equal rows, got {trio}")
    return out


def _nonnegative(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _read(path: str):
    if not os.path.isfile(path):
        raise ScaleTableError(f"scale table {path}: no such file")
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ScaleTableError(f"scale table {path}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScaleTableError(f"scale table {path}: cannot read ({e})") from None


def _is_v2(raw: dict) -> bool:
    return any(k in raw for k in ("format", "version", "provenance", "attention", "linears"))


def _v2(path: str, raw: dict, model_config) -> ScaleTable:
    version = raw.get("version")
    if raw.get("format") != FORMAT or not isinstance(version, int) or isinstance(version, bool):
        raise ScaleTableError(f"scale table {path}: not an h3plan scale table (needs \"format\": \"{FORMAT}\" and an "
                              f"integer \"version\")")
    if version != VERSION:
        raise ScaleTableError(f"scale table {path}: stale: written as table version {version}, this h3plan reads "
                              f"version {VERSION} (and flat version-1 tables): recalibrate with action=calibrate")
    unknown = sorted(set(raw) - set(TOP_KEYS))
    missing = [k for k in ("provenance", "attention", "linears") if k not in raw]
    if unknown or missing:
        what = f"missing key {missing[0]!r}" if missing else f"unknown key {unknown[0]!r}"
        raise ScaleTableError(f"scale table {path}: {what}; a version-{VERSION} table has {', '.join(TOP_KEYS[:5])} "
                              "(and optional percentile)")
    prov = raw["provenance"]
    if not isinstance(prov, dict):
        raise ScaleTableError(f"scale table {path}: provenance must be an object")
    gone = [k for k in PROVENANCE_KEYS if k not in prov]
    if gone:
        raise ScaleTableError(f"scale table {path}: provenance is missing {gone[0]!r} (needs "
                              f"{', '.join(PROVENANCE_KEYS)})")
    if not _positive(prov["margin"]):
        raise ScaleTableError(f"scale table {path}: provenance.margin must be a finite number > 0, got "
                              f"{prov['margin']!r}")
    attention = _qkv_rows(path, raw["attention"], "attention")
    linears = _linear_rows(path, raw["linears"], "linears")
    check = (prov["heldout"] or {}).get("check") if isinstance(prov["heldout"], dict) else None
    if not isinstance(check, dict) or not isinstance(check.get("passed"), bool):
        raise ScaleTableError(f"scale table {path}: provenance.heldout.check.passed is missing: the held-out check "
                              f"never ran")
    if not check["passed"]:
        raise ScaleTableError(f"scale table {path}: rejected by its held-out check "
                              f"({check.get('summary', 'no summary')}): recalibrate (more inputs, a larger margin or "
                              f"statistic=amax)")
    if "values_sha256" in prov and prov["values_sha256"] != values_hash(raw["attention"], raw["linears"]):
        raise ScaleTableError(f"scale table {path}: values changed since calibration (provenance.values_sha256 "
                              f"differs), so its held-out check no longer holds: recalibrate, or delete values_sha256 "
                              f"to accept the edit")
    if model_config is not None:
        want = config_hash(model_config)
        if prov["config_hash"] != want:
            raise ScaleTableError(f"scale table {path}: calibrated for model {prov['model']!r} (config hash "
                                  f"{prov['config_hash']}), not this model (config hash {want}): recalibrate for it")
    pct = raw.get("percentile")
    if pct is not None:
        if not isinstance(pct, dict) or sorted(pct) != ["attention", "linears",
                                                        "p"] or not _positive(pct["p"]) or pct["p"] > 100:
            raise ScaleTableError(f"scale table {path}: percentile must be {{\"p\": (0, 100], \"attention\": ..., "
                                  f"\"linears\": ...}}")
        _qkv_rows(path, pct["attention"], "percentile.attention", min_value=_nonnegative, what="finite numbers >= 0")
        _linear_rows(path, pct["linears"], "percentile.linears", min_value=_nonnegative, what="a finite number >= 0")
    return ScaleTable(path, VERSION, attention, linears, prov, pct)


def load_table(path: str, model_config=None) -> ScaleTable:
    """The validated table (version 1 or 2); `model_config` (diffusers_config or model.config) refuses a
    version-2 table calibrated for another model. Raises ScaleTableError."""
    path = str(path)
    raw = _read(path)
    if not isinstance(raw, dict) or not raw:
        raise ScaleTableError(f"scale table {path}: expected a non-empty object of {{fqn: {{q, k, v}}}}")
    if _is_v2(raw):
        return _v2(path, raw, model_config)
    return ScaleTable(path, 1, _qkv_rows(path, raw, "the table"))


def load(path: str, model_config=None) -> dict[str, tuple[float, float, float]]:
    """{attention fqn or "default": (q, k, v) amax} of a version-1 or -2 table; raises ScaleTableError."""
    return load_table(path, model_config).attention


def row_for(table: dict[str, tuple[float, float, float]], fqn: str, path: str = "") -> tuple[float, float, float]:
    row = table.get(fqn, table.get("default"))
    if row is None:
        raise ScaleTableError(f"scale table {path}: no entry for {fqn} and no 'default'")
    return row


def linear_amax(table: ScaleTable, fqn: str) -> float:
    """The calibrated input amax of one FP8 linear; raises ScaleTableError when the table has no row."""
    if fqn not in table.linears:
        why = "a version-1 table has no linears" if table.version == 1 else "no row"
        raise ScaleTableError(f"scale table {table.path}: no input amax for {fqn} ({why}): recalibrate with "
                              f"action=calibrate")
    return table.linears[fqn]


def has_linears(path: str | None) -> bool:
    """Whether `path` is a loadable table with linear rows (False for a bad table: fp8_scales reports it)."""
    if not path:
        return False
    try:
        return bool(load_table(path).linears)
    except ScaleTableError:
        return False


def write(path: str, table: dict) -> None:
    """Write a table dict (as built by h3plan.actions.calibration) atomically: a temporary file, then a rename."""
    path = str(path)
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(table, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


__all__ = ["FORMAT", "VERSION", "ScaleTable", "ScaleTableError", "config_hash", "values_hash", "load_table", "load",
           "row_for", "linear_amax", "has_linears", "write"]
