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
bits, their tensors on the host (pinned) while installed (install/adaln_table.py). `uninstall(model)` restores the original
forwards, processors and nn.Linear objects (the originals are kept while installed). Installing the
same plan again returns the existing report; a different plan is installed after an uninstall.
Install after moving / copying the model (the kept originals stay where they were; a deep copy of an
installed model shares its undo list with the original).

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
the same report, idempotence and uninstall; each model reports the other model's levers as skipped.
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass, field

import torch

from h3plan.facts.attention import backend_spec, for_options, untested_notes
from h3plan.runtime.attention.fp8 import scale_from_amax
from h3plan.levers import OPTIONS, REGISTRY, SPECS, scope_options
from h3plan.runtime.parallel.comm import degree_rank, high_priority_group
from h3plan.runtime.parallel.ulysses import UlyssesAttention
from h3plan.facts.scale_table import linear_amax, load, load_table, row_for
from h3plan.runtime.quant import BLOCK_LINEARS, quantized_linear
from h3plan.runtime.quant.fp8 import FP8Linear, SequenceAmax
from h3plan.install.vae import install as _vae
from h3plan.errors import InstallError
from h3plan.facts.hardware import never_ran

from h3plan.planner import Plan

from .adaln_table import build as build_adaln_tables, step_counts
from .step_cache import install as install_step_cache
from .block import block_kernels, load_kernel, plan_block_forward
from .builder import Builder
from .components import STATE
from .fp8_rows import install_rows
from .lora import guard as lora_guard, refuse_peft
from .nvfp4_inputs import install_nvfp4
from .parking import park
from . import placement as _placement
from .options import AttentionOptions, BlockOptions
from .processor import H3PlanAttnProcessor
from .report import InstallReport, Swap
from .ring import build as build_ring
from .shard import SequenceShard, shard_heads

logger = logging.getLogger("h3plan.install")


@dataclass
class _State:
    plan: Plan
    report: InstallReport
    undo: list = field(default_factory=list)  # callables, applied in reverse order
    placement: _placement.Placement | None = None  # install(..., device=): what went to the device


def _classes():
    from diffusers import MiniMaxH3Transformer3DModel
    from diffusers.models.transformers import transformer_minimax_h3 as h3

    return MiniMaxH3Transformer3DModel, h3.MiniMaxH3TransformerBlock, h3.MiniMaxH3Attention


