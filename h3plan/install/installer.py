"""Install a Plan into diffusers' MiniMaxH3Transformer3DModel (or its VAE), and take it out again.

`install(model, plan)`: recognise the model (class and the submodules the swaps touch; anything else is
refused with one ValueError), let every lever of the plan record its options on a Builder (plan order,
`h3plan.levers.REGISTRY[lever].install(builder, decision)`), then swap, in this order: the six block
linears (gemm_quant), each transformer block's attention processor (attention levers), each block's
forward (block levers; also Ulysses sharding). The token refiner keeps diffusers' processor. Every swap
is logged as `lever: fqn Old -> New` and listed in the returned InstallReport with the levers skipped.

State-dict layout: processor and forward swaps add no parameters or buffers, so a bf16 plan leaves
`model.state_dict()` keys, shapes and dtypes unchanged; gemm_quant replaces the linears' `weight` with
quantised buffers (plus their scales) while installed; adaln_table keeps the AdaLN linears' keys, dtypes and
bits, their tensors on the host (pinned) while installed (install/adaln_table.py). Every effect of an install is a
diffusers hook named `h3plan.<lever>` (install/hooks.py): a forward changed, and what is not a forward (a linear or a
processor swapped, a weight parked or cast, an attribute set; the originals kept while installed). `uninstall(model)`
removes them, the last registered first, and the model is as before. Installing the same plan again returns the
existing report; a different plan is installed after an uninstall, and install says it replaced the first. A plan
that cannot run where the model rests (no device=: on the host beside a GPU, or on a machine without one, outside
Triton's interpreter) is said too: each one line on the h3plan.install logger (WARNING) and a report note.
Install after moving / copying the model (the kept originals stay where they were).

`install(model, plan, device=...)`: a model resting on the host goes to `device` at install (placement.py): every
parameter and buffer the plan computes with is moved there first, one tensor at a time, except what a lever
replaces or parks: the AdaLN linears (adaln_table: streamed per linear for their entries, then parked in pinned
host memory as from a device-loaded model), the block linears gemm_quant quantises at install (each streamed and
quantised on the device; the bf16 originals stay on the host) and the VAE tensors vae_precision casts (each
streamed and cast on the device; the float32 originals stay on the host). The device then holds at most the
installed footprint and one tensor being staged. `uninstall` moves everything back where it was (the host), bit
for bit. device=None: install where the model is (nothing moved; a model installed with device= takes a new plan
on that device). `report.placement` says what moved and what stayed on the host.

An AutoencoderKLMiniMaxH3 takes the plan's VAE levers (vae_ops, vae_tiles) through h3plan/install/vae/install.py, with
the same report, idempotence and uninstall; each model reports the other model's levers as skipped. install() picks
one of two sequences by the model's type, once: `_install_transformer` and `_install_vae`, each a flat list of steps
calling the shared ones (`_check`, `collect`, `_device`, `_fresh`, `_finish`).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

from h3plan.errors import InstallError
from h3plan.install.vae import install as _vae
from h3plan.levers import REGISTRY, SPECS
from h3plan.planner import Plan

from h3plan.runtime.schedule import step_counts

from . import linears
from . import placement as _placement
from .attention import install_processors
from .block import install_forwards
from .builder import Builder
from .components import STATE
from .hooks import remove_all
from .lora import bypassed, guard as lora_guard, refuse_peft
from .recognise import check_model_facts, fewer_layers, is_transformer, recognise
from .report import InstallReport
from .site import run_input_steps, run_steps

logger = logging.getLogger("h3plan.install")


@dataclass
class _State:
    plan: Plan
    report: InstallReport
    hooks: list = field(default_factory=list)  # (module, hook name) in registration order (install/hooks.py)
    placement: _placement.Placement | None = None  # install(..., device=): what went to the device
    lora_bypass: dict = field(default_factory=dict)  # module fqn -> why the plan bypasses it (install/lora.py)


def collect(plan: Plan, registry=None) -> Builder:
    """Run every lever's install(builder, decision) in plan order."""
    if registry is None:
        registry = REGISTRY
    builder = Builder()
    for d in plan.decisions:
        if d.lever not in registry:
            raise InstallError(f"plan lever {d.lever!r} has no installer in h3plan.levers.REGISTRY "
                               f"({sorted(registry)})")
        entry = registry[d.lever]
        builder.settings[d.lever] = d.setting
        getattr(entry, "install", entry)(builder, d)
    return builder


