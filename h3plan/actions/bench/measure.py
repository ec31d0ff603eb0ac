"""The block bench (`action=bench`, bench.target=block): diffusers eager against the installed plan, side by side
in one process; options, models, inputs, one (S, blocks) configuration, run().

Scope: one device, Ulysses degree 1 (degree > 1 is refused; benchmarks/parallel.py times diffusers' context
parallelism against the plan there). For every S in `bench.seq_lens`:
  - attention alone at the per-rank shape (1, S, heads, head_dim), random bf16 q/k/v: the plan's
    backend called directly against diffusers' default `dispatch_attention_fn`;
  - a stack of n transformer blocks for every n in `bench.blocks` (real width from `model`): diffusers'
    eager blocks against the same blocks with the plan installed, same inputs, repetitions
    interleaved (eager, plan, plan, eager, ...), `bench.warmup` untimed rounds, median of
    `bench.iters`; while the plan runs, device events around its backend calls give the time of
    attention inside the plan, compared with that backend on clones of the same arguments;
  - with `bench.best` (on by default): diffusers' best one-GPU setting in the same rounds, a deep copy of the
    eager blocks under `compile_repeated_blocks(fullgraph=True)` (diffusers_best.py, the pipeline
    bench's best too; static shapes per S). Its first call at each (S, blocks) compiles and is timed apart
    (best_first_call_s), the warm-up rounds follow, then best_ms; speedup_vs_best = best_ms / plan_ms. A
    failing compile is recorded (best_error) and eager and the plan are timed without it.
Correctness rides along: the plan's stack output against diffusers eager with the plan's attention
backend (bitwise; lossless attention backends only) and against diffusers' default eager (relative
Frobenius error, fp32). Timing: CUDA events around each repetition, synchronized. On a CPU the same
code runs with host clocks, the files say the times mean nothing, and only the plumbing is proven.

Output, in `bench.out_dir` (null: outputs/<date>/<time>, a folder of the run's own): block-<tag>.json (records
merged by (plan, S, blocks, device), so a second invocation with another recipe into the same folder appends),
block-<tag>.md and block-<tag>.png (matplotlib; without it the PNG is skipped with a message and
`benchmarks/plot.py` draws it later from the JSON). <tag>: `bench.tag`, else the device's short name (`h200`,
`cpu`). JSON and markdown are rewritten after every configuration, so a run cut off by a timeout keeps what it
measured.

Models: one seeded diffusers model with max(bench.blocks) blocks (h3plan.actions.inputs; with model.path, the
checkpoint's first blocks), a deep copy with the plan installed, (for a lossless attention backend) a deep copy
with only the plan's attention levers installed, the bitwise reference, and (bench.best) a deep copy regionally
compiled, diffusers' best (diffusers_best.py). Inputs: the model's own forward is run up to its first block on a
realistic packed sequence and stopped there, so the blocks see exactly what diffusers hands them.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

from h3plan import prepare
from h3plan.actions import inputs
from h3plan.runtime.attention.base import AttentionBackend
from h3plan.errors import UsageError
from h3plan.install import counters, install, reset_counters

from . import records
from .diffusers_best import compile_call, regional_compile
from .harness import (HOST_CLOCK_NOTE, Output, Session, device_name, device_tag, free, plan_label,
                      run_meta, same_backend_plan, sigterm_as_interrupt)
from .records import LOSSLESS_BACKENDS, BlockRecord, merge_record
from .results_file import run_folder
from ..gpu_only import BENCH_SMOKE as CPU_SMOKE, CPU_MAX_HIDDEN, bench_too_wide
from .tables import one_line
from .timing import BackendTimer, Progress, back_to_back, interleaved, median

CPU_MAX_ROWS = 1024


@dataclass(frozen=True)
class BenchOptions:
    seq_lens: tuple[int, ...]
    blocks: tuple[int, ...]
    warmup: int
    iters: int
    out_dir: str
    tag: str | None
    best: bool = True
    """Time diffusers' best setting (regional compile of a deep copy of the eager model) beside eager and the plan."""