def recognise(model) -> None:
    """Raise one ValueError unless `model` is a diffusers MiniMax-H3 transformer with the expected parts."""
    Model, Block, Attention = _classes()
    name = f"{type(model).__module__}.{type(model).__qualname__}"
    if hasattr(model, "_orig_mod"):
        raise InstallError(f"h3plan.install got a torch.compile wrapper ({name}); install into the model, then compile")
    if not isinstance(model, Model):
        raise InstallError("h3plan.install supports the MiniMax-H3 VAE (diffusers' AutoencoderKLMiniMaxH3) and otherwise "
                         f"supports diffusers' MiniMaxH3Transformer3DModel only; got {name}")
    problems = []
    blocks = getattr(model, "transformer_blocks", None)
    if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
        problems.append("transformer_blocks is missing or empty")
    for i, b in enumerate(blocks or ()):
        if not isinstance(b, Block):
            problems.append(f"transformer_blocks.{i} is {type(b).__name__}")
            continue
        if not isinstance(getattr(b, "attn", None), Attention):
            problems.append(f"transformer_blocks.{i}.attn is not MiniMaxH3Attention")
        for path in ("norm1", "norm2", "adaln_proj", "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                     "attn.norm_q", "attn.norm_k", "ff.net.0.proj", "ff.net.2"):
            try:
                b.get_submodule(path)
            except AttributeError:
                problems.append(f"transformer_blocks.{i}.{path} is missing")
        own = getattr(b.__dict__.get("forward"), "__func__", None) is plan_block_forward
        if "forward" in b.__dict__ and not own:
            problems.append(f"transformer_blocks.{i} already has an instance forward (a hook?); install before hooks")
    for path in ("norm_out", "proj_out", "audio_proj_out"):  # the output heads (sharded under Ulysses, install/shard.py)
        if not isinstance(getattr(model, path, None), torch.nn.Module):
            problems.append(f"{path} is missing")
    if problems:
        raise InstallError("h3plan.install: unexpected MiniMaxH3Transformer3DModel layout: " + "; ".join(problems[:5]))


# The model facts a plan was resolved for that must match the model it is installed into. Layer counts may be
# fewer (the report says so), never more: the plan's memory estimate, AdaLN tables and scale tables count the
# blocks it was resolved for; verify and bench, which build any number of blocks of the plan's width, say stand_in.
MODEL_FACTS = {"transformer": ("model", ("num_attention_heads", "attention_head_dim", "hidden_size", "ffn_dim",
                                         "rope_freq_dim")),
               "vae": ("vae", ("latent_channels", "decoder_num_attention_heads", "decoder_attention_head_dim",
                               "decoder_ffn_mult"))}
LAYER_FACTS = {"transformer": ("num_layers", "num_refiner_layers"), "vae": ("decoder_num_layers",)}


def fewer_layers(model, plan: Plan, kind: str) -> list[str]:
    """`num_layers 2 (plan: 50)` for each layer count of the model below the plan's (an InstallError above it)."""
    section = MODEL_FACTS[kind][0]
    planned = (plan.get(section) or {}).get("diffusers_config") or {}
    config = getattr(model, "config", {}) or {}
    out = []
    for k in LAYER_FACTS[kind]:
        if k not in planned or not isinstance(config.get(k), int):
            continue
        if config[k] > planned[k]:
            raise InstallError(f"the plan was resolved for {planned[k]} {k.replace('_', ' ').removeprefix('num ')} "
                               f"({section}.diffusers_config.{k}={planned[k]}), this {type(model).__name__} has {config[k]}: "
                               f"its memory estimate and tables count {planned[k]}; plan from what you have: "
                               f"h3plan.plan_for(model, recipe=...)")
        if config[k] < planned[k]:
            out.append(f"{k} {config[k]} (plan: {planned[k]})")
    return out


def check_model_facts(model, plan: Plan, kind: str) -> None:
    """InstallError (one line) when the plan's model facts differ from `model.config` (a plan for 56 heads into
    a 4-head model, say); plans without a model section (hand-built ones in tests) are not checked."""

    section, keys = MODEL_FACTS[kind]
    planned = (plan.get(section) or {}).get("diffusers_config") or {}
    config = getattr(model, "config", {}) or {}
    wrong = [f"{k} {planned[k]} (model: {config.get(k)})" for k in keys if k in planned and config.get(k) != planned[k]]
    if wrong:
        name = (plan.get(section) or {}).get("name", "?")
        obj = "vae" if kind == "vae" else "model"
        raise InstallError(f"the plan was resolved for {section}={name}, which does not match this {type(model).__name__}: "
                           + ", ".join(wrong) + f"; plan from what you have: h3plan.plan_for({obj}, recipe=..., parallel=...) "
                           f"reads the widths from its config (a pipeline or a checkpoint folder works too), or "
                           f"h3plan.install({obj}, recipe=...) plans and installs in one call")


def collect(plan: Plan, registry=None) -> Builder:
    """Run every lever's install(builder, decision) in plan order."""
    if registry is None:
        registry = REGISTRY
    builder = Builder()
    for d in plan.decisions:
        if d.lever not in registry:
            raise InstallError(f"plan lever {d.lever!r} has no installer in h3plan.levers.REGISTRY ({sorted(registry)})")
        entry = registry[d.lever]
        builder.settings[d.lever] = d.setting
        getattr(entry, "install", entry)(builder, d)
    return builder


def _swap(report: InstallReport, lever: str, fqn: str, old: str, new: str) -> None:
    s = Swap(lever, fqn, old, new)
    report.swaps.append(s)
    logger.info("%s", s)


def _quantize(model, builder, state) -> None:


    lever, quant = builder.lever_of("quant"), builder.values["quant"]
    fmt, params = quant["format"], quant.get("params") or {}
    replaced, parked, streamed = [], [], []
    for i, block in enumerate(model.transformer_blocks):
        if block.attn.fused_projections:
            raise InstallError(f"gemm_quant: transformer_blocks.{i}.attn uses fused QKV projections; call "
                             "model.unfuse_qkv_projections() before installing (to_qkv is not quantised)")
        news = []
        for path in BLOCK_LINEARS:
            parent_path, _, name = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            old = getattr(parent, name)
            if not isinstance(old, torch.nn.Linear):
                state.report.skipped.append((lever, f"transformer_blocks.{i}.{path} is already {type(old).__name__} "
                                                    "(a pre-quantised checkpoint): kept as loaded"))
                continue
            src = old
            if state.placement is not None and not _placement.same(old.weight.device, state.placement.device):
                src = _placement.stage(old, state.placement.device)  # streamed: the bf16 original stays on the host
                streamed.append(old)
            new = quantized_linear(src, fmt, params)
            del src
            setattr(parent, name, new)
            state.undo.append(lambda p=parent, n=name, o=old: setattr(p, n, o))
            _swap(state.report, lever, f"transformer_blocks.{i}.{path}", type(old).__name__, type(new).__name__)
            replaced.append(old)
            news.append(old)
        # the originals wait on the host until uninstall (install/parking.py), parked block by block so that
        # install needs one block's quantised copies beyond the model as loaded (an 80 GB card holds no more)
        parked.append(park(news))
        state.undo.append(parked[-1].unpark)
    if replaced:
        nbytes = sum(p.nbytes for p in parked)
        kept = sum(_placement.nbytes(m) for m in streamed)
        if streamed:
            where = (f"{kept / 2**30:.2f} GiB, where the model was loaded: each was streamed to "
                     f"{state.placement.device} and quantised there")
            _on_host(state, f"{lever}: the replaced bf16 block linears", kept)
        else:
            where = (f"{nbytes / 2**30:.2f} GiB moved to pinned host memory" if nbytes
                     else "already on the CPU: nothing to move")
        back = "puts them back" if streamed else "copies them back"
        state.report.notes.append(f"{lever}: the {len(replaced)} replaced linears wait on the host until uninstall "
                                  f"({where}); uninstall {back} bit for bit")
    if fmt == "fp8" and params.get("input_scales") == "static":
        _static_inputs(model, params, state)
    if fmt == "nvfp4":
        never, _ = never_ran(lever, "nvfp4", lambda f: f["gemm"]["nvfp4"])
        if never:
            state.report.notes.append(f"gemm_quant=nvfp4: the NVFP4 GEMM (hardware.gemm.nvfp4) never ran on "
                                      f"{', '.join(never)} (hardware.verified.settings.gemm_quant); where the device "
                                      "has no FP4 GEMM every call runs the counted emulation")


def _static_inputs(model, params, state) -> None:
    """gemm_quant=fp8 with a calibrated table (params input_scales=static): every FP8 block linear quantises its
    input with the table's amax * margin (h3plan.facts.scale_table), one pass and no amax, instead of dynamically."""

    table, margin, n = load_table(params["scale_table"], model_config=model.config), float(params["scale_margin"]), 0
    for i, block in enumerate(model.transformer_blocks):
        for path in BLOCK_LINEARS:
            lin = block.get_submodule(path)
            if isinstance(lin, FP8Linear):
                prev = lin.input_amax
                lin.set_static_input(linear_amax(table, f"transformer_blocks.{i}.{path}"), margin)
                state.undo.append(lambda m=lin, p=prev: setattr(m, "input_amax", p))
                n += 1
    state.report.notes.append(f"gemm_quant: {n} FP8 linears quantise their input with static scales from "
                              f"{params['scale_table']} (margin {margin:g})")


def _sequence_amax(model, shard, state) -> None:
    """Under Ulysses every per-tensor FP8 linear of the blocks (quantised here or loaded pre-quantised) scales
    its activation by the amax of the whole sequence (h3plan.runtime.quant.fp8.SequenceAmax), as at degree 1. Per-row
    linears (fp8_act_quant=row) need none: a row's scale is the same at every degree."""

    fn, n = SequenceAmax(shard), 0
    for block in model.transformer_blocks:
        for path in BLOCK_LINEARS:
            lin = block.get_submodule(path)
            if type(lin) is FP8Linear:
                prev, lin.amax_fn = lin.amax_fn, fn
                state.undo.append(lambda m=lin, p=prev: setattr(m, "amax_fn", p))
                n += 1
    if n:
        state.report.notes.append(f"gemm_quant: {n} FP8 linears take their activation amax over the whole sequence "
                                  f"(MAX all-reduce over the Ulysses group, padding rows excluded)")


def _attention_options(builder, report) -> AttentionOptions:
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


def _option_swaps(report, builder, scope: str, values: dict, fqn: str) -> None:
    """One swap per non-default option of `scope` whose lever declared how it is logged (Option.swap)."""

    for key, opt in scope_options(scope).items():
        if opt.swap is None or key not in values:
            continue
        logged = opt.swap(values[key])
        if logged is not None:
            suffix, old, new = logged
            _swap(report, builder.lever_of(key), f"{fqn}{suffix}", old, str(new))


def _static_descales(opts: AttentionOptions, fqns: list[str]) -> dict[str, torch.Tensor]:
    """Per-layer (q, k, v) descales from the static table (h3plan/facts/scale_table.py): descale = amax * margin / 448,
    the inverse of the kernel's scale."""

    table = load(opts.scale_table)
    return {fqn: 1.0 / scale_from_amax(torch.tensor(row_for(table, fqn, opts.scale_table), dtype=torch.float32),
                                       opts.scale_margin) for fqn in fqns}


def _ulysses(model, opts, group, report):
    if opts.ring_degree > 1:  # RingUlysses in the ulysses slot's place (install/ring.py)

        return build_ring(model, opts, group)
    if opts.ulysses_degree == 1:
        if opts.prefix_inplace or opts.a2a_fp8_codes or opts.ulysses_chunks > 1:
            report.skipped.append(("ulysses", "Ulysses degree 1: no sequence sharding, padding or exchange to tune"))
        return None, None


    degree, _ = degree_rank(group)
    if degree != opts.ulysses_degree:
        raise InstallError(f"plan ulysses_degree={opts.ulysses_degree} but the process group has {degree} ranks "
                         "(initialise torch.distributed with that many ranks, or pass group=)")
    padding = "none" if opts.ulysses_padding == "none" else opts.ulysses_padding
    split = opts.ulysses_exchange == "projection_split"
    post = None
    if split:

        post = high_priority_group(group)
    ua = UlyssesAttention(group, chunks=opts.ulysses_chunks, padding=padding, fp8_codes=opts.a2a_fp8_codes,
                          prefix_inplace=opts.prefix_inplace, split_output=split, post_group=post)
    return SequenceShard(group, degree, 0, len(model.transformer_blocks) - 1), ua


def _processors(model, builder, state, group):
    report = state.report
    opts = _attention_options(builder, report)
    backend = for_options(opts)
    kernels = {}
    if opts.qk_norm_rope == "fused":
        kernels["qk_norm_rope"] = load_kernel("qk_norm_rope")
    elif opts.qk_norm_rope == "fused_fp8":
        kernels["qk_norm_rope_fp8"] = load_kernel("qk_norm_rope_fp8")
        if opts.ulysses_degree > 1 and not opts.a2a_fp8_codes:  # bf16 travels; cudnn_fp8 casts after it
            kernels["qk_norm_rope"] = load_kernel("qk_norm_rope")
    fqns = [f"transformer_blocks.{i}.attn" for i in range(len(model.transformer_blocks))]
    static = opts.fp8_scales == "static" and backend_spec(opts.backend).fp8_inputs
    descales = _static_descales(opts, fqns) if static else {}
    shard, ua = _ulysses(model, opts, group, report)
    ring, ua = (ua, None) if opts.ring_degree > 1 else (None, ua)
    lever = builder.lever_of("backend")
    recorded = builder.recorded("attention")
    for fqn, block in zip(fqns, model.transformer_blocks):
        attn = block.attn
        old = attn.processor
        proc = H3PlanAttnProcessor(opts, backend, kernels, old, static_descales=descales.get(fqn), shard=shard, ulysses=ua,
                                   ring=ring)
        attn.set_processor(proc)
        state.undo.append(lambda a=attn, o=old: a.set_processor(o))
        _swap(report, lever, f"{fqn}.processor", type(old).__name__, repr(proc))
        _option_swaps(report, builder, "attention", recorded, fqn)
    report.notes.extend(untested_notes(opts))  # the backend's paths that never ran, from hardware.verified
    return shard


def _forwards(model, builder, state, shard, act_quant="tensor", nvfp4=False):
    recorded = builder.recorded("block")
    if "fp8_act_quant" in recorded:  # row needs FP8 linears to feed (install/fp8_rows.py)
        recorded["fp8_act_quant"] = act_quant
    if "nvfp4_producer_quant" in recorded:  # needs NVFP4 linears to feed (install/nvfp4_inputs.py)
        recorded["nvfp4_producer_quant"] = nvfp4
    opts = BlockOptions(**recorded)
    if not opts.enabled and shard is None:
        return
    kernels = block_kernels(opts)
    for i, block in enumerate(model.transformer_blocks):
        fwd = types.MethodType(plan_block_forward, block)
        block._h3plan_block = (opts, kernels, shard)
        block._h3plan_index = i
        block.forward = fwd

        def undo(b=block):
            for attr in ("forward", "_h3plan_block", "_h3plan_index"):
                b.__dict__.pop(attr, None)

        state.undo.append(undo)
        fqn = f"transformer_blocks.{i}"
        _option_swaps(state.report, builder, "block", recorded, fqn)
        if shard is not None:
            _swap(state.report, "ulysses", f"{fqn}.forward", "full sequence", f"1/{shard.degree} sequence shard")
    if shard is not None:

        state.undo.append(shard_heads(model, shard))
        for fqn in ("norm_out", "proj_out", "audio_proj_out"):
            _swap(state.report, "ulysses", f"{fqn}.forward", "full sequence",
                  f"1/{shard.degree} sequence shard" + (", outputs gathered" if fqn != "norm_out" else ""))


def _skips(plan, builder, report):
    touched = builder.touched
    report.skipped.extend(builder.skipped)
    skipped = {lever for lever, _ in builder.skipped}
    for d in plan.decisions:
        if d.lever not in touched and d.lever not in skipped and not d.enabled:
            report.skipped.append((d.lever, f"setting {d.setting!r}: nothing to install"))
        if d.enabled and d.lever not in touched and d.lever not in skipped:
            report.notes.append(f"{d.lever}={d.setting} is enabled but its install recorded no option")
        if not d.hardware_verified and d.enabled:
            report.notes.append(f"{d.lever}={d.setting} has never run on hardware of the planned kind")
    if builder.recorded("vae"):
        levers = sorted({builder.lever_of(k) for k in builder.recorded("vae")})
        report.skipped.append((", ".join(levers), "VAE options apply to AutoencoderKLMiniMaxH3, not to the transformer "
                                                  "(install the plan into the VAE too)"))


def _on_host(state, what: str, nbytes: int) -> None:
    """Record what a device install left on the host (report.placement)."""
    if state.placement is not None and nbytes:
        state.report.placement.setdefault("host", {})[what] = nbytes


def _streamed(model, builder, is_vae) -> set[int]:
    """ids of the tensors a lever replaces or parks: they reach the device only staged, one at a time."""
    if is_vae:
        return {id(t) for t in _vae.cast_tensors(model, builder)}
    lin = builder.recorded("linears")
    mods = []
    if lin.get("adaln_table") is not None:
        mods += [getattr(b.adaln_proj, "linear", None) for b in model.transformer_blocks] + [getattr(model.norm_out, "linear", None)]
    if lin.get("quant") is not None:
        mods += [b.get_submodule(p) for b in model.transformer_blocks for p in BLOCK_LINEARS]
    return {id(t) for m in mods if type(m) is torch.nn.Linear for t in m.parameters()}


def _place(model, builder, state, device) -> None:
    """install(..., device=): everything but the streamed tensors to the device (placement.py)."""
    placement = _placement.Placement(device)
    state.placement = placement
    state.undo.append(placement.restore)
    placement.move(model, _streamed(model, builder, _vae.is_vae(model)))
    state.report.placement = {"device": str(device), "moved": placement.nbytes, "tensors": len(placement.moved)}


def _placement_note(model, state) -> None:
    p = state.report.placement
    host = p.get("host", {})
    left = sum(t.numel() * t.element_size() for _, t in _placement.tensors(model) if t.device.type == "cpu")
    listed = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in host.items()) or "nothing"
    state.report.notes.append(
        f"placement: {p['moved'] / 2**30:.2f} GiB ({p['tensors']} tensors) moved from the host to {p['device']}; on the host: "
        f"{listed} ({left / 2**30:.2f} GiB of them in state_dict()); uninstall moves everything back to the host")


