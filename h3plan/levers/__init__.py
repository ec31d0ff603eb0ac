"""Lever registry: a plain dict filled by explicit imports, keyed by the config names, in decision and
install order. `NAMES` is the registry: one module name per lever, each `h3plan/levers/<name>.py`, imported
here in that order. Each module declares `SPEC` (settings, losslessness, install options, counter, kernels),
`decide(ctx) -> Decision` (pure, no torch) and `install(builder, decision)` (records options on the
builder). Every table other code needs about levers is derived here, once:

    LEVER_SETTINGS   lever -> its settings             (the config schema, --help, plan validation)
    OPTIONS          option key -> (owner lever, Option) (the builder's validation, the installer's defaults)
    MEMORY_SPECS     the levers decided in the memory estimate (MEMORY_NAMES: the text encoder's placement)
    KERNEL_OPS       kernel op -> its lever           (runtime/kernels' OPS map each to its functions)
    ULYSSES_LEVERS, REFERENCE_LEVERS, COUNTERS          (hardware-verified rule, verify)
    DECODE_LEVERS, OWN_BUDGET_LEVERS, BACKEND_LEVER     (verify: by each SPEC's `verify` strategy)
    owner(option), counter(option, route)              (an install call site: whom it installs for, what it counts)
    COLUMNS          lever -> its sweep table header     (h3plan/sweep.py)
    EXPORTS          h3plan.<fn> -> the lever whose install module defines it (h3plan/__init__.py)
    terms(settings)  the plan's Terms                    (planning/derive.py, planning/memory.py)

Adding a lever: docs/architecture.md, "How to add a lever".
"""

from __future__ import annotations

from dataclasses import fields, replace
from importlib import import_module
from importlib.util import find_spec
from types import MappingProxyType, ModuleType
from typing import Any, Mapping

from .base import OWN_BUDGET, VERIFY_DECODE, VERIFY_REFERENCE, Context, LeverError, Option, Spec, Terms

NAMES = ("gemm_quant", "adaln_table", "attention", "fa4_2cta", "fa4_tile", "fp8_scales", "qk_norm_rope", "modulation",
         "gated_residual", "swiglu", "fp8_act_quant", "ulysses_padding", "ulysses_overlap", "a2a_fp8_codes",
         "prefix_inplace", "ring", "sparse_attention", "ulysses_exchange", "nvfp4_producer_quant", "nvfp4_out_quant",
         "compile", "step_cache",
         "vae_precision", "vae_tiles", "vae_graphs", "vae_ops", "vae_parallel", "vae_encode_precision",
         "vae_encode_tiles")

MEMORY_NAMES = ("text_encoder",)
"""Levers decided inside the memory estimate (planning/memory.py), from the free memory it finds once every lever of
NAMES has decided: `decide(room)` takes the estimate's numbers, and the plan carries the decision as the derived
value of its name (set by `memory.<name>`). --help lists them beside NAMES; their install options join OPTIONS."""
CONDITIONER_PLACEMENT = MEMORY_NAMES[0]
"""The memory lever that places the text encoder: the plan's derived value of this name is its decision."""

REGISTRY = {name: import_module(f"{__name__}.{name}") for name in NAMES}
MEMORY_REGISTRY = {name: import_module(f"{__name__}.{name}") for name in MEMORY_NAMES}
if len(REGISTRY) != len(NAMES) or set(NAMES) & set(MEMORY_NAMES):
    raise ImportError("a lever is named twice in h3plan.levers.NAMES and MEMORY_NAMES")
for _name, _module in {**REGISTRY, **MEMORY_REGISTRY}.items():
    if _module.SPEC.name != _name:
        raise ImportError(f"h3plan/levers/{_name}.py declares SPEC.name {_module.SPEC.name!r}; the module is the "
                          "config name")
del _name, _module
SPECS: dict[str, Spec] = {name: m.SPEC for name, m in REGISTRY.items()}
MEMORY_SPECS: dict[str, Spec] = {name: m.SPEC for name, m in MEMORY_REGISTRY.items()}

LEVER_SETTINGS: dict[str, tuple[str, ...]] = {name: tuple(s.settings) for name, s in SPECS.items()}
ULYSSES_LEVERS = tuple(name for name, s in SPECS.items() if s.ulysses)
REFERENCE_LEVERS = tuple(name for name, s in SPECS.items() if s.verify == VERIFY_REFERENCE)
DECODE_LEVERS = tuple(name for name, s in SPECS.items() if s.verify == VERIFY_DECODE)
OWN_BUDGET_LEVERS = tuple(name for name, s in SPECS.items() if s.verify in OWN_BUDGET)
COUNTERS = MappingProxyType({name: s.counter for name, s in SPECS.items() if s.counter})


def _options() -> dict[str, tuple[str, Option]]:
    out: dict[str, tuple[str, Option]] = {}
    for name, s in {**SPECS, **MEMORY_SPECS}.items():
        for o in s.options:
            if o.key in out:
                raise ImportError(f"levers {out[o.key][0]!r} and {name!r} both declare the install option {o.key!r}")
            out[o.key] = (name, o)
    return out


