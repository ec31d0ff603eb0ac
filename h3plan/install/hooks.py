"""Every effect an install has on a module is a diffusers `ModelHook` on that module, named `h3plan.<lever>`, and
uninstall is removing them.

`attach(module, fqn, lever, forward, state)` registers `forward(module, *args, **kwargs)` on the module's `HookRegistry`
(diffusers.hooks.hooks) as the `new_forward` of a hook named `h3plan.<lever>`. A forward that wraps rather than replaces
(`replaces=False`) is called `forward(previous, *args, **kwargs)`, `previous` the forward under the hook (the module's
own, or the hooks registered before it). `attrs` are set on the module while the hook is registered (its
`initialize_hook`) and removed with it (`deinitalize_hook`).

`effect(module, lever, state, restore, apply=..., part=...)` registers what is not a forward (a submodule swapped on
its parent, a processor set, a weight parked, an attribute set, a class swapped, a cast) as an `EffectHook` named
`h3plan.<lever>` or, where a lever has more than one effect on the module, `h3plan.<lever>.<part>`: its
`initialize_hook` runs `apply` (None: the caller applied the effect just before), its `deinitalize_hook` runs
`restore`, which puts back exactly what was there. diffusers wraps the forward of every hook it registers; an effect
hook's wrapper would only pass the call through (and, inside a block that compile_repeated_blocks compiles, give
dynamo one more object per block to guard), so `effect` leaves the module's forward as the hook found it and its
removal skips diffusers' relinking of the forwards.

Every registration is recorded on `state.hooks` as (module, hook name); `remove_all(state)` takes the hooks off in the
reverse order (uninstall, and an install that fails part-way). A registry this code made is dropped with its last hook,
and the module's `__dict__` is as before. A user's hook registered after install on the same module stays, and keeps
running around the module's own forward.

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
OWN = ("lora", "placement")  # hooks of the install itself, no lever's: the LoRA guard (lora.py), device= (placement.py)
_NONE = object()  # no instance forward


def name(lever: str, part: str | None = None) -> str:
    return PREFIX + lever + ("" if part is None else f".{part}")


def lever_of(hook_name: str) -> str:
    """The lever (or `OWN` name) a hook `h3plan.<lever>[.<part>]` is named for."""
    return hook_name[len(PREFIX):].split(".")[0]


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

    Every hook a plan registers is an instance of this class, of `WrapHook` or of `EffectHook`, the state per instance:
    dynamo guards a hooked forward on its hook's type (diffusers' `new_forward` calls `pre_forward` of it), and the
    code of that forward is one for every module, so a type per hook would compile one graph per block under regional
    compile."""

    def __init__(self, forward: Callable, attrs: dict[str, Any]):
        super().__init__()
        self.forward, self.attrs = forward, attrs
        self.made = self.had_forward = False  # set by `_register`: what `detach` drops with the last hook

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


class EffectHook(ModelHook):
    """An install effect that is not a forward (module docstring): `apply()` at registration (None: already applied),
    `restore()` at removal. No `new_forward`: the module's forward is left as it was."""

    def __init__(self, restore: Callable[[], Any], apply: Callable[[], Any] | None = None):
        super().__init__()
        self.restore, self.apply = restore, apply
        self.made = self.had_forward = False
        self.forward_after: Any = _NONE  # the module's instance forward once the effect is applied

    def initialize_hook(self, module):
        if self.apply is not None:
            self.apply()
        self.forward_after = module.__dict__.get("forward", _NONE)
        return module

    def deinitalize_hook(self, module):
        self.restore()
        return module


def hook(module: Module, lever: str) -> PlanHook | None:
    """The hook `h3plan.<lever>` on `module` itself (its forward and its `attrs`), None where there is none."""
    reg = module.__dict__.get("_diffusers_hook")
    found = None if reg is None else reg.get_hook(name(lever))
    return found if isinstance(found, PlanHook) else None


