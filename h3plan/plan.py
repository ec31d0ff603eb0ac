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

from .errors import PlanFileError

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
        if not isinstance(d, Mapping):
            raise PlanFileError(f"a decision must be a mapping, got {type(d).__name__}")
        missing = [k for k in ("lever", "setting", "lossless") if k not in d]
        if missing:
            raise PlanFileError(f"decision {d.get('lever', '?')!r} lacks {', '.join(missing)}")
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
        """A Plan from its dict form; anything that is not one raises PlanFileError (one line)."""
        if not isinstance(d, Mapping):
            raise PlanFileError(f"a plan must be a mapping with 'decisions', got {type(d).__name__}")
        try:
            version = int(d.get("schema_version", SCHEMA_VERSION))
        except (TypeError, ValueError):
            raise PlanFileError(f"schema_version must be an integer, got {d.get('schema_version')!r}") from None
        if version != SCHEMA_VERSION:
            raise PlanFileError(f"plan schema_version {version} is not supported (this h3plan reads {SCHEMA_VERSION})")
        if not isinstance(d.get("decisions"), list) or not d["decisions"]:
            raise PlanFileError("a plan needs a non-empty 'decisions' list (write one with `python -m h3plan out=plan.yaml`)")
        for key in ("config", "derived"):
            if not isinstance(d.get(key) or {}, Mapping):
                raise PlanFileError(f"plan '{key}' must be a mapping")
        decisions = tuple(Decision.from_dict(x) for x in d["decisions"])
        _check_levers(decisions)
        return cls(
            config=_freeze(dict(d.get("config", {}) or {})),
            derived=_freeze(dict(d.get("derived", {}) or {})),
            decisions=decisions,
            schema_version=version,
            notes=tuple(str(n) for n in d.get("notes", ()) or ()),
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
        """Read a plan file (.json, else YAML); a missing, unreadable or malformed file raises PlanFileError
        naming the file."""
        import yaml

        path = str(path)
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise PlanFileError(f"plan file {path}: {e.strerror or e}") from None
        try:
            if path.endswith(".json"):
                raw = json.loads(text)
            else:
                raw = yaml.safe_load(text)
        except json.JSONDecodeError as e:
            raise PlanFileError(f"plan file {path}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise PlanFileError(f"plan file {path}: malformed YAML{where}: {getattr(e, 'problem', None) or e}") from None
        try:
            return cls.from_dict(raw)
        except PlanFileError as e:
            raise PlanFileError(f"plan file {path}: {e}") from None


def _check_levers(decisions) -> None:
    from .levers import LEVER_SETTINGS

    for d in decisions:
        if d.lever not in LEVER_SETTINGS:
            raise PlanFileError(f"unknown lever {d.lever!r}; known: {', '.join(LEVER_SETTINGS)}")
        if d.setting not in LEVER_SETTINGS[d.lever]:
            raise PlanFileError(f"{d.lever}={d.setting} is not one of its settings: {', '.join(LEVER_SETTINGS[d.lever])}")


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
