"""The kernel op a lever names (`SPEC.kernels`) -> its public function and its `<op>_check`.

Levers sit below the runtime and name their ops only. Each kernel module declares its own ops beside its kernels,
`OPS = {op: (function name, check name)}`; this module finds them in every module of this package (a new kernel
file is found without an edit here or in install/) and resolves an op when an install asks (`kernel(op)`), reading
the module's attributes then: a function or check patched on its module (a test's refusing guard, a probe's
variant) is the one installed. tests/install/test_kernel_table.py holds the ops to the levers' `SPEC.kernels`,
both ways.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from types import ModuleType
from typing import Callable

Pair = tuple[Callable, Callable]  # (public fn, check fn: None when it takes the call, else the reason it refuses)

_PACKAGE = __name__.rpartition(".")[0]


@functools.cache
def _declared() -> dict[str, tuple[ModuleType, str, str]]:
    """op -> (its module, function name, check name), from every public module's OPS."""
    package = importlib.import_module(_PACKAGE)
    out: dict[str, tuple[ModuleType, str, str]] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_") or f"{_PACKAGE}.{info.name}" == __name__:
            continue
        module = importlib.import_module(f"{_PACKAGE}.{info.name}")
        for op, (fn, check) in getattr(module, "OPS", {}).items():
            if op in out:
                raise ImportError(f"kernel op {op!r} declared by both {out[op][0].__name__} and {module.__name__}")
            out[op] = (module, fn, check)
    return out


def ops() -> frozenset[str]:
    """Every kernel op the kernel modules declare."""
    return frozenset(_declared())


def kernel(op: str) -> Pair:
    """(public fn, check fn) of a kernel op a lever names."""
    try:
        module, fn, check = _declared()[op]
    except KeyError:
        raise KeyError(f"no kernel module declares op {op!r} (OPS); declared: {sorted(_declared())}") from None
    return getattr(module, fn), getattr(module, check)


__all__ = ["Pair", "kernel", "ops"]
