"""Install a Plan into diffusers' MiniMaxH3ModularPipeline: every component the plan has levers for.

A thin layer over installer.install / uninstall, nothing of its own: `install_pipeline(pipe, plan)`
recognises the pipeline (anything else is one InstallError line), then installs the plan into each loaded
component in this order and returns one PipelineReport:
- `transformer` and `transformer_ref` (the t2va/fl2va and ref2va checkpoint partitions; either may be
  absent): the transformer levers, Ulysses with `group`; each partition its own AdaLN tables, keyed for the
  workflows it serves (workflows.py: ref2va's clean reference rows on `transformer_ref`);
- `vae` (AutoencoderKLMiniMaxH3): the VAE levers (tiles, fused decoder ops, CUDA-graph replay);
- `audio_vae` (AutoencoderKLMiniMaxH3Audio) is reported, never touched: a DAC encoder and a BigVGAN
  convolutional decoder, none of whose ops any h3plan lever targets.
A component that is not loaded (None) is reported as such. All or nothing: when one component refuses the
plan, the components this call installed are uninstalled again (one that carried another plan before is
left with none: install replaces a plan by uninstalling it first) and the error names the component.
Installing the same plan again returns each component's existing report; `uninstall_pipeline(pipe)`
restores every component this pipeline's install touched (even one since replaced in the pipeline).

device= (a pipeline loaded on the host, placement.py): the transformers and the VAE are installed with it, and the
audio VAE, which no lever touches, is moved there whole (the decode step runs it on the execution device); the
other components stay where they are, reported. Uninstall moves the audio VAE back too.

The `text_encoder` (Qwen3-VL) is placed as the plan's memory.text_encoder says (the text_encoder lever's install
records the `pipeline` scope's option on a builder; text_encoder.py places it: resident,
offload_after or host, on `device` or, without one, the device the transformer is on); a plan that places none
(prompt_embeds given) leaves it where it is, reported; one placed already (the pipeline bench places it for all its
rows) is left as placed. Uninstall undoes the placement this install made.
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass, field

from h3plan.errors import InstallError
from h3plan.levers import MEMORY_REGISTRY, TERM_OWNERS, install_module
from h3plan.planner import Plan

from .components import COMPONENTS, NO_LEVER, TRANSFORMERS, is_pipeline
from .installer import collect, install, installed_plan, uninstall
from .placement import Placement, check, target, tensors
from .builder import Builder
from .hooks import effect, remove_all
from .text_encoder import place, placed
from .workflows import table_conditions
from .report import InstallReport

logger = logging.getLogger("h3plan.install")

_STATE = "_h3plan_pipeline"
_MOVED = "_h3plan_moved"  # install(pipe, plan, device=): the hooks of the components moved without a plan, in order


@dataclass
class PipelineReport:
    """reports: component name -> its InstallReport (install order); skipped: component -> why nothing was installed."""

    pipeline: str = ""
    reports: dict[str, InstallReport] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> InstallReport:
        return self.reports[name]

    @property
    def components(self) -> list[str]:
        return list(self.reports) + list(self.skipped)

    def swapped_levers(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.reports.values():
            for lever in r.swapped_levers():
                seen.setdefault(lever, None)
        return list(seen)

    def summary(self, max_swaps: int = 12) -> str:
        lines = [f"{self.pipeline}: plan installed into {', '.join(self.reports) or '(no component)'}"]
        for name, r in self.reports.items():
            lines.append(f"[{name}] " + r.summary(max_swaps).replace("\n", "\n  "))
        for name, why in self.skipped.items():
            lines.append(f"[{name}] skipped: {why}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _pipeline_class():
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MiniMaxH3ModularPipeline

    return MiniMaxH3ModularPipeline


def recognise(pipe) -> None:
    name = f"{type(pipe).__module__}.{type(pipe).__qualname__}"
    if not is_pipeline(pipe):
        raise InstallError(f"h3plan.install_pipeline expects diffusers' MiniMaxH3ModularPipeline; got {name}")
    try:
        cls = _pipeline_class()
    except ImportError as e:  # diffusers' MiniMax-H3 modular pipeline needs transformers
        raise InstallError(f"cannot import diffusers' MiniMaxH3ModularPipeline ({e}); pip install "
                           "transformers") from None
    if not isinstance(pipe, cls):
        raise InstallError(f"h3plan.install_pipeline supports diffusers' MiniMaxH3ModularPipeline only; got {name}")


TABLES = TERM_OWNERS["adaln_tables"]  # the lever that serves the AdaLN linears from tables, its install module below
_tables = install_module(TABLES)


def _table_option(plan, registry):
    """The plan's option of the AdaLN tables (None: no table planned)."""
    return collect(plan, registry).option_of(TABLES)