def _skips(plan, builder, report, stepped: set[str]):
    touched = builder.touched | stepped
    report.skipped.extend(builder.skipped)
    skipped = {lever for lever, _ in builder.skipped}
    for d in plan.decisions:
        if d.lever not in touched and d.lever not in skipped and not d.enabled:
            report.skipped.append((d.lever, f"setting {d.setting!r}: nothing to install"))
        if d.enabled and d.lever not in touched and d.lever not in skipped:
            report.notes.append(f"{d.lever}={d.setting} is enabled but its install recorded no option")
        if not d.hardware_verified and d.enabled:
            report.notes.append(f"{d.lever}={d.setting} has never run on hardware of the planned kind")
    vae_steps = {d.lever for d in plan.decisions if d.enabled and SPECS.get(d.lever) is not None
                 and SPECS[d.lever].model_step is not None and SPECS[d.lever].model == "vae"}
    if builder.recorded("vae") or vae_steps:
        levers = sorted({builder.lever_of(k) for k in builder.recorded("vae")} | vae_steps)
        report.skipped.append((", ".join(levers), "VAE options apply to AutoencoderKLMiniMaxH3, not to the transformer "
                                                  "(install the plan into the VAE too)"))


def install(model, plan: Plan, *, registry=None, group=None, num_inference_steps=None, device=None,
            stand_in: bool = False, adaln_conditions=None, announce: bool = True) -> InstallReport:
    """Install `plan` into a diffusers MiniMaxH3Transformer3DModel or AutoencoderKLMiniMaxH3; returns the
    InstallReport.

    registry: lever name -> object with install(builder, decision) (default h3plan.levers.REGISTRY).
    group: the torch.distributed group for Ulysses, or the VAE's vae_parallel (None: the default group).
    num_inference_steps: step counts the adaln_table lever tables beside the plan's (an int or a list).
    device: move a model resting on the host there at install (module docstring); None: install where it is.
    stand_in: the model is a few blocks of the plan's width, any count (verify and bench build them): its layer
    counts are not held to the plan's (otherwise more than the plan's is an InstallError, fewer a report note).
    adaln_conditions: condition flags the adaln_table keys take over the plan's (a pipeline partition's own
    workflows, install/workflows.py); None: the plan's.
    announce: log the report's warnings (a plan that cannot run where the model is, a plan replaced), one line each
    on the h3plan.install logger; a pipeline's install logs its components' once (False here).
    """

    sequence = _install_vae if _vae.is_vae(model) else _install_transformer
    return sequence(model, plan, registry=registry, group=group, num_inference_steps=num_inference_steps,
                    device=device, stand_in=stand_in, adaln_conditions=adaln_conditions, announce=announce)


def _install_transformer(model, plan, *, registry, group, num_inference_steps, device, stand_in, adaln_conditions,
                         announce) -> InstallReport:
    """install() into a MiniMaxH3Transformer3DModel: checks, options, placement, the transformer's swaps, report."""
    recognise(model)
    steps, fewer = _check(model, plan, "transformer", num_inference_steps, stand_in)
    builder = collect(plan, registry)
    bypass = bypassed(model, builder)
    refuse_peft(model, bypass)  # install/lora.py: no LoRA layer around a module the plan bypasses
    device, current = _device(model, device)
    if (done := _already(current, plan)) is not None:
        return done
    state, replaced = _fresh(model, plan, builder, current)
    with _undone_on_error(state):
        if device is not None:
            _placement.place(model, state, device, linears.streamed(model, builder))
        stepped = _transformer(model, builder, state, group, steps, num_inference_steps, adaln_conditions, bypass)
    _skips(plan, builder, state.report, stepped)
    return _finish(model, plan, state, fewer, device, replaced, announce)


def _install_vae(model, plan, *, registry, group, num_inference_steps, device, stand_in, adaln_conditions,
                 announce) -> InstallReport:
    """install() into an AutoencoderKLMiniMaxH3: the same checks and placement, the VAE's swaps (install/vae/),
    report. adaln_conditions is the transformer's; num_inference_steps is checked, not used."""
    _vae.recognise(model)
    _, fewer = _check(model, plan, "vae", num_inference_steps, stand_in)
    builder = collect(plan, registry)
    device, current = _device(model, device)
    if (done := _already(current, plan)) is not None:
        return done
    state, replaced = _fresh(model, plan, builder, current)
    with _undone_on_error(state):
        if device is not None:
            _placement.place(model, state, device, _vae.cast_tensors(model, builder))
        _vae.apply(model, builder, state, group)
        stepped = run_steps(model, plan, state, "vae", group=group)  # the levers' own steps (install/site.py)
    _vae.skips(plan, builder, state.report, stepped)
    if group is not None and not builder.view("vae").parallel:
        state.report.notes.append("group= is for the transformer's Ulysses attention and vae_parallel; this plan uses "
                                  "neither on the VAE")
    return _finish(model, plan, state, fewer, device, replaced, announce)