def _kernel_ops() -> dict[str, str]:
    out: dict[str, str] = {}
    for name, s in SPECS.items():
        for op in s.kernels:
            if op in out:
                raise ImportError(f"kernel op {op!r} declared by two levers")
            out[op] = name
    return out


def _exports() -> dict[str, str]:
    out: dict[str, str] = {}
    for name, s in SPECS.items():
        for fn in s.exports:
            if out.setdefault(fn, name) != name:
                raise ImportError(f"levers {out[fn]!r} and {name!r} both export h3plan.{fn}")
    return out


def _term_owners() -> dict[str, str]:
    """Terms field -> the one lever whose settings set it."""
    out: dict[str, str] = {}
    for name, s in SPECS.items():
        for t in s.terms.values():
            for f in fields(Terms):
                if getattr(t, f.name) != f.default and out.setdefault(f.name, name) != name:
                    raise ImportError(f"levers {out[f.name]!r} and {name!r} both set Terms.{f.name}")
    return out


def terms(settings: Mapping[str, Any]) -> Terms:
    """The Terms of a plan's settings (lever -> setting or Decision; levers or settings not named change nothing)."""
    out = Terms()
    for lever, v in settings.items():
        spec = SPECS.get(lever)
        t = spec.terms.get(str(getattr(v, "setting", v))) if spec else None
        if t is not None:
            out = replace(out, **{f.name: getattr(t, f.name) for f in fields(Terms) if getattr(t, f.name) != f.default})
    return out


OPTIONS = MappingProxyType(_options())
KERNEL_OPS = MappingProxyType(_kernel_ops())
TERM_OWNERS = MappingProxyType(_term_owners())
COLUMNS = MappingProxyType({name: s.column for name, s in SPECS.items() if s.column})
EXPORTS = MappingProxyType(_exports())
BACKEND_LEVER = TERM_OWNERS["attention_backend"]
"""The lever whose setting is the attention backend the blocks run (verify's reference R keeps it)."""


def backend_options(backend: str) -> tuple:
    """The attention options `backend` reads, as the levers that own them declare it (Spec.backend_reads), in
    registry order: what its constructor takes, what it checks per call, how it describes them."""
    return tuple(s.backend_reads[backend] for s in SPECS.values() if backend in s.backend_reads)


def install_module(lever: str) -> ModuleType:
    """The module of a registered lever's own install, imported: its runtime module (h3plan/runtime/levers/<lever>.py,
    the step cache's, which its `Spec.model_step` installs), else an install module of its name (install/<lever>.py:
    the tables, the ring, sparse attention). KeyError for a lever without one. (Imported by name: the registry loads
    no install or runtime code until asked.)"""
    if lever in (*NAMES, *MEMORY_NAMES):
        for path in (f"h3plan.runtime.levers.{lever}", f"h3plan.install.{lever}"):
            if find_spec(path) is not None:
                return import_module(path)
    raise KeyError(f"no registered lever {lever!r} has an install module of its own (h3plan/runtime/levers/<lever>.py "
                   "or h3plan/install/<lever>.py)")


def owner(option: str) -> str:
    """The lever that owns install option `option` (how an install step names the lever of what it reads)."""
    return OPTIONS[option][0]


def counter(option: str, route: str | None = None) -> str:
    """The counter an install call site counts under, by the install option it reads: the owning lever's
    `Spec.count(route)`, so a counter's name is written once, in its lever's SPEC."""
    return SPECS[owner(option)].count(route)


def scope_options(scope: str) -> dict[str, Option]:
    """key -> Option of one install scope (levers.base.SCOPES), in registry order."""
    return {k: o for k, (_, o) in OPTIONS.items() if o.scope == scope}


def not_installed(decision) -> str | None:
    """Why install will skip this decision for want of a kernel (the lever's own skip reason), or None: only an
    enabled setting of a lever whose SPEC declares no install option (`Spec.installs`). Runs the lever's
    install against a recorder, which is all install does with a builder."""
    if not decision.enabled or SPECS[decision.lever].installs:
        return None
    reasons: list[str] = []

    class _Skips:
        def skip(self, lever: str, reason: str) -> None:
            reasons.append(reason)

    REGISTRY[decision.lever].install(_Skips(), decision)
    return "; ".join(reasons) or f"{decision.lever} declares no install option: nothing is installed"


__all__ = ["NAMES", "REGISTRY", "SPECS", "MEMORY_NAMES", "CONDITIONER_PLACEMENT", "MEMORY_REGISTRY", "MEMORY_SPECS",
           "LEVER_SETTINGS", "OPTIONS",
           "KERNEL_OPS", "ULYSSES_LEVERS", "backend_options", "install_module", "REFERENCE_LEVERS", "DECODE_LEVERS",
           "OWN_BUDGET_LEVERS",
           "BACKEND_LEVER", "COUNTERS", "COLUMNS", "EXPORTS", "TERM_OWNERS", "Context",
           "LeverError", "Option", "Spec", "Terms", "counter", "not_installed", "owner", "scope_options", "terms"]