def install(model, plan: Plan, *, registry=None, group=None, num_inference_steps=None, device=None,
            stand_in: bool = False, adaln_conditions=None) -> InstallReport:
    """Install `plan` into a diffusers MiniMaxH3Transformer3DModel or AutoencoderKLMiniMaxH3; returns the
    InstallReport.

    registry: lever name -> object with install(builder, decision) (default h3plan.levers.REGISTRY).
    group: the torch.distributed group for Ulysses (None: the default group; not used by the VAE).
    num_inference_steps: step counts the adaln_table lever tables beside the plan's (an int or a list).
    device: move a model resting on the host there at install (module docstring); None: install where it is.
    stand_in: the model is a few blocks of the plan's width, any count (verify and bench build them): its layer
    counts are not held to the plan's (otherwise more than the plan's is an InstallError, fewer a report note).
    adaln_conditions: condition flags the adaln_table keys take over the plan's (a pipeline partition's own
    workflows, install/workflows.py); None: the plan's.
    """

    is_vae = _vae.is_vae(model)
    if is_vae:
        _vae.recognise(model)
    else:
        recognise(model)
    if not isinstance(plan, Plan):

        raise InstallError(f"install expects an h3plan Plan or a plan file path, got {type(plan).__name__}")
    check_model_facts(model, plan, "vae" if is_vae else "transformer")
    steps = None if num_inference_steps is None else step_counts(num_inference_steps, "install")
    fewer = [] if stand_in else fewer_layers(model, plan, "vae" if is_vae else "transformer")
    if not is_vae:
        refuse_peft(model)  # install/lora.py: merged weights only
    device = _placement.target(device)
    current = model.__dict__.get(STATE)
    if device is None and current is not None and current.placement is not None:
        device = current.placement.device  # a new plan for a model installed with device=: it stays on that device
    if device is not None:
        _placement.check(model, device, type(model).__name__)
    if current is not None:
        if current.plan == plan:
            logger.info("plan already installed; nothing to do")
            return current.report
        uninstall(model)
    builder = collect(plan, registry)
    report = InstallReport(levers=[d.lever for d in plan.decisions],
                           options={scope: builder.recorded(scope) for scope in ("linears", "block", "attention", "vae", "transformer")})
    state = _State(plan, report)
    try:
        if device is not None:
            _place(model, builder, state, device)
        if is_vae:
            _vae.apply(model, builder, state, group)
        else:
            if builder.recorded("linears").get("quant") is not None:
                _quantize(model, builder, state)
            if builder.recorded("linears").get("adaln_table") is not None:  # install/adaln_table.py

                build_adaln_tables(model, {**builder.values["adaln_table"], **(adaln_conditions or {})}, state,
                                   lambda *a: _swap(state.report, *a), steps)
            act_quant = install_rows(model, builder, state, lambda *a: _swap(state.report, *a))
            nvfp4 = install_nvfp4(model, builder, state, lambda *a: _swap(state.report, *a))
            shard = _processors(model, builder, state, group) if builder.recorded("attention") else None
            if shard is not None:
                _sequence_amax(model, shard, state)
            _forwards(model, builder, state, shard, act_quant, nvfp4)
            if builder.values.get("compile") == "regional":
                _compile(model, builder, state)
            if builder.recorded("transformer").get("step_cache") is not None:  # install/step_cache.py
                steps = [num_inference_steps] if isinstance(num_inference_steps, int) else num_inference_steps
                install_step_cache(model, builder.values["step_cache"], state, lambda *a: _swap(state.report, *a),
                                   group=getattr(shard, "group", None), steps=steps)
            lora_guard(model, state)
    except BaseException:
        _undo(state)
        raise
    if is_vae:
        _vae.skips(plan, builder, report)
        if group is not None and not builder.values.get("parallel"):
            report.notes.append("group= is for the transformer's Ulysses attention and vae_parallel; this plan uses neither on the VAE")
    else:
        _skips(plan, builder, report)
    if fewer:
        report.notes.append("fewer layers than the plan's: " + ", ".join(fewer) + "; the plan's memory and speed numbers "
                            "are for its own count")
    if device is not None:
        _placement_note(model, state)
    elif _rests_on_host(model):
        report.notes.append("the model rests on the host and stays there: install(model, plan, device=\"cuda\") moves "
                            "it to the GPU at install, a tensor at a time (what an 80 GB card needs)")
    setattr(model, STATE, state)
    return report