def _check(model, plan, kind: str, num_inference_steps, stand_in: bool) -> tuple[list | None, list[str]]:
    """The plan against the recognised model: its type, the model facts, the step counts and (unless a stand-in) the
    layer counts; returns the step counts and the layers fewer than the plan's."""
    if not isinstance(plan, Plan):
        raise InstallError(f"install expects an h3plan Plan or a plan file path, got {type(plan).__name__}")
    check_model_facts(model, plan, kind)
    steps = None if num_inference_steps is None else step_counts(num_inference_steps, "install")
    return steps, [] if stand_in else fewer_layers(model, plan, kind)


def _device(model, device):
    """Where the install places the model (None: where it rests) and the plan installed now (None: none)."""
    device = _placement.target(device)
    current = model.__dict__.get(STATE)
    if device is None and current is not None and current.placement is not None:
        device = current.placement.device  # a new plan for a model installed with device=: it stays on that device
    if device is not None:
        _placement.check(model, device, type(model).__name__)
    return device, current


def _already(current: _State | None, plan: Plan) -> InstallReport | None:
    """The report of `plan` where it is the plan installed now (install is idempotent); None otherwise."""
    if current is not None and current.plan == plan:
        logger.info("plan already installed; nothing to do")
        return current.report
    return None


def _fresh(model, plan, builder, current: _State | None) -> tuple[_State, Plan | None]:
    """Uninstall the plan installed before (returned, None where none was) and start this plan's state and report."""
    replaced = None
    if current is not None:
        replaced = current.plan
        uninstall(model)
    report = InstallReport(levers=[d.lever for d in plan.decisions],
                           options={scope: builder.recorded(scope)
                                    for scope in ("linears", "block", "attention", "vae", "transformer")})
    return _State(plan, report), replaced


@contextlib.contextmanager
def _undone_on_error(state: _State):
    """Whatever raises inside takes back every swap made so far (the hooks registered, the last first)."""
    try:
        yield
    except BaseException:
        remove_all(state)
        raise


def _finish(model, plan, state, fewer, device, replaced, announce) -> InstallReport:
    """The notes every install ends with, the state on the model, the warnings logged."""
    report = state.report
    if fewer:
        report.notes.append("fewer layers than the plan's: " + ", ".join(fewer) + "; the plan's memory and speed "
                            "numbers are for its own count")
    if device is not None:
        _placement.note(model, state)
    elif (why := _placement.cannot_run(model, plan)) is not None:
        report.warn(why)
    if replaced is not None:
        report.warn(f"replaced the plan installed before ({_label(replaced)}) with this one ({_label(plan)}); the "
                    "first was uninstalled, bit for bit")
    setattr(model, STATE, state)
    if announce:
        for line in report.warnings:
            logger.warning("h3plan.install: %s", line)
    return report


def _label(plan: Plan) -> str:
    """hardware/recipe/parallel and the forced levers: sm90/bf16/u1 +attention=sdpa."""
    forced = "".join(f" +{d.lever}={d.setting}" for d in plan.decisions if d.forced)
    return "/".join(str(plan.get(s).get("name", "?")) for s in ("hardware", "recipe", "parallel")) + forced


def _transformer(model, builder, state, group, steps, num_inference_steps, adaln_conditions, bypass) -> set[str]:
    """The transformer's install, in order: linears, AdaLN tables, per-row / NVFP4 inputs, attention processors,
    block forwards, the levers' own steps (sparse attention, regional compile, the step cache), the LoRA guard (each
    step beside what it installs; `bypass`: the modules the plan serves without calling them, install/lora.py);
    returns the levers whose own step ran."""
    if builder.view("linears").quant is not None:
        linears.quantize(model, builder, state)
    # the levers' input steps (Spec.input_step, plan order): the AdaLN tables, the linears' per-row / NVFP4 inputs
    fed = run_input_steps(model, state.plan, state, builder, steps=steps, conditions=adaln_conditions)
    counts = [num_inference_steps] if isinstance(num_inference_steps, int) else num_inference_steps
    shard = install_processors(model, builder, state, group) if builder.recorded("attention") else None
    if shard is not None:
        linears.sequence_amax(model, shard, state)
    install_forwards(model, builder, state, shard, fed)
    # the levers' own steps, in plan order (Spec.model_step, install/site.py)
    stepped = run_steps(model, state.plan, state, "transformer", group=getattr(shard, "group", None), steps=counts)
    lora_guard(model, state, bypass)
    return stepped


def uninstall(model) -> bool:
    """Restore the model exactly as it was before install; False when nothing was installed."""
    state = model.__dict__.pop(STATE, None)
    if state is None:
        return False
    remove_all(state)
    logger.info("uninstalled %d swaps", len(state.report.swaps))
    return True


def installable(model) -> bool:
    """A model install takes: diffusers' MiniMaxH3Transformer3DModel or AutoencoderKLMiniMaxH3 (any subclass)."""
    return _vae.is_vae(model) or is_transformer(model)


def installed_plan(model) -> Plan | None:
    state = model.__dict__.get(STATE)
    return None if state is None else state.plan
