"""The attention scope's install: the options checked against each other and the plan's backend
(`attention_options`), the processor's sites (`attention_sites`: runtime/attention_sites.py, wrapped by the runtime
module of each attention lever whose options the plan changes, h3plan/runtime/levers/<lever>.py, in levers/rules.py
`ATTENTION_SITES` order), static FP8 descales, the Ulysses or world exchange, and one H3PlanAttnProcessor per
transformer block (`install_processors`; the processor itself is install/processor.py). Names no lever: what a
lever's option changes is in its runtime module."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

from h3plan.errors import InstallError
from h3plan.facts.attention import backend_spec, untested_notes
from h3plan.runtime.attention import for_options
from h3plan.levers import OPTIONS, SPECS, backend_options, rules
from h3plan.runtime.attention_sites import AttentionSites, exchange_defaults
from h3plan.runtime.parallel.comm import degree_rank
from h3plan.runtime.parallel.ulysses import UlyssesAttention

from .hooks import effect
from .options import AttentionOptions
from .processor import H3PlanAttnProcessor
from .shard import SequenceShard


def _site_levers(opts: AttentionOptions, changed_only: bool = True) -> list[ModuleType]:
    """The runtime modules of the levers of levers/rules.py `ATTENTION_SITES`, in that order: those whose attention
    options the plan changes, or every one (`changed_only=False`)."""
    changed = opts.non_default()
    return [importlib.import_module(f"h3plan.runtime.levers.{lever}") for lever in rules.ATTENTION_SITES
            if not changed_only or any(o.key in changed for o in SPECS[lever].options if o.scope == "attention")]


def attention_options(builder, report) -> AttentionOptions:
    opts = builder.recorded("attention")
    if "backend" not in opts:
        report.notes.append("no attention backend in the plan: the processor uses sdpa (diffusers' native math)")
    a = AttentionOptions(**opts)
    problems = backend_problems(builder, a.backend)
    for module in _site_levers(a, changed_only=False):  # a lever's problem may be another's option (a2a codes)
        problems.extend(getattr(module, "option_problems", lambda opts: [])(a))
    if problems:
        raise InstallError("inconsistent attention options: " + "; ".join(problems))
    return a


def backend_problems(builder, backend: str) -> list[str]:
    """Recorded options whose lever setting needs another attention backend (the levers' SPEC.backends)."""

    out = []
    for key, value in builder.recorded("attention").items():
        lever, opt = OPTIONS[key]
        setting = builder.settings.get(lever)
        need = SPECS[lever].backends.get(setting) if setting is not None else None
        if need and backend not in need and value != opt.default:
            out.append(f"{lever}={setting} needs attention {' or '.join(need)}, the plan's backend is {backend}")
    return out


def attention_sites(opts: AttentionOptions, kernels: dict) -> AttentionSites:
    """The processor's sites for these options: diffusers' ops, wrapped by the runtime module of each lever of
    levers/rules.py `ATTENTION_SITES` (in that order) whose attention options the plan changes, each handed the options
    and `kernels`, which it fills with the ops its sites look up per call."""
    sites = AttentionSites()
    for module in _site_levers(opts):
        sites = module.wrap(sites, opts, kernels)
    return sites


def _ulysses(model, opts, sites, group, builder, report):
    """(SequenceShard, UlyssesAttention with the options of `sites.exchange_options`) at a Ulysses degree above 1,
    (shard over the world, its exchange) where a lever's site exchanges over the world (`sites.world_exchange`), else
    (None, None); the process group must have the plan's degree."""
    if sites.world_exchange is not None:
        world, exchange = sites.world_exchange(opts, group, builder)
        return SequenceShard(group, world, 0, len(model.transformer_blocks) - 1), exchange
    if opts.ulysses_degree == 1:
        if sites.exchange_options is not exchange_defaults:  # a lever tunes an exchange degree 1 never runs
            report.skipped.append(("ulysses", "Ulysses degree 1: no sequence sharding, padding or exchange to tune"))
        return None, None
    degree, _ = degree_rank(group)
    if degree != opts.ulysses_degree:
        raise InstallError(f"plan ulysses_degree={opts.ulysses_degree} but the process group has {degree} ranks "
                         "(initialise torch.distributed with that many ranks, or pass group=)")
    ua = UlyssesAttention(group, **sites.exchange_options(group))
    return SequenceShard(group, degree, 0, len(model.transformer_blocks) - 1), ua


def install_processors(model, builder, state, group):
    """Each transformer block's attention processor: the plan's H3PlanAttnProcessor with its backend, kernels,
    static descales and Ulysses / ring exchange (the token refiner keeps diffusers' processor). Returns the
    sequence shard under Ulysses (the block forwards and output heads take it), else None."""
    report = state.report
    opts = attention_options(builder, report)
    backend = for_options(opts)
    kernels: dict = {}
    sites = attention_sites(opts, kernels)
    fqns = [f"transformer_blocks.{i}.attn" for i in range(len(model.transformer_blocks))]
    static = sites.layer_descales is not None and backend_spec(opts.backend).fp8_inputs
    descales = sites.layer_descales(fqns) if static else {}
    shard, ua = _ulysses(model, opts, sites, group, builder, report)
    world, ua = (ua, None) if sites.world_call is not None else (None, ua)
    lever = builder.lever_of("backend")
    recorded = builder.recorded("attention")
    for fqn, block in zip(fqns, model.transformer_blocks):
        attn = block.attn
        old = attn.processor
        proc = H3PlanAttnProcessor(opts, backend, kernels, old, sites=sites, static_descales=descales.get(fqn),
                                   shard=shard, ulysses=ua, world=world)
        effect(attn, lever, state, functools.partial(attn.set_processor, old),
               apply=functools.partial(attn.set_processor, proc), part="processor", fqn=fqn)
        report.swap(lever, f"{fqn}.processor", type(old).__name__, repr(proc))
        report.option_swaps(builder, "attention", recorded, fqn)
    # the backend's paths that never ran, from hardware.verified
    report.notes.extend(untested_notes(opts, backend_options(opts.backend)))
    return shard