def _register(module: Module, fqn: str, lever: str, hook_name: str, new: PlanHook | EffectHook, state) -> str:
    if hook_name in registered(module):
        raise InstallError(f"{lever}: {fqn or type(module).__name__} already carries the hook {hook_name!r}")
    new.made = "_diffusers_hook" not in module.__dict__
    new.had_forward = "forward" in module.__dict__
    registry = HookRegistry.check_if_exists_or_initialize(module)
    try:
        registry.register_hook(new, hook_name)
    except BaseException:
        if new.made and not registry.hooks:
            del module._diffusers_hook
        raise
    state.hooks.append((module, hook_name))
    return hook_name


def attach(module: Module, fqn: str, lever: str, forward: Callable, state, *, replaces: bool = True,
           attrs: dict[str, Any] | None = None) -> str:
    """Register `forward` on `module` as hook `h3plan.<lever>` (module docstring); returns the hook's name."""
    hook_name = name(lever)
    theirs = foreign(module)
    if replaces and theirs:
        raise InstallError(f"{lever}: {fqn} carries the diffusers hook {theirs[-1]!r}, which the plan's hook "
                           f"{hook_name!r} (its own forward of {fqn}) would bypass; remove it before install, or "
                           "apply it after install")
    return _register(module, fqn, lever, hook_name, (PlanHook if replaces else WrapHook)(forward, dict(attrs or {})),
                     state)


def effect(module: Module, lever: str, state, restore: Callable[[], Any], *, apply: Callable[[], Any] | None = None,
           part: str | None = None, fqn: str = "") -> str:
    """Register an effect on `module` as hook `h3plan.<lever>[.<part>]` (module docstring); returns the hook's name.
    A failing `apply` registers nothing."""
    new = EffectHook(restore, apply)
    hook_name = _register(module, fqn, lever, name(lever, part), new, state)
    # diffusers set a wrapper as the module's forward: the forward the effect left goes back
    if new.forward_after is _NONE:
        module.__dict__.pop("forward", None)
    else:
        module.__dict__["forward"] = new.forward_after
    return hook_name


@contextlib.contextmanager
def attached(module: Module, fqn: str, lever: str, forward: Callable, *, replaces: bool = True):
    """`attach` for the duration of a `with` block (a forward that stands in during one call of the model)."""

    held = types.SimpleNamespace(hooks=[])
    attach(module, fqn, lever, forward, held, replaces=replaces)
    try:
        yield
    finally:
        remove_all(held)


def remove_all(state) -> None:
    """Remove every hook recorded on `state.hooks`, the last registered first."""
    while state.hooks:
        detach(*state.hooks.pop())


def detach(module: Module, hook_name: str) -> None:
    """Remove hook `hook_name` from `module`; with its last hook gone, drop the forward the registry left on the
    instance (unless one was there before the first) and the registry itself where `_register` made it."""
    registry = module.__dict__.get("_diffusers_hook")
    if registry is None or hook_name not in registry.hooks:
        return
    order = registry._hook_order
    removed = registry.hooks[hook_name]
    if isinstance(removed, EffectHook):  # it wraps no forward: nothing to relink
        index = order.index(hook_name)
        del registry.hooks[hook_name]
        order.pop(index)
        registry._fn_refs.pop(index)
        removed.deinitalize_hook(module)
    else:
        above = order[order.index(hook_name) + 1] if hook_name in order[:-1] else None
        above_hook = None if above is None else registry.hooks[above]
        registry.remove_hook(hook_name, recurse=False)
        if above_hook is not None and hasattr(above_hook, "new_forward"):
            # diffusers relinks the hook above by overwriting its forward with the one under the removed hook, which
            # drops that hook's own new_forward; put it back, calling the relinked forward as its original
            ref = above_hook.fn_ref
            ref.original_forward = ref.forward
            ref.forward = functools.update_wrapper(functools.partial(above_hook.new_forward, module),
                                                   above_hook.new_forward)
    # the hook and its function reference point at each other and at the module: a cycle that would keep the
    # module's tensors until the garbage collector runs
    removed.fn_ref = None
    if registry.hooks:
        return
    if not removed.had_forward:
        module.__dict__.pop("forward", None)
    if removed.made:
        del module._diffusers_hook
