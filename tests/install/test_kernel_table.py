"""The kernel ops the levers name (SPEC.kernels, by name: levers import no runtime) and the ops the kernel modules
declare (each module's OPS, found by h3plan/runtime/kernels/table.py) are the same set, each resolving to a kernel
and its check."""

import inspect
import types

import pytest

from h3plan.levers import KERNEL_OPS, SPECS
from h3plan.runtime.kernels import table
from h3plan.runtime.kernels.table import kernel, ops


def test_every_op_a_lever_names_has_a_declared_kernel_and_no_other():
    assert ops() == set(KERNEL_OPS)
    assert all(isinstance(op, str) for s in SPECS.values() for op in s.kernels)


def test_every_op_resolves_to_a_runtime_kernel_and_its_check():
    for op in ops():
        fn, check = kernel(op)
        assert callable(fn) and callable(check), op
        assert (fn.__module__.startswith("h3plan.runtime.kernels.")
                and check.__module__.startswith("h3plan.runtime.kernels.")), op
        assert check.__name__.endswith("_check"), op
        assert inspect.signature(check).parameters, op  # a check takes the call's tensors


def test_a_kernel_patched_on_its_module_is_the_one_installed(monkeypatch):
    import h3plan.runtime.kernels.swiglu as sw

    def refuse(x):
        return "patched"

    monkeypatch.setattr(sw, "swiglu_check", refuse)
    assert kernel("swiglu") == (sw.swiglu, refuse)


def test_an_op_nobody_declares_is_one_line_naming_the_declared():
    with pytest.raises(KeyError, match="no kernel module declares op 'nope'.*'swiglu'"):
        kernel("nope")


def test_an_op_declared_twice_is_refused(monkeypatch):
    real = table._declared()
    twin = types.ModuleType("h3plan.runtime.kernels.twin")
    twin.OPS = {"swiglu": ("swiglu", "swiglu_check")}
    load = table.importlib.import_module
    names = sorted({m.__name__.rpartition(".")[2] for m, _, _ in real.values()}) + ["zz_twin"]
    monkeypatch.setattr(table.importlib, "import_module", lambda n: twin if n.endswith(".zz_twin") else load(n))
    monkeypatch.setattr(table.pkgutil, "iter_modules", lambda path: [types.SimpleNamespace(name=n) for n in names])
    table._declared.cache_clear()
    try:
        with pytest.raises(ImportError, match="kernel op 'swiglu' declared by both"):
            table._declared()
    finally:
        table._declared.cache_clear()
