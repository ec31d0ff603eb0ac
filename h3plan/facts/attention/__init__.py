"""Attention backends: one registry of declarations (torch-free), one runtime interface (base.py).

`BACKENDS` maps each backend's name to its `BackendSpec` (h3plan/facts/attention/specs/<name>.py, see spec.py);
the `_DECLARED` tuple below is the registry and its order is the config's (levers.attention's settings). The
declarations are imported by name, so `h3plan.runtime.attention.fa4` stays the implementation module. Everything that
names a backend reads it: the attention lever, the schema, the installer and its processor, the ring's
log-sum-exp backends, the bench. Each declaration names its implementation as a "module:attr" string; the
factory that imports it is h3plan/runtime/attention (`get_backend(name, **options)`). What each backend needs
from the hardware is a fact of conf/hardware/*.yaml, read by the planner through `supports` / `select` and, per
call, by the backends themselves (h3plan.facts.hardware).
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping, Sequence

from h3plan.facts.hardware import never_ran
from h3plan.facts.support import Support

from . import spec as _spec
from .spec import BackendSpec
_DECLARED = ("sdpa", "cudnn_bf16", "cudnn_fp8", "fa4")  # the registry: specs/<name>.py, in config order
BACKENDS: dict[str, BackendSpec] = {n: importlib.import_module(f"{__name__}.specs.{n}").SPEC for n in _DECLARED}
DEFAULT = "sdpa"  # diffusers' native math: what runs where no backend is planned or a call is refused

BF16 = tuple(n for n, s in BACKENDS.items() if s.precision == "bf16")  # what hardware.attention_rank.order ranks
FP8 = next(n for n, s in BACKENDS.items() if s.precision == "fp8")  # the recipe's FP8 attention
LOSSLESS = tuple(n for n, s in BACKENDS.items() if s.lossless)
LSE_OF = {n: s.lse for n, s in BACKENDS.items() if s.lse}  # backend -> its log-sum-exp block function (the ring's)


def backend_spec(name: str) -> BackendSpec:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; known: {sorted(BACKENDS)}")
    return BACKENDS[name]


def supports(name: str, hardware: Mapping[str, Any], hw: str | None = None) -> Support:
    """Whether backend `name` can run on this hardware by its facts, and every reason it cannot."""
    return Support.of(_spec.supports(backend_spec(name), hardware, hw))


def select(order: Sequence[str], hardware: Mapping[str, Any], hw: str | None = None) -> tuple[str, dict[str, Support]]:
    """(the first backend of `order` the hardware facts allow, {each earlier backend: why not}); the default
    backend when none of them can run."""
    passed = {}
    for name in order:
        why = supports(name, hardware, hw)
        if why:
            return name, passed
        passed[name] = why
    return DEFAULT, passed


def missing_facts(hardware: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(`hardware.<path>`, backend) for every capability fact a registered backend needs that these facts lack."""
    return [(path, name) for name, s in BACKENDS.items() for path in _spec.missing_facts(s, hardware)]


def untested_notes(opts, reads=()) -> list[str]:
    """The installer's notes on the paths of the options' backend that never ran where they would run, from the
    hardware facts (each `Untested.on`) and their hardware.verified.settings: the backend's own paths and those of
    the options it reads (`reads`: the levers' BackendOptions for it, h3plan.levers.backend_options)."""
    s, out = backend_spec(opts.backend), []
    for u in (*s.untested, *(o.untested for o in reads if o.untested is not None)):
        if u.option is not None and not getattr(opts, u.option):
            continue
        never, ran = never_ran(u.lever, u.setting, u.on)
        if never:
            elsewhere = f"; {u.lever}={u.setting} ran on {', '.join(ran)} without it" if ran else ""
            out.append(f"{s.name}: {u.what} never ran on {', '.join(never)} "
                       f"(hardware.verified.settings.{u.lever}){elsewhere}")
    return out


__all__ = ["BACKENDS", "DEFAULT", "BF16", "FP8", "LOSSLESS", "LSE_OF", "BackendSpec", "backend_spec", "supports",
           "select", "missing_facts", "untested_notes"]
