"""The plan: what the planner resolved, as plain frozen data.

A Plan is the whole contract between planning (CPU, no torch) and installing (GPU host). It holds the
configuration it was resolved from (as plain dicts), the derived numbers a user needs, and one
Decision per lever in installation order. `Plan.from_dict(plan.to_dict()) == plan` and the YAML /
JSON round trips are the identity, so a plan resolved on a laptop installs unchanged on a cluster.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

SCHEMA_VERSION = 1


def _freeze(value: Any) -> Any:
    """Mappings -> sorted tuples of pairs, lists -> tuples, recursively (hashable, order-stable)."""
    if isinstance(value, Mapping):
        return tuple((str(k), _freeze(v)) for k, v in sorted(value.items(), key=lambda kv: str(kv[0])))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in value) and value:
        return {k: _thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
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
                return _thaw(v) if isinstance(v, tuple) else v
        return default

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        d["params"] = {k: _thaw(v) for k, v in self.params}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Decision":
        return cls(
            lever=str(d["lever"]),
            setting=str(d["setting"]),
            lossless=bool(d["lossless"]),
            reasons=tuple(str(r) for r in d.get("reasons", ())),
            forced=bool(d.get("forced", False)),
            params=_freeze(dict(d.get("params", {}) or {})),
            hardware_verified=bool(d.get("hardware_verified", True)),
        )


@dataclass(frozen=True)
class Plan:
    """A resolved plan. `config` and `derived` are frozen mappings; `decisions` keep lever order."""

    config: tuple[tuple[str, Any], ...]
    derived: tuple[tuple[str, Any], ...]
    decisions: tuple[Decision, ...]
    schema_version: int = SCHEMA_VERSION
    notes: tuple[str, ...] = field(default=())

    def decision(self, lever: str) -> Decision:
        for d in self.decisions:
            if d.lever == lever:
                return d
        raise KeyError(f"plan has no decision for lever {lever!r}; levers: {[d.lever for d in self.decisions]}")

    def get(self, section: str) -> dict[str, Any]:
        """A config section (hardware, recipe, parallel, model, vae) as a plain dict."""
        cfg = _thaw(self.config) if self.config else {}
        return cfg.get(section, {})

    def derived_value(self, key: str, default: Any = None) -> Any:
        for k, v in self.derived:
            if k == key:
                return _thaw(v) if isinstance(v, tuple) else v
        return default

    @property
    def lossless(self) -> bool:
        return all(d.lossless for d in self.decisions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "config": _thaw(self.config) if self.config else {},
            "derived": _thaw(self.derived) if self.derived else {},
            "decisions": [d.to_dict() for d in self.decisions],
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Plan":
        version = int(d.get("schema_version", SCHEMA_VERSION))
        if version != SCHEMA_VERSION:
            raise ValueError(f"plan schema_version {version} is not supported (this h3plan reads {SCHEMA_VERSION})")
        return cls(
            config=_freeze(dict(d.get("config", {}) or {})),
            derived=_freeze(dict(d.get("derived", {}) or {})),
            decisions=tuple(Decision.from_dict(x) for x in d["decisions"]),
            schema_version=version,
            notes=tuple(str(n) for n in d.get("notes", ())),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.from_dict(json.loads(text))

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False, width=120)

    @classmethod
    def from_yaml(cls, text: str) -> "Plan":
        import yaml

        return cls.from_dict(yaml.safe_load(text))

    @classmethod
    def load(cls, path: str) -> "Plan":
        with open(path) as f:
            text = f.read()
        return cls.from_json(text) if path.endswith(".json") else cls.from_yaml(text)


def make_plan(config: Mapping[str, Any], derived: Mapping[str, Any], decisions, notes=()) -> Plan:
    return Plan(config=_freeze(dict(config)), derived=_freeze(dict(derived)), decisions=tuple(decisions), notes=tuple(notes))


def make_decision(lever: str, setting: str, lossless: bool, reasons, *, forced=False, params=None, hardware_verified=True) -> Decision:
    return Decision(
        lever=lever,
        setting=setting,
        lossless=lossless,
        reasons=tuple(reasons),
        forced=forced,
        params=_freeze(dict(params or {})),
        hardware_verified=hardware_verified,
    )
