"""The builder levers record their install options on (docs/architecture.md, "Lever install protocol").

A lever's `install(builder, decision)` only records; `h3plan.install.installer` swaps modules once every
lever has spoken. The options are declared by the levers themselves (`SPEC.options`, collected in
h3plan.levers.OPTIONS): each key belongs to one lever and one scope ("linears", "block", "attention",
"vae"). An unknown key, a key another lever owns or a value outside the declared ones raises ValueError at
once, naming the lever. `options(scope)` gives every key of a scope, unset ones at their declared default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from h3plan.levers import OPTIONS, SPECS, scope_options

from .options import VIEWS


def _declared():
    return OPTIONS


@dataclass
class Builder:
    """Options collected from the plan's levers, in plan order; `source[key]` names the lever that set it."""

    values: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)  # lever -> the plan's setting
    skipped: list[tuple[str, str]] = field(default_factory=list)
    source: dict[str, str] = field(default_factory=dict)

    def set(self, lever: str, key: str, value: Any) -> None:
        declared = _declared()
        if key not in declared:
            raise ValueError(f"lever {lever!r} set unknown install option {key!r}; known: {sorted(declared)}")
        owner, opt = declared[key]
        if owner != lever:
            raise ValueError(f"lever {lever!r} set install option {key!r}, which lever {owner!r} owns")
        if not opt.check(value):
            raise ValueError(f"lever {lever!r} set {opt.scope} option {key}={value!r}; allowed: {opt.allowed}")
        self.values[key] = value
        self.source[key] = lever

    def skip(self, lever: str, reason: str) -> None:
        self.skipped.append((lever, str(reason)))

    def recorded(self, scope: str) -> dict[str, Any]:
        """The options of `scope` that levers set (nothing else)."""
        declared = _declared()
        return {k: v for k, v in self.values.items() if declared[k][1].scope == scope}

    def options(self, scope: str) -> dict[str, Any]:
        """Every option of `scope`: the recorded value, else the declared default."""
        return {k: self.values.get(k, o.default) for k, o in scope_options(scope).items()}

    def option_of(self, lever: str) -> Any:
        """The value of `lever`'s one install option: recorded, else its SPEC's default."""
        (opt,) = SPECS[lever].options
        return self.values.get(opt.key, opt.default)

    def view(self, scope: str):
        """The options of `scope` as its typed view (install/options.py): the recorded values, else the SPEC's
        defaults."""
        return VIEWS[scope](**self.recorded(scope))

    def lever_of(self, key: str) -> str:
        return self.source.get(key) or _declared()[key][0]

    @property
    def touched(self) -> set[str]:
        return set(self.source.values())
