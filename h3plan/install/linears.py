"""The block linears' install (scope `linears`): gemm_quant's quantised GEMMs (`quantize`), their static input
scales from a calibrated table (`static_inputs`), the whole sequence's activation amax under Ulysses
(`sequence_amax`), and which linears a device install only streams (`streamed`). The AdaLN linears' tables are
install/adaln_table.py; per-row FP8 and NVFP4 inputs their levers' input steps (Spec.input_step)."""

from __future__ import annotations

import functools
from fnmatch import fnmatchcase

import torch

from h3plan.errors import InstallError
from h3plan.facts.hardware import never_ran
from h3plan.facts.scale_table import linear_amax, load_table
from h3plan.levers import SPECS, owner
from h3plan.runtime.quant import BLOCK_LINEARS, quantized_linear
from h3plan.runtime.quant.fp8 import FP8Linear, SequenceAmax

from . import placement as _placement
from .hooks import effect, foreign
from .parking import park

STREAMED = ("parks", "replaces")  # StateKeys kinds whose tensors a device install never moves whole


def quantize(model, builder, state) -> None:
    """gemm_quant: the six block linears of every block as its quantised linears (h3plan.runtime.quant); the
    originals parked on the host until uninstall (install/parking.py), or streamed from there under device=."""
    lever, quant = builder.lever_of("quant"), builder.view("linears").quant
    fmt, params = quant["format"], quant.get("params") or {}
    replaced, parked, staged = [], [], []
    _refuse_hooked(model, lever)
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
                staged.append(old)
            new = quantized_linear(src, fmt, params)
            del src
            effect(parent, lever, state, functools.partial(setattr, parent, name, old),
                   apply=functools.partial(setattr, parent, name, new), part=name)
            state.report.swap(lever, f"transformer_blocks.{i}.{path}", type(old).__name__, type(new).__name__)
            replaced.append(old)
            news.append(old)
        # the originals wait on the host until uninstall (install/parking.py), parked block by block so that
        # install needs one block's quantised copies beyond the model as loaded (an 80 GB card holds no more)
        parked.append(park(news))
        effect(block, lever, state, parked[-1].unpark, part="parked")
    if replaced:
        nbytes = sum(p.nbytes for p in parked)
        kept = sum(_placement.nbytes(m) for m in staged)
        if staged:
            where = (f"{kept / 2**30:.2f} GiB, where the model was loaded: each was streamed to "
                     f"{state.placement.device} and quantised there")
            _placement.on_host(state, f"{lever}: the replaced bf16 block linears", kept)
        else:
            where = (f"{nbytes / 2**30:.2f} GiB moved to pinned host memory" if nbytes
                     else "already on the CPU: nothing to move")
        back = "puts them back" if staged else "copies them back"
        state.report.notes.append(f"{lever}: the {len(replaced)} replaced linears wait on the host until uninstall "
                                  f"({where}); uninstall {back} bit for bit")
    if fmt == "fp8" and params.get("input_scales") == "static":
        static_inputs(model, params, state)
    if fmt == "nvfp4":
        never, _ = never_ran(lever, "nvfp4", lambda f: f["gemm"]["nvfp4"])
        if never:
            state.report.notes.append(f"gemm_quant=nvfp4: the NVFP4 GEMM (hardware.gemm.nvfp4) never ran on "
                                      f"{', '.join(never)} (hardware.verified.settings.gemm_quant); where the device "
                                      "has no FP4 GEMM every call runs the counted emulation")


def _refuse_hooked(model, lever: str) -> None:
    """A block linear carrying a user's diffusers hook (leaf-level group offloading, a cache) would lose it with the
    swap, and the quantised linear would run without it: one InstallError naming the first such hook."""
    for i, block in enumerate(model.transformer_blocks):
        for path in BLOCK_LINEARS:
            theirs = foreign(block.get_submodule(path))
            if theirs:
                raise InstallError(f"{lever}: transformer_blocks.{i}.{path} carries the diffusers hook "
                                   f"{theirs[-1]!r}, which the swap to the plan's quantised linear would leave "
                                   "behind; remove it before install, or apply it after install")


def static_inputs(model, params, state) -> None:
    """gemm_quant=fp8 with a calibrated table (params input_scales=static): every FP8 block linear quantises its
    input with the table's amax * margin (h3plan.facts.scale_table), one pass and no amax, instead of dynamically."""

    table, margin, n = load_table(params["scale_table"], model_config=model.config), float(params["scale_margin"]), 0
    for i, block in enumerate(model.transformer_blocks):
        for path in BLOCK_LINEARS:
            lin = block.get_submodule(path)
            if isinstance(lin, FP8Linear):
                effect(lin, owner("quant"), state, functools.partial(setattr, lin, "input_amax", lin.input_amax),
                       apply=functools.partial(lin.set_static_input,
                                               linear_amax(table, f"transformer_blocks.{i}.{path}"), margin),
                       part="input_amax")
                n += 1
    state.report.notes.append(f"gemm_quant: {n} FP8 linears quantise their input with static scales from "
                              f"{params['scale_table']} (margin {margin:g})")


def sequence_amax(model, shard, state) -> None:
    """Under Ulysses every per-tensor FP8 linear of the blocks (quantised here or loaded pre-quantised) scales
    its activation by the amax of the whole sequence (h3plan.runtime.quant.fp8.SequenceAmax), as at degree 1. Per-row
    linears (fp8_act_quant=row) need none: a row's scale is the same at every degree."""

    fn, n = SequenceAmax(shard), 0
    for block in model.transformer_blocks:
        for path in BLOCK_LINEARS:
            lin = block.get_submodule(path)
            if type(lin) is FP8Linear:
                # FP8Linear declares it None (its own amax) until here
                effect(lin, owner("ulysses_degree"), state, functools.partial(setattr, lin, "amax_fn", lin.amax_fn),
                       apply=functools.partial(setattr, lin, "amax_fn", fn), part="amax_fn")
                n += 1
    if n:
        state.report.notes.append(f"gemm_quant: {n} FP8 linears take their activation amax over the whole sequence "
                                  f"(MAX all-reduce over the Ulysses group, padding rows excluded)")


def streamed(model, builder) -> list:
    """The tensors of the linears whose state the plan's settings park or replace (each lever's `Spec.state`: the AdaLN
    linears under the tables, the block linears quantised at install): under device= they reach the device only
    staged, one at a time (placement.py). A declared key names its module less its last part (the parameter); every
    parameter of such a module that is still a plain nn.Linear (not a pre-quantised or PEFT-wrapped one) is streamed."""
    modules = [k.rpartition(".")[0] for lever, setting in builder.settings.items() if lever in SPECS
               and SPECS[lever].model == "transformer" for sk in SPECS[lever].state.get(setting, ())
               if sk.kind in STREAMED for k in sk.keys]
    mods = [m for name, m in model.named_modules() if any(fnmatchcase(name, p) for p in modules)]
    return [t for m in mods if type(m) is torch.nn.Linear for t in m.parameters()]
