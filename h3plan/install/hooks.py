"""What a plan attaches to a module's forward: a diffusers `ModelHook` named `h3plan.<lever>`, removed by name.

`attach(module, fqn, lever, forward, state)` registers `forward(module, *args, **kwargs)` on the module's `HookRegistry`
(diffusers.hooks.hooks) as the `new_forward` of a hook named `h3plan.<lever>`. A forward that wraps rather than replaces
(`replaces=False`) is called `forward(previous, *args, **kwargs)`, `previous` the forward under the hook (the module's
own, or the hooks registered before it). `attrs` are set on the module while the hook is registered (its
`initialize_hook`) and removed with it (`deinitalize_hook`). The hook's removal goes on `state.undo`, so uninstall takes
the hooks off in the reverse order of install; a registry this module made is dropped with its last hook, and the
module's `__dict__` is as before. A user's hook registered after install on the same module stays, and keeps running
around the module's own forward.

A replacing forward (`replaces=True`: it runs the module's computation itself and never calls the previous forward)
would bypass a user's hook registered on the same module before install, so it is refused: one InstallError naming
that hook (apply it after install instead, where it wraps the plan's forward). A wrapping forward composes with one.
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import Any, Callable

from diffusers.hooks import HookRegistry, ModelHook

from h3plan.errors import InstallError

Module = Any  # a torch.nn.Module

PREFIX = "h3plan."


def name(lever: str) -> str:
    return PREFIX + lever


def registered(module: Module) -> list[str]:
    """The names of the diffusers hooks on `module` itself, innermost first."""
    reg = module.__dict__.get("_diffusers_hook")
    return [] if reg is None else list(reg._hook_order)


def foreign(module: Module) -> list[str]:
    """The diffusers hooks on `module` itself that a plan did not register (a user's: offloading, a cache)."""
    return [n for n in registered(module) if not n.startswith(PREFIX)]


def installed(model: Module) -> list[tuple[str, str]]:
    """(module fqn, hook name) of every `h3plan.` hook under `model`."""
    return [(fqn, n) for fqn, m in model.named_modules() for n in registered(m) if n.startswith(PREFIX)]


class PlanHook(ModelHook):
    """A plan's forward for one module (module docstring), a replacing one: `forward(module, *args, **kwargs)`.

    Every hook a plan registers is an instance of this class or of `WrapHook`, the state per instance: dynamo guards a
    hooked forward on its hook's type (diffusers' `new_forward` calls `pre_forward` of it), and the code of that
    forward is one for every module, so a type per hook would compile one graph per block under regional compile."""

    def __init__(self, forward: Callable, attrs: dict[str, Any]):
        super().__init__()
        self.forward, self.attrs = forward, attrs

    def initialize_hook(self, module):
        for k, v in self.attrs.items():
            setattr(module, k, v)
        return module

    def deinitalize_hook(self, module):
        for k in self.attrs:
            module.__dict__.pop(k, None)
        return module

    def new_forward(self, module, *args, **kwargs):
        return self.forward(module, *args, **kwargs)


class WrapHook(PlanHook):
    """A wrapping forward: `forward(previous, *args, **kwargs)`, `previous` the forward under the hook."""

    def new_forward(self, module, *args, **kwargs):
        return self.forward(self.fn_ref.original_forward, *args, **kwargs)


def hook(module: Module, lever: str) -> PlanHook | None:
    """The hook `h3plan.<lever>` on `module` itself (its forward and its `attrs`), None where there is none."""
    reg = module.__dict__.get("_diffusers_hook")
    found = None if reg is None else reg.get_hook(name(lever))
    return found if isinstance(found, PlanHook) else None


def attach(module: Module, fqn: str, lever: str, forward: Callable, state, *, replaces: bool = True,
           attrs: dict[str, Any] | None = None) -> str:
    """Register `forward` on `module` as hook `h3plan.<lever>` (module docstring); returns the hook's name."""
    hook_name = name(lever)
    theirs = foreign(module)
    if replaces and theirs:
        raise InstallError(f"{lever}: {fqn} carries the diffusers hook {theirs[-1]!r}, which the plan's hook "
                           f"{hook_name!r} (its own forward of {fqn}) would bypass; remove it before install, or "
                           "apply it after install")
    if hook_name in registered(module):
        raise InstallError(f"{lever}: {fqn} already carries the hook {hook_name!r}")
    made = "_diffusers_hook" not in module.__dict__
    had_forward = "forward" in module.__dict__
    registry = HookRegistry.check_if_exists_or_initialize(module)
    registry.register_hook((PlanHook if replaces else WrapHook)(forward, dict(attrs or {})), hook_name)
    state.undo.append(lambda: detach(module, hook_name, made=made, had_forward=had_forward))
    return hook_name


@contextlib.contextmanager
def attached(module: Module, fqn: str, lever: str, forward: Callable, *, replaces: bool = True):
    """`attach` for the duration of a `with` block (a forward that stands in during one call of the model)."""

    held = types.SimpleNamespace(undo=[])
    attach(module, fqn, lever, forward, held, replaces=replaces)
    try:
        yield
    finally:
        while held.undo:
            held.undo.pop()()


def detach(module: Module, hook_name: str, *, made: bool = False, had_forward: bool = False) -> None:
    """Remove hook `hook_name` from `module`; with its last hook gone, drop the forward the registry left on the
    instance (unless one was there before: `had_forward`) and the registry itself where `attach` made it (`made`)."""
    registry = module.__dict__.get("_diffusers_hook")
    if registry is None:
        return
    order = registry._hook_order
    above = order[order.index(hook_name) + 1] if hook_name in order[:-1] else None
    above_hook = None if above is None else registry.hooks[above]
    removed = registry.hooks.get(hook_name)
    registry.remove_hook(hook_name, recurse=False)
    if removed is not None:  # the hook and its function reference point at each other and at the module: a cycle
        removed.fn_ref = None  # that would keep the module's tensors until the garbage collector runs
    if above_hook is not None and hasattr(above_hook, "new_forward"):
        # diffusers relinks the hook above by overwriting its forward with the one under the removed hook, which drops
        # that hook's own new_forward; put it back, calling the relinked forward as its original
        ref = above_hook.fn_ref
        ref.original_forward = ref.forward
        ref.forward = functools.update_wrapper(functools.partial(above_hook.new_forward, module),
                                               above_hook.new_forward)
    if registry.hooks:
        return
    if not had_forward:
        module.__dict__.pop("forward", None)
    if made:
        del module._diffusers_hook