def options(cfg) -> BenchOptions:
    """`cfg.bench` as BenchOptions (the values were checked with the config:
    h3plan.planning.action_configs.validate_actions)."""
    b = cfg["bench"] if isinstance(cfg, Mapping) else cfg.bench

    def ints(key):
        vals = b[key]
        return (vals,) if isinstance(vals, int) else tuple(vals)

    tag = b.get("tag") if hasattr(b, "get") else None
    best = b.get("best", True) if hasattr(b, "get") else True
    out = b.get("out_dir") if hasattr(b, "get") else None
    return BenchOptions(ints("seq_lens"), ints("blocks"), int(b["warmup"]), int(b["iters"]), run_folder(out), tag,
                        bool(best))


# ---------------------------------------------------------------- models and inputs


class _Captured(Exception):
    pass


def capture_block_inputs(torch, model, model_inputs: Mapping[str, Any]) -> tuple:
    """(hidden_states, temb, adaln_indices, rotary_emb) exactly as the model hands them to its first
    block: the model's own forward runs up to block 0 and a pre-hook stops it there."""
    box = {}

    def hook(module, args, kwargs):
        names = ("hidden_states", "temb", "adaln_indices", "rotary_emb")
        vals = dict(zip(names, args))
        vals.update({k: v for k, v in kwargs.items() if k in names})
        box["inputs"] = tuple(vals[n] for n in names)
        raise _Captured

    handle = model.transformer_blocks[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**model_inputs)
    except _Captured:
        pass
    finally:
        handle.remove()
    if "inputs" not in box:
        raise RuntimeError("the model's forward never reached transformer_blocks[0]")
    return box["inputs"]


def run_stack(blocks, hidden_states, temb, adaln_indices, rotary_emb):
    for block in blocks:
        hidden_states = block(hidden_states, temb, adaln_indices, rotary_emb)
    return hidden_states


def rel_error(torch, out, ref) -> tuple[float, float]:
    """(||out - ref|| / ||ref||, max |out - ref|), fp32 Frobenius."""
    d = out.float() - ref.float()
    return (d.norm() / ref.float().norm().clamp_min(1e-30)).item(), d.abs().max().item()


# ---------------------------------------------------------------- the run


@dataclass
class _Session(Session):
    """The block bench's session: the models (eager, the plan, the bitwise reference, diffusers' best) and the
    in-plan attention timer."""

    label: str
    recipe: str
    lossless: bool
    backend_name: str
    eager: Any
    plan: Any
    same: Any
    same_note: str
    backend: Any
    timer: BackendTimer
    heads: int
    head_dim: int
    model_inputs: Callable[[int], Mapping[str, Any]]
    best: Any = None
    best_config: str = ""


def plan_backend(model):
    """The AttentionBackend the installed processors call (one object shared by the blocks), or None."""
    for block in model.transformer_blocks:
        backend = getattr(block.attn.processor, "backend", None)
        if isinstance(backend, AttentionBackend):
            return backend
    return None


def _setup(torch, cfg, plan, opts: BenchOptions, device, progress: Progress) -> _Session:
    n = max(opts.blocks)
    path = cfg["model"].get("path")  # model.path: the checkpoint's weights, loaded with from_pretrained
    if path:
        eager = inputs.load_model(path, blocks=n, device=device, dtype="bf16")
        dc = dict(eager.config)
    else:
        dc = cfg["model"]["diffusers_config"]
        eager = inputs.build_model(dc, blocks=n, device=device, dtype="bf16", seed=0)
    plan_model = copy.deepcopy(eager)
    report = install(plan_model, plan, stand_in=True)

    prepare(plan_model, timesteps=[inputs.TIMESTEP])  # adaln_table: the bench inputs' timesteps (no-op without a table)
    progress.write(f"installed {plan_label(plan)}:\n{report}")
    backend_name = plan.decision("attention").setting
    if backend_name in LOSSLESS_BACKENDS:
        same = copy.deepcopy(eager)
        install(same, same_backend_plan(plan), stand_in=True)
        same_note = f"diffusers eager blocks with the {backend_name} backend, every other lever off"
    else:
        same, same_note = None, f"none: {backend_name} is lossy, no eager block runs it"
    timer = BackendTimer(torch, device.type == "cuda")
    backend = plan_backend(plan_model)
    if backend is not None:
        timer.attach(backend)
    best, best_config = (None, "not run (bench.best=off)")
    if opts.best:
        best, best_config = _best_model(copy, eager, len(opts.seq_lens))
    recipe = plan.get("recipe")
    return _Session(torch, device, opts, progress, plan_label(plan), str(recipe.get("name", "")),
                    bool(plan.lossless), backend_name, eager, plan_model, same, same_note, backend, timer,
                    int(dc["num_attention_heads"]) // int(plan.get("parallel").get("ulysses", 1)),
                    int(dc["attention_head_dim"]),
                    lambda S: inputs.packed_inputs(dc, S, seed=0, device=device), best, best_config)


