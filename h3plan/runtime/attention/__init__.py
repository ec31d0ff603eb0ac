"""The attention backends' runtime: base.py the interface, sdpa.py / fa4.py / cudnn.py the
implementations, fp8.py the FP8 scales, ops.py the custom ops. The registry of declarations is torch-free
(h3plan.facts.attention); this package is its factory: it imports the implementation a declaration names."""

from __future__ import annotations

import importlib

from h3plan.facts.attention import backend_spec
from h3plan.levers import backend_options


def load(ref: str):
    """"module:attr" -> the attribute (imports the module)."""
    mod, _, attr = ref.partition(":")
    return getattr(importlib.import_module(mod), attr)


def backend_class(name: str):
    return load(backend_spec(name).impl)


def get_backend(name: str, **options):
    """An instance of the named backend; options: its constructor's (fa4: `two_cta` (bool | None), `tile`)."""
    return backend_class(name)(**options)


def for_options(opts):
    """The backend of installed attention options (their `backend`), built with the options it reads."""
    s = backend_spec(opts.backend)
    return get_backend(s.name, **{o.kwarg: getattr(opts, o.key) for o in backend_options(s.name) if o.kwarg})


__all__ = ["load", "backend_class", "get_backend", "for_options"]
