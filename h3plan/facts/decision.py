"""A lever's decision as plain frozen data, and the frozen-mapping helpers a Plan is made of.

Decision is what a lever's `decide(ctx)` returns (h3plan/levers/base.py `resolve`); the Plan that holds one per
lever, its files and their re-planning live with the planner (h3plan/planner.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from h3plan.errors import PlanFileError


class _EmptyMapping(tuple):
    """A frozen empty mapping: () to compare and hash, {} when thawed (an empty list thaws to [])."""


def freeze(value: Any) -> Any:
    """Mappings -> sorted tuples of pairs, lists -> tuples, recursively (hashable, order-stable)."""
    if isinstance(value, Mapping):
        if not value:
            return _EmptyMapping()
        return tuple((str(k), freeze(v)) for k, v in sorted(value.items(), key=lambda kv: str(kv[0])))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    if isinstance(value, _EmptyMapping):
        return {}
    if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                                        for p in value) and value:
        return {k: thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class Decision:
    """One lever's resolved setting.

    lever:    registry key, the same name the config uses under `levers:`.
    setting:  the chosen value (one of the lever's allowed settings; "off" where it does not apply).
    lossless: True when the lever keeps eager's bits (given the same attention backend).
    reasons:  human-readable reasons, each naming the capability fact, recipe rule or measurement.
    forced:   the user asked for this setting explicitly (so it was validated, not picked).
    params:   extra resolved parameters (chunks, tile sizes, scale table path ...), frozen.
    hardware_verified: False when this setting has never run on real hardware of the planned kind.
    """

    lever: str
    setting: str
    lossless: bool
    reasons: tuple[str, ...]
    forced: bool = False
    params: tuple[tuple[str, Any], ...] = ()
    hardware_verified: bool = True

    @property
    def enabled(self) -> bool:
        return self.setting not in ("off", "eager", "none")

    def param(self, key: str, default: Any = None) -> Any:
        for k, v in self.params:
            if k == key:
                return thaw(v) if isinstance(v, tuple) else v
        return default

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        d["params"] = {k: thaw(v) for k, v in self.params}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Decision":
        if not isinstance(d, Mapping):
            raise PlanFileError(f"a decision must be a mapping, got {type(d).__name__}")
        missing = [k for k in ("lever", "setting", "lossless") if k not in d]
        if missing:
            raise PlanFileError(f"decision {d.get('lever', '?')!r} lacks {', '.join(missing)}")
        keys = [f.name for f in fields(cls)]
        unknown = sorted(map(str, set(d) - set(keys)))
        if unknown:
            raise PlanFileError(f"decision {d['lever']}: unknown key {unknown[0]!r}; keys: {', '.join(keys)}")
        return cls(
            lever=str(d["lever"]),
            setting=str(d["setting"]),
            lossless=bool(d["lossless"]),
            reasons=tuple(str(r) for r in d.get("reasons", ())),
            forced=bool(d.get("forced", False)),
            params=freeze(dict(d.get("params", {}) or {})),
            hardware_verified=bool(d.get("hardware_verified", True)),
        )


def make_decision(lever: str, setting: str, lossless: bool, reasons, *, forced=False, params=None,
                  hardware_verified=True) -> Decision:
    return Decision(
        lever=lever,
        setting=setting,
        lossless=lossless,
        reasons=tuple(reasons),
        forced=forced,
        params=freeze(dict(params or {})),
        hardware_verified=hardware_verified,
    )