def _best_model(copy, eager, lengths: int) -> tuple[Any, str]:
    """diffusers' best one-GPU setting: a deep copy of the eager model, its blocks regionally compiled.

    dynamic=False: every S gets the static graph a user generating at that one length gets (without it, the
    second length of a run would recompile with symbolic shapes: another program than the first length's).
    One graph per S, so dynamo's recompile limit is raised to cover them: past it dynamo would run the
    blocks uncompiled, unannounced, and eager would be timed under the best's name."""
    import torch
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, lengths + 1)
    best = copy.deepcopy(eager)
    regional_compile(best, dynamic=False)
    attention = _AttentionBackendRegistry._active_backend.value
    return best, f"{compile_call('model', dynamic=False)}; diffusers' default attention ({attention})"


def _attention_alone(s: _Session, S: int) -> dict:
    """The plan's backend against diffusers' default dispatch on random bf16 (1, S, H, D) q/k/v."""
    torch = s.torch
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    shape = (1, S, s.heads, s.head_dim)
    g = torch.Generator(device=s.device).manual_seed(S)
    q, k, v = (torch.randn(shape, generator=g, device=s.device, dtype=torch.bfloat16) for _ in range(3))
    fns = {"default": lambda: dispatch_attention_fn(q, k, v, dropout_p=0.0, is_causal=False)}
    why = "the plan installed no attention backend" if s.backend is None else s.backend.unavailable_reason(q, k, v)
    if why is None:
        call = s.timer.original(s.backend)
        fns["plan"] = lambda: call(q, k, v)
    with torch.no_grad():
        times = interleaved(s.clock, fns, s.opts.warmup, s.opts.iters, s.progress, f"S={S} attention")
    if why is not None:
        s.progress.write(f"S={S}: {s.backend_name} not timed alone: {why}")
    return {"attention_shape": list(shape), "attention_default_ms": median(times["default"]),
            "attention_ms": median(times.get("plan", [])), "attention_note": why}


