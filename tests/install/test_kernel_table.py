"""The kernel ops the levers name (SPEC.kernels, by name: levers import no runtime) and the install layer's table
of imported functions (h3plan/install/kernels.py) hold the same ops, each resolving to a kernel and its check."""

import inspect

from h3plan.install.kernels import KERNELS, kernel
from h3plan.levers import KERNEL_OPS, SPECS


def test_every_op_a_lever_names_has_an_imported_kernel_and_no_other():
    assert set(KERNELS) == set(KERNEL_OPS)
    assert all(isinstance(op, str) for s in SPECS.values() for op in s.kernels)


def test_every_op_resolves_to_a_runtime_kernel_and_its_check():
    for op in KERNELS:
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
