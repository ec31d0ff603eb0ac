"""The attention scope's install: the options checked against each other and the plan's backend
(`attention_options`), static FP8 descales, the Ulysses or ring exchange, and one H3PlanAttnProcessor per
transformer block (`install_processors`; the processor itself is install/processor.py)."""

from __future__ import annotations

import functools

import torch

from h3plan.errors import InstallError
from h3plan.facts.attention import backend_spec, untested_notes
from h3plan.runtime.attention import for_options
from h3plan.facts.scale_table import load, row_for
from h3plan.levers import OPTIONS, SPECS
from h3plan.runtime.attention.fp8 import scale_from_amax
from h3plan.runtime.parallel.comm import degree_rank, high_priority_group
from h3plan.runtime.parallel.ulysses import UlyssesAttention

from .hooks import effect
from h3plan.runtime.kernels.table import kernel
from .options import AttentionOptions
from .processor import H3PlanAttnProcessor
from .ring import build as build_ring
from .shard import SequenceShard


def attention_options(builder, report) -> AttentionOptions:
    opts = builder.recorded("attention")
    if "backend" not in opts:
        report.notes.append("no attention backend in the plan: the processor uses sdpa (diffusers' native math)")
    a = AttentionOptions(**opts)
    problems = backend_problems(builder, a.backend)
    if a.fp8_scales == "static" and backend_spec(a.backend).fp8_inputs and not a.scale_table:
        problems.append("fp8_scales=static needs a scale_table")
    if a.a2a_fp8_codes and a.qk_norm_rope != "fused_fp8":
        problems.append("a2a_fp8_codes sends the codes of qk_norm_rope=fused_fp8")
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


def _static_descales(opts: AttentionOptions, fqns: list[str]) -> dict[str, torch.Tensor]:
    """Per-layer (q, k, v) descales from the static table (h3plan/facts/scale_table.py): descale = amax * margin / 448,
    the inverse of the kernel's scale."""

    table = load(opts.scale_table)
    return {fqn: 1.0 / scale_from_amax(torch.tensor(row_for(table, fqn, opts.scale_table), dtype=torch.float32),
                                       opts.scale_margin) for fqn in fqns}


def _ulysses(model, opts, group, builder, report):
    """(SequenceShard, UlyssesAttention) at a Ulysses degree above 1, (shard, RingUlysses) with a ring, else
    (None, None); the process group must have the plan's degree."""
    if opts.ring_degree > 1:  # RingUlysses in the ulysses slot's place (install/ring.py)
        return build_ring(model, opts, group, builder)
    if opts.ulysses_degree == 1:
        if opts.prefix_inplace or opts.a2a_fp8_codes or opts.ulysses_chunks > 1:
            report.skipped.append(("ulysses", "Ulysses degree 1: no sequence sharding, padding or exchange to tune"))
        return None, None
    degree, _ = degree_rank(group)
    if degree != opts.ulysses_degree:
        raise InstallError(f"plan ulysses_degree={opts.ulysses_degree} but the process group has {degree} ranks "
                         "(initialise torch.distributed with that many ranks, or pass group=)")
    split = opts.ulysses_exchange == "projection_split"
    post = high_priority_group(group) if split else None
    ua = UlyssesAttention(group, chunks=opts.ulysses_chunks, padding=opts.ulysses_padding, fp8_codes=opts.a2a_fp8_codes,
                          prefix_inplace=opts.prefix_inplace, split_output=split, post_group=post)
    return SequenceShard(group, degree, 0, len(model.transformer_blocks) - 1), ua


def install_processors(model, builder, state, group):
    """Each transformer block's attention processor: the plan's H3PlanAttnProcessor with its backend, kernels,
    static descales and Ulysses / ring exchange (the token refiner keeps diffusers' processor). Returns the
    sequence shard under Ulysses (the block forwards and output heads take it), else None."""
    report = state.report
    opts = attention_options(builder, report)
    backend = for_options(opts)
    kernels = {}
    if opts.qk_norm_rope == "fused":
        kernels["qk_norm_rope"] = kernel("qk_norm_rope")
    elif opts.qk_norm_rope == "fused_fp8":
        kernels["qk_norm_rope_fp8"] = kernel("qk_norm_rope_fp8")
        if opts.ulysses_degree > 1 and not opts.a2a_fp8_codes:  # bf16 travels; cudnn_fp8 casts after it
            kernels["qk_norm_rope"] = kernel("qk_norm_rope")
    fqns = [f"transformer_blocks.{i}.attn" for i in range(len(model.transformer_blocks))]
    static = opts.fp8_scales == "static" and backend_spec(opts.backend).fp8_inputs
    descales = _static_descales(opts, fqns) if static else {}
    shard, ua = _ulysses(model, opts, group, builder, report)
    ring, ua = (ua, None) if opts.ring_degree > 1 else (None, ua)
    lever = builder.lever_of("backend")
    recorded = builder.recorded("attention")
    for fqn, block in zip(fqns, model.transformer_blocks):
        attn = block.attn
        old = attn.processor
        proc = H3PlanAttnProcessor(opts, backend, kernels, old, static_descales=descales.get(fqn), shard=shard,
                                   ulysses=ua, ring=ring)
        effect(attn, lever, state, functools.partial(attn.set_processor, old),
               apply=functools.partial(attn.set_processor, proc), part="processor", fqn=fqn)
        report.swap(lever, f"{fqn}.processor", type(old).__name__, repr(proc))
        report.option_swaps(builder, "attention", recorded, fqn)
    report.notes.extend(untested_notes(opts))  # the backend's paths that never ran, from hardware.verified
    return shard