def _stack_record(s: _Session, S: int, n: int, block_in: tuple, attn: dict) -> BlockRecord:
    torch = s.torch
    eb, pb = s.eager.transformer_blocks[:n], s.plan.transformer_blocks[:n]
    run_e = lambda: run_stack(eb, *block_in)  # noqa: E731
    run_p = lambda: run_stack(pb, *block_in)  # noqa: E731
    rec = BlockRecord(S=S, blocks=n, plan=s.label, eager_ms=None, plan_ms=None, speedup=None,
                      attention_ms=attn["attention_ms"], attention_backend=s.backend_name, bitwise_equal=None,
                      rel_error=None, recipe=s.recipe, lossless=s.lossless, device=device_name(torch, s.device),
                      timing=s.clock.kind, attention_shape=attn["attention_shape"],
                      attention_default_ms=attn["attention_default_ms"], bitwise_reference=s.same_note,
                      best_config=s.best_config)
    pristine = block_in[0].clone()  # every repetition must see the same input: nothing may write into it
    with torch.no_grad():
        ref = run_e()
        s.timer.capture = True
        out = run_p()
        rec.rel_error, rec.max_abs_error = rel_error(torch, out, ref)
        if s.same is not None:
            same = run_stack(s.same.transformer_blocks[:n], *block_in)
            rec.bitwise_equal = bool(torch.equal(out, same))
            rec.backend_rel_error = rel_error(torch, same, ref)[0]
            del same
        s.progress.step(f"S={S} x{n} correctness")
        fns = {"eager": run_e, "plan": run_p}
        if s.best is not None:
            run_b = _first_best_call(s, rec, S, n, block_in, ref)
            if run_b is not None:
                fns["best"] = run_b
        del out, ref
        interleaved(s.clock, fns, s.opts.warmup, 0, s.progress, f"S={S} x{n} blocks")
        s.timer.drain_ms()
        reset_counters()
        times = interleaved(s.clock, fns, 0, s.opts.iters, s.progress, f"S={S} x{n} blocks")
        rec.counters = counters()
        in_plan = s.timer.drain_ms()
        rec.eager_ms, rec.plan_ms = median(times["eager"]), median(times["plan"])
        rec.eager_ms_range = [min(times["eager"]), max(times["eager"])]
        rec.plan_ms_range = [min(times["plan"]), max(times["plan"])]
        rec.speedup = rec.eager_ms / rec.plan_ms if rec.plan_ms else None
        if "best" in times:
            rec.best_ms, rec.best_ms_range = median(times["best"]), [min(times["best"]), max(times["best"])]
            rec.speedup_vs_best = rec.best_ms / rec.plan_ms if rec.plan_ms else None
        rec.attention_in_plan_ms = median(in_plan)
        cap, s.timer.captured, s.timer.capture = s.timer.captured, None, False
        if cap is not None:
            backend, args, kwargs = cap
            call = s.timer.original(backend)
            alone = back_to_back(s.clock, lambda: call(*args, **kwargs), s.opts.warmup, s.opts.iters, s.progress,
                                 f"S={S} x{n} attention standalone")
            rec.attention_standalone_ms = median(alone)
            # the same call with a whole plan forward (untimed) just ahead of each: the GPU in the state
            # (clock, power, caches) that the plan's own attention call meets
            after = back_to_back(s.clock, lambda: call(*args, **kwargs), 0, s.opts.iters, s.progress,
                                 f"S={S} x{n} attention after a plan forward", before=run_p)
            rec.attention_after_forward_ms = median(after)
            del args, kwargs, cap
        else:
            s.progress.step(f"S={S} x{n}: the plan never called its backend", s.opts.warmup + 2 * s.opts.iters)
        if rec.attention_standalone_ms and rec.attention_in_plan_ms:
            rec.attention_in_plan_fraction = rec.attention_standalone_ms / rec.attention_in_plan_ms
        if rec.attention_after_forward_ms and rec.attention_in_plan_ms:
            rec.attention_in_plan_fraction_matched = rec.attention_after_forward_ms / rec.attention_in_plan_ms
        if not torch.equal(pristine, block_in[0]):
            raise RuntimeError("the block input changed during the repetitions (an in-place write): "
                               "times and errors invalid")
    fallbacks = {k: v for k, v in rec.counters.items() if k.endswith(".fallback")}
    if fallbacks:
        s.progress.write(f"S={S} x{n}: guarded calls fell back while timed: {fallbacks}")
    return rec


def _first_best_call(s: _Session, rec: BlockRecord, S: int, n: int, block_in: tuple, ref):
    """diffusers' best, first call at this (S, n): its time (the compile, or a recompile for a new S, included)
    and its error against eager. Returns the timed callable, or None when it failed: the failure is recorded
    (best_error) and eager and the plan are timed without it."""
    bb = s.best.transformer_blocks[:n]
    run_b = lambda: run_stack(bb, *block_in)  # noqa: E731
    try:
        box = {}
        rec.best_first_call_s = s.clock(lambda: box.setdefault("out", run_b())) / 1e3
        rec.best_rel_error, rec.best_max_abs_error = rel_error(s.torch, box.pop("out"), ref)
    except Exception as exc:  # noqa: BLE001 -- recorded; the plan is judged against eager without it
        inner = getattr(exc, "inner_exception", None)  # dynamo's BackendCompilerFailed puts the cause on line 2
        rec.best_error = one_line(exc) + ("" if inner is None else f" {one_line(inner)}")
        s.progress.write(f"S={S} x{n}: diffusers' best failed: {rec.best_error}")
        return None
    finally:
        s.progress.step(f"S={S} x{n} best first call (compile)")
    s.progress.write(f"S={S} x{n}: diffusers' best first call (compile included) {rec.best_first_call_s:.1f} s")
    return run_b