def _rests_on_host(model) -> bool:
    return torch.cuda.is_available() and all(t.device.type == "cpu" for _, t in _placement.tensors(model))


def _compile(model, builder, state) -> None:
    """compile=regional: diffusers' compile_repeated_blocks(fullgraph=True) over the installed blocks; uninstall
    drops the compiled callables (the blocks run uncompiled again)."""
    model.compile_repeated_blocks(fullgraph=True)
    blocks = [m for m in model.modules() if type(m).__name__ in (model._repeated_blocks or ())]

    def undo():
        for b in blocks:
            b._compiled_call_impl = None

    state.undo.append(undo)
    _swap(state.report, builder.lever_of("compile"), "transformer_blocks", "eager forward",
          f"torch.compile regional, fullgraph ({len(blocks)} blocks)")


def _undo(state: _State) -> None:
    while state.undo:
        state.undo.pop()()


def uninstall(model) -> bool:
    """Restore the model exactly as it was before install; False when nothing was installed."""
    state = model.__dict__.pop(STATE, None)
    if state is None:
        return False
    _undo(state)
    logger.info("uninstalled %d swaps", len(state.report.swaps))
    return True


def installed_plan(model) -> Plan | None:
    state = model.__dict__.get(STATE)
    return None if state is None else state.plan
