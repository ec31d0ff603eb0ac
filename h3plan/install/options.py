"""The installer's typed view of the builder's options, one frozen dataclass per scope (`VIEWS`; `Builder.view`).

The fields are not written here: they are the install options the levers declare (`SPEC.options`,
h3plan.levers.OPTIONS), with their declared defaults, so a new option needs no edit in this file. An install step
reads an option as an attribute of its scope's view: an unset option is its SPEC default (never a default copied
at the call site), and a name no lever declares is an AttributeError, not a silent None.
"""

from __future__ import annotations

from dataclasses import fields, make_dataclass
from dataclasses import field as dc_field
from typing import Any

from h3plan.levers import OPTIONS, SPECS, backend_options, rules, scope_options


def _options_class(scope: str, name: str, namespace: dict):
    spec = [(k, Any, dc_field(default=o.default)) for k, o in scope_options(scope).items()]
    cls = make_dataclass(name, spec, frozen=True, namespace={"__module__": __name__, **namespace})
    return cls


def _non_default(self) -> dict[str, Any]:
    """{key: value} of every option that differs from its declared default (what the plan changes)."""
    opts = scope_options(self.SCOPE)
    return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != opts[f.name].default}


def _describe_block(self) -> str:
    return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


def _described(self, ulysses: bool) -> list[str]:
    """The parts the attention options of the Ulysses levers (ulysses) or of the others describe (Option.describe)."""
    parts = (o.describe(getattr(self, k)) for k, o in scope_options(self.SCOPE).items()
             if o.describe and SPECS[OPTIONS[k][0]].ulysses == ulysses)
    return [p for p in parts if p]


def _describe_attention(self) -> str:
    parts = _described(self, ulysses=False)
    for o in backend_options(self.backend):  # the options the backend reads, as their levers describe them
        part = o.describe(getattr(self, o.key)) if o.describe else None
        if part:
            parts.append(part)
    if self.ulysses_degree > 1:
        parts.append("ulysses=" + "/".join(_described(self, ulysses=True)))
    return ", ".join(parts)


def unfused_producers(self) -> str | None:
    """Where a bf16 producer the codes writers extend (levers/rules.py PRODUCERS) is diffusers' op here: its block
    options and theirs as `key=value, ...` (the install's note), else None."""
    opts = {o.key: o for lever in rules.PRODUCERS for o in SPECS[lever].options if o.scope == self.SCOPE}
    if all(getattr(self, k) != o.default for k, o in opts.items()):
        return None
    return ", ".join(f"{k}={getattr(self, k)}" for k in opts)


BlockOptions = _options_class("block", "BlockOptions", {
    "SCOPE": "block", "non_default": _non_default, "describe": _describe_block,
    "enabled": property(lambda self: bool(self.non_default())), "unfused_producers": unfused_producers})
AttentionOptions = _options_class("attention", "AttentionOptions", {
    "SCOPE": "attention", "non_default": _non_default, "describe": _describe_attention})
VaeOptions = _options_class("vae", "VaeOptions", {"SCOPE": "vae", "non_default": _non_default})
LinearsOptions = _options_class("linears", "LinearsOptions", {"SCOPE": "linears", "non_default": _non_default})
TransformerOptions = _options_class("transformer", "TransformerOptions", {"SCOPE": "transformer",
                                                                          "non_default": _non_default})
PipelineOptions = _options_class("pipeline", "PipelineOptions", {"SCOPE": "pipeline", "non_default": _non_default})
VIEWS = {"linears": LinearsOptions, "block": BlockOptions, "attention": AttentionOptions, "vae": VaeOptions,
         "transformer": TransformerOptions, "pipeline": PipelineOptions}

__all__ = ["BlockOptions", "AttentionOptions", "VaeOptions", "LinearsOptions", "TransformerOptions", "PipelineOptions",
           "VIEWS"]