def _steps(opts: BenchOptions) -> int:
    r = opts.warmup + opts.iters
    return len(opts.seq_lens) * (r + len(opts.blocks) * (1 + int(opts.best) + 2 * r + opts.iters))


def _run_meta(torch, device, label, opts) -> dict:
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    meta = run_meta(torch, device, {"plan": label},
                    {"diffusers_attention": str(_AttentionBackendRegistry._active_backend.value),
                     "warmup": opts.warmup, "iters": opts.iters, "seq_lens": list(opts.seq_lens),
                     "blocks": list(opts.blocks), "best": opts.best})
    if device.type == "cuda":
        meta["cudnn"] = torch.backends.cudnn.version()
    return meta


def _measure(torch, cfg, plan, opts: BenchOptions, device, progress: Progress, out: Output, label: str,
             name: str) -> int:
    """Every (S, blocks) configuration, each record merged and the files rewritten after it; the failures."""
    doc, failed = out.doc, 0
    s = _setup(torch, cfg, plan, opts, device, progress)
    for S in opts.seq_lens:
        block_in = attn = None
        try:
            block_in = capture_block_inputs(torch, s.eager, s.model_inputs(S))
            attn = _attention_alone(s, S)
        except Exception as exc:  # noqa: BLE001 -- recorded, the other lengths still run
            err = one_line(exc)
            for n in opts.blocks:
                merge_record(doc, asdict(BlockRecord(S, n, label, None, None, None, None, s.backend_name, None, None,
                                                     recipe=s.recipe, lossless=s.lossless, device=name, error=err)))
            failed += len(opts.blocks)
            progress.write(f"S={S}: failed: {err}")
        for n in opts.blocks if attn is not None else ():
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            try:
                rec = _stack_record(s, S, n, block_in, attn)
                if device.type == "cuda":
                    rec.peak_mem_gib = torch.cuda.max_memory_allocated(device) / 2**30
            except Exception as exc:  # noqa: BLE001 -- recorded, the other configurations still run
                err = one_line(exc)
                rec = BlockRecord(S, n, label, None, None, None, attn["attention_ms"], s.backend_name, None, None,
                                  recipe=s.recipe, lossless=s.lossless, device=name, error=err)
                s.timer.captured, s.timer.capture = None, False
                s.timer.events = []
                failed += 1
                progress.write(f"S={S} x{n}: failed: {err}")
            merge_record(doc, asdict(rec))
            out.write()
            free(torch)
        del block_in
        free(torch)
    s.timer.detach()
    return failed


def run(cfg, plan) -> int:
    """The block bench (`python -m h3plan action=bench`, bench.target=block); 0 when every configuration ran,
    1 otherwise."""
    opts = options(cfg)
    u = int(plan.get("parallel").get("ulysses", 1))
    if u != 1:
        raise UsageError(f"parallel.ulysses={u}: action=bench times one device; use parallel=u1")
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    hidden = int(plan.get("model")["diffusers_config"]["hidden_size"])
    if device.type != "cuda" and hidden > CPU_MAX_HIDDEN:
        raise UsageError(bench_too_wide(hidden))
    if device.type != "cuda" and max(opts.seq_lens) > CPU_MAX_ROWS:
        raise UsageError(f"bench.seq_lens={list(opts.seq_lens)}: at most {CPU_MAX_ROWS:,} rows on the CPU (the "
                         f"defaults are GPU lengths, minutes to hours here): the smoke form is {CPU_SMOKE}")
    name = device_name(torch, device)
    out = Output(records, opts.out_dir, "block", opts.tag or device_tag(name))
    label = plan_label(plan)
    if device.type != "cuda":
        print(HOST_CLOCK_NOTE, flush=True)
    out.add_run(_run_meta(torch, device, label, opts))
    progress = Progress(_steps(opts), f"bench {label}")
    with sigterm_as_interrupt():
        try:
            failed = _measure(torch, cfg, plan, opts, device, progress, out, label, name)
        finally:
            progress.close()
            out.write()
            why = out.chart()
    out.report([r for r in out.doc["records"] if r["plan"] == label and r.get("device") == name], why)
    return 1 if failed else 0