def _move_whole(name, comp, device, report, moved) -> None:
    """A component without levers to the install device (placement.py), reported; the move is hook h3plan.placement
    on the component, recorded on `moved` (removed, moving it back, on a failed install and by uninstall_pipeline)."""
    check(comp, device, name)
    p = Placement(device)
    nbytes = p.move(comp)
    if p.moved:
        effect(comp, "placement", moved, p.restore, fqn=name)
    report.skipped[name] = (f"moved to {device} ({nbytes / 2**30:.2f} GiB)" if nbytes else f"on {device} already") + \
        f"; {NO_LEVER[name]}"


def _others(pipe, device, report, skip=()) -> None:
    """device=: the loaded nn.Module components h3plan does not know stay where they are (said, not moved)."""
    import torch

    for name in pipe.component_names:
        comp = getattr(pipe, name, None)
        if name in COMPONENTS or name in skip or not isinstance(comp, torch.nn.Module):
            continue
        where = {str(t.device) for _, t in tensors(comp)} or {"no tensors"}
        report.skipped[name] = (f"stays on {', '.join(sorted(where))}: the plan counts no memory for it (prompt_embeds "
                                f"given); move it to {device} yourself if the pipeline runs it")


def _run_device(pipe):
    """The device the pipeline's transformer (else its VAE) is on: where a placed text encoder encodes."""
    for name in TRANSFORMERS + ("vae",):
        comp = getattr(pipe, name, None) if name in pipe.component_names else None
        if comp is not None:
            return next(comp.parameters()).device
    return None


def pipeline_options(plan) -> Builder:
    """The `pipeline` scope's options: each lever decided in the memory estimate installs its decision (the plan's
    derived value of its name) on a builder."""
    builder = Builder()
    for name, lever in MEMORY_REGISTRY.items():
        decision = lever.from_derived(plan.derived_value(name))
        if decision is not None:
            builder.settings[name] = decision.setting
            lever.install(builder, decision)
    return builder


def _text_encoder(pipe, plan, device, report, moved) -> bool:
    """The loaded text_encoder placed as the plan says (module docstring); True when the plan places it. The placement
    is hook h3plan.placement on the conditioner, recorded on `moved` (removed on a failed install and by
    uninstall_pipeline, which restores it)."""
    te = getattr(pipe, "text_encoder", None) if "text_encoder" in pipe.component_names else None
    setting = pipeline_options(plan).view("pipeline").text_encoder
    if te is None or setting is None:
        return False
    before = placed(te)
    if before is not None:
        report.skipped["text_encoder"] = f"{before.line}; placed before install, left as it is"
        return True
    where = device if device is not None else _run_device(pipe)
    if where is None:
        raise InstallError("text_encoder: no device to encode on (the pipeline holds no transformer or VAE)")
    p = place(te, setting, where)
    try:
        effect(te, "placement", moved, p.restore, fqn="text_encoder")
    except BaseException:
        p.restore()
        raise
    report.skipped["text_encoder"] = p.line
    return True


