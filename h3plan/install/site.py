"""A lever's own install step (`Spec.model_step`) and what it is handed: a `Site`.

A lever whose effect no installer step carries (a call site of its own) declares `model_step(model, decision, site)`
in its SPEC. The installer runs it for every enabled decision of the model's levers, in plan order, after its own
steps (`run_steps`), and hands it a Site bound to that lever and the install's state: everything the step changes is
a named hook `h3plan.<lever>` (install/hooks.py), so uninstall and a failed install take it back like any other; the
kernels it calls are its SPEC's ops only, resolved by the runtime's table; its guarded calls count under its SPEC's
counter. The lever module imports no torch and no install code: the Site is its whole interface to both, and where
its install is more than a few hooks, `site.runtime()` is its own runtime module (h3plan/runtime/levers/<lever>.py,
torch code that reaches the model through the same Site: the step cache's).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import types
from typing import Any, Callable

from h3plan.errors import InstallError
from h3plan.levers import SPECS, install_module
from h3plan.levers.base import Spec
from h3plan.runtime.guards import run_guarded
from h3plan.runtime.kernels.table import Pair, kernel

from . import hooks


class Site:
    """One lever's handle on one install (module docstring)."""

    def __init__(self, spec: Spec, state, *, plan=None, group=None, steps=None, builder=None, conditions=None):
        self.spec, self.lever, self._state, self._builder = spec, spec.name, state, builder
        # condition flags the install takes over the plan's for the lever's keys (install(adaln_conditions=...): a
        # pipeline partition's own)
        self.conditions: dict[str, Any] = dict(conditions or {})
        self.group = group  # the torch.distributed group of the Ulysses ranks (None: one rank)
        self.steps: list[int] = list(steps or [])  # step counts passed to install(num_inference_steps=)
        self.plan = plan  # the Plan being installed (its config sections: `site.plan.get("pipeline")`)

    @property
    def state(self):
        """The install's state (its hooks and report), for a lever's own module under h3plan/install/ (`own()`), whose
        install parks weights or moves them with the install's placement; a runtime module uses the methods below."""
        return self._state

    def own(self) -> types.ModuleType:
        """The lever's own install module, imported: its runtime module (h3plan/runtime/levers/<lever>.py), else its
        install module (h3plan/install/<lever>.py: the AdaLN tables'); InstallError where it has neither."""
        try:
            return install_module(self.lever)
        except KeyError as e:
            raise InstallError(f"{self.lever}: {e.args[0]}") from None

    def runtime(self) -> types.ModuleType:
        """The lever's own runtime module, h3plan/runtime/levers/<lever>.py, imported (InstallError where it has
        none)."""
        path = f"h3plan.runtime.levers.{self.lever}"
        if importlib.util.find_spec(path) is None:
            raise InstallError(f"{self.lever}: no runtime module of its own (h3plan/runtime/levers/{self.lever}.py)")
        return importlib.import_module(path)

    def attach(self, module, fqn: str, forward: Callable, *, replaces: bool = True,
               attrs: dict[str, Any] | None = None) -> str:
        """`forward` on `module` as the hook `h3plan.<lever>` (hooks.attach: a replacing forward is called
        `forward(module, *args, **kwargs)`, a wrapping one `forward(previous, *args, **kwargs)`)."""
        return hooks.attach(module, fqn, self.lever, forward, self._state, replaces=replaces, attrs=attrs)

    def effect(self, module, restore: Callable[[], Any], *, apply: Callable[[], Any] | None = None,
               part: str | None = None, fqn: str = "") -> str:
        """An effect that is not a forward (hooks.effect): `apply` now, `restore` at uninstall."""
        return hooks.effect(module, self.lever, self._state, restore, apply=apply, part=part, fqn=fqn)

    def hold(self, module, key: str, value: Any, *, part: str = "state") -> str:
        """`value` in `module.__dict__[key]` while installed (an effect hook `h3plan.<lever>.<part>`): the state a
        lever's calls read, and an action finds by `key` (its runtime module's `calls(model)`)."""
        return self.effect(module, functools.partial(module.__dict__.pop, key, None),
                           apply=functools.partial(module.__dict__.__setitem__, key, value), part=part)

    def kernel(self, op: str) -> Pair:
        """(function, check) of one of the lever's own kernel ops (SPEC.kernels)."""
        if op not in self.spec.kernels:
            raise InstallError(f"{self.lever}: kernel op {op!r} is not one of its SPEC.kernels {self.spec.kernels}")
        return kernel(op)

    def guarded(self, check: Callable[[], str | None], fused: Callable, fallback: Callable, grad_tensors=(),
                route: str | None = None):
        """`fused()` where `check()` finds no reason to refuse (and autograd needs none of `grad_tensors`), else
        `fallback()`; counted under the lever's counter (or one of its routes), compile-safe (runtime/guards.py)."""
        return run_guarded(self.spec.count(route), check, fused, fallback, grad_tensors)

    def swap(self, fqn: str, old: str, new: str) -> None:
        """One line of the install report's swap log: `lever: fqn old -> new`."""
        self._state.report.swap(self.lever, fqn, old, new)

    def note(self, line: str) -> None:
        """A note of the install report (what a user must know of this install)."""
        self._state.report.notes.append(line)

    def skip(self, why: str) -> None:
        """One line of the install report's skipped list: `skipped <lever>: why` (a recorded setting with nothing to
        act on in this model)."""
        self._state.report.skipped.append((self.lever, why))

    def options(self, scope: str):
        """The plan's install options of `scope` as their typed view (install/options.py; an input step only)."""
        if self._builder is None:
            raise InstallError(f"{self.lever}: no install options at this step")
        return self._builder.view(scope)

    def option(self) -> Any:
        """The value the plan records for the lever's own option (its SPEC's one option)."""
        if len(self.spec.options) != 1:
            raise InstallError(f"{self.lever}: {len(self.spec.options)} options, not one: read site.options(scope)")
        if self._builder is None:
            raise InstallError(f"{self.lever}: no install options at this step")
        return self._builder.option_of(self.lever)


def run_steps(model, plan, state, model_kind: str, *, group=None, steps=None) -> set[str]:
    """Every enabled decision's `model_step` of a lever of `model_kind` ("transformer" or "vae"), in plan order;
    returns the levers whose step ran (the install then counts them as touched). group / steps: the Site's."""
    ran: set[str] = set()
    for d in plan.decisions:
        spec = SPECS.get(d.lever)
        if spec is None or spec.model_step is None or spec.model != model_kind or not d.enabled:
            continue
        spec.model_step(model, d, Site(spec, state, plan=plan, group=group, steps=steps))
        ran.add(d.lever)
    return ran


def run_input_steps(model, plan, state, builder, *, steps=None, conditions=None) -> dict[str, Any]:
    """Every enabled decision's `input_step` (Spec.input_step) of a transformer lever, in plan order; returns the block
    options they set back, merged. steps / conditions: the Site's (install's num_inference_steps, adaln_conditions)."""
    back: dict[str, Any] = {}
    for d in plan.decisions:
        spec = SPECS.get(d.lever)
        if spec is None or spec.input_step is None or spec.model != "transformer" or not d.enabled:
            continue
        site = Site(spec, state, plan=plan, builder=builder, steps=steps, conditions=conditions)
        back.update(spec.input_step(model, d, site))
    return back


__all__ = ["Site", "run_input_steps", "run_steps"]