def install_pipeline(pipe, plan: Plan, group=None, *, registry=None, num_inference_steps=None, device=None,
                     stand_in: bool = False) -> PipelineReport:
    """Install `plan` into every component of a MiniMaxH3ModularPipeline it has levers for (module docstring).
    group: the torch.distributed group for the transformers' Ulysses attention (None: the default group);
    registry: lever installers, as installer.install takes them (None: h3plan.levers.REGISTRY);
    device: the components the plan runs go there at install (a pipeline loaded on the host; None: none moves);
    stand_in: as installer.install takes it (components of any layer count)."""
    recognise(pipe)
    if not isinstance(plan, Plan):
        raise InstallError(f"install_pipeline expects an h3plan Plan, got {type(plan).__name__}")
    device = target(device)
    report = PipelineReport(pipeline=type(pipe).__name__)
    touched, fresh, moved = {}, [], types.SimpleNamespace(hooks=[])
    try:
        for name in COMPONENTS:
            comp = getattr(pipe, name, None) if name in pipe.component_names else None
            if name in NO_LEVER:
                if comp is not None and device is not None:
                    _move_whole(name, comp, device, report, moved)
                else:
                    report.skipped[name] = NO_LEVER[name] if comp is not None else "not loaded"
                continue
            if comp is None:
                report.skipped[name] = ("not loaded" if name in pipe.component_names
                                        else "not a component of these blocks")
                continue
            was = installed_plan(comp)
            conditions, note = {}, None
            try:
                if name in TRANSFORMERS:
                    conditions, note = table_conditions(name, _table_option(plan, registry))
                kw = ({"group": group, "num_inference_steps": num_inference_steps, "adaln_conditions": conditions}
                      if name in TRANSFORMERS else {})
                report.reports[name] = install(comp, plan, registry=registry, device=device, stand_in=stand_in,
                                               announce=False, **kw)
            except ValueError as e:  # the installer's one-line refusals (H3PlanError is a ValueError too)
                raise InstallError(f"{name}: {e}") from e
            if note and note not in report.reports[name].notes and _tables.tables_of(comp) is not None:
                report.reports[name].notes.append(note)
            touched[name] = comp
            if was != plan:
                fresh.append(comp)
        # adaln_table: the keys of the pipeline's own schedulers too
        tabled = [c for n, c in touched.items() if n in TRANSFORMERS and _tables.tables_of(c) is not None]
        if tabled:
            _tables.prepare(pipe, num_inference_steps=_tables.tables_of(tabled[0]).spec["steps"])
        te_placed = _text_encoder(pipe, plan, device, report, moved)
        if device is not None:
            _others(pipe, device, report, skip=("text_encoder",) if te_placed else ())
    except BaseException:
        remove_all(moved)
        for comp in reversed(fresh):
            uninstall(comp)
        raise
    for line in dict.fromkeys(w for r in report.reports.values() for w in r.warnings):  # once for the components
        logger.warning("h3plan.install: %s", line)
    if moved.hooks:
        pipe.__dict__[_MOVED] = pipe.__dict__.get(_MOVED, []) + moved.hooks
    # every component ever installed through this pipeline, also one replaced since (update_components)
    kept = pipe.__dict__.get(_STATE, [])
    pipe.__dict__[_STATE] = kept + [c for c in touched.values() if all(c is not k for k in kept)]
    return report


def uninstall_pipeline(pipe) -> bool:
    """Restore every component the pipeline's installs touched, and any loaded component that carries a plan;
    False when none was installed."""
    recognise(pipe)
    moved = types.SimpleNamespace(hooks=pipe.__dict__.pop(_MOVED, None) or [])
    had = bool(moved.hooks)
    remove_all(moved)  # install(..., device=): back to the host, the last moved first
    comps = list(pipe.__dict__.pop(_STATE, None) or [])
    comps += [getattr(pipe, n, None) for n in COMPONENTS if n in pipe.component_names]
    done, seen = False, set()
    for comp in comps:
        if comp is None or id(comp) in seen:
            continue
        seen.add(id(comp))
        done = uninstall(comp) or done
    return done or had


def installed_pipeline_plan(pipe) -> dict[str, Plan | None]:
    """Component name -> the plan installed in it (None: nothing installed), for the loaded components."""
    recognise(pipe)
    return {n: installed_plan(getattr(pipe, n)) for n in COMPONENTS
            if n in pipe.component_names and getattr(pipe, n, None) is not None and n not in NO_LEVER}
