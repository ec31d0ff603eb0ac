"""`python -m h3plan action=bench bench.target=pipeline`: the call users make, timed as they make it.

What runs: diffusers' MiniMaxH3ModularPipeline (actions/pipeline_build.py: diffusers' own `MiniMaxH3CoreDenoiseStep`
and `MiniMaxH3DecodeStep`, seeded random weights), called exactly as diffusers documents it:

    pipe(prompt_embeds=..., text_token_tags=..., height=H, width=W, num_frames=F, num_inference_steps=N,
         generator=..., output_type="pt", output="videos")

with no autocast and the VAE in its own dtype, for every row of one run on ONE pipeline (the settings switch in
place: pipeline_settings.py). `bench.pipeline.workflow` picks the request: t2va (above), fl2va (`image` and
`last_image`, seeded keyframes at the request's size) or ref2va (`references`: one seeded image reference, resized
by diffusers to its 2048 px short edge), through diffusers' auto blocks less the text encoder step, the pipeline
holding only the partition that workflow runs; the encodes are part of the call (in `rest`), S counts the
conditioning rows (read from the first forward). Rows:
- for each VAE precision in `bench.pipeline.vae` (auto: fp32, diffusers' default, plus every plan's own decode
  precision): diffusers eager, and diffusers' best (`compile_repeated_blocks(fullgraph=True)`; context parallel
  + compile at U > 1), the VAE cast as `from_pretrained(torch_dtype=...)` casts it;
- the plan (and each of `bench.pipeline.plans`, override sets resolved beside it), `h3plan.install(pipe, plan)`;
- for a plan whose levers are lossless apart from its decode precision, `reference` (unless
  bench.pipeline.reference=false), run right before it: diffusers eager with the plan's attention backend and VAE
  precision, whose frames the plan's must equal bit for bit (none for attention=sdpa: diffusers eager is that
  reference);
- bench.pipeline.stock_bits=true: the stock-bits plan too, the lossless plan with levers.attention=sdpa
  (diffusers' default attention), its frames against diffusers eager's.

Timing: each transformer forward between CUDA events (a forward pre-hook and hook), the whole call by wall clock
(synchronised before and after). N = warmup + steps + 1 (MiniMaxH3Scheduler counts the terminal sigma); the first
`warmup` forwards of every call are dropped (compile, kernel JIT; diffusers' first step has another temb shape,
so a compiled model traces twice). rest = wall - all forwards (layout, noise, scheduler updates, the video and
audio decode, postprocess); E2E = steps_e2e x median forward + rest, steps_e2e the forwards of the pipeline's
default num_inference_steps (50 -> 49). Before its timed call each row decodes once, untimed, a latent with the
request's tile and clip shapes but fewer frames (decode_warmup): cuBLAS and the allocator warm, the plan's CUDA
graphs captured, as in a serving process; compile and capture are not part of any timed call. `rounds` timed
calls per row, the row order reversed every round (interleaved).

Correctness: each row's frames against diffusers eager with the same VAE precision (PSNR/SSIM, quality.py);
a plan with a reference row: bitwise against it.

Prompt (bench.pipeline.prompt=true): every row calls `pipe(prompt="...", ...)` instead, through diffusers' own text
encoder step (`MiniMaxH3AutoTextEncoderStep`) and a seeded Qwen3-VL at the model's packaged widths with a local
byte-level tokenizer (actions/text_encoder_build.py), one text row per prompt byte; the conditioner sits where the
plan's memory.text_encoder puts it (install/text_encoder.py: resident, offload_after, host), the same for every row,
so each row's rest, E2E and peak include the encode and its moves.

Config: `video`; `bench.pipeline.{text_tokens, warmup, steps, rounds, decode_warmup, best, compile_backend,
cp_backend, e2e_steps, layers, vae, plans, reference, seed, workflow, prompt}` (DEFAULTS; missing keys take them, so a
plain dict config works too); `bench.out_dir`, `bench.tag`.

Output (rank 0), in bench.out_dir: pipeline-<tag>.json (one record per row, a new run appends), .md and .png
(pipeline_records.py), rewritten after every row. U > 1: launch U processes with torchrun
(`torchrun --nproc_per_node=U -m h3plan action=bench bench.target=pipeline parallel=uU ...`).
On a CPU only the tiny smoke form runs (CPU_SMOKE: model=h3_tiny vae=h3_tiny_pipe on a 32x32 canvas): host clock,
plumbing only.
"""

from __future__ import annotations

import gc
import os
import re
import statistics
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from h3plan.errors import UsageError
from h3plan.facts.workflows import PARTITION, TASKS
from h3plan.planner import resolve
from h3plan.planning.action_configs import PipelineBenchConfig  # bench.pipeline.*: one definition, the schema's
from h3plan.planning.config import compose
from h3plan.install import of_lever
from h3plan.install.text_encoder import placed as placed_text_encoder
from h3plan.runtime.counters import counters, reset_counters

from ..quality import compare
from ..pipeline_build import (Request, build_pipeline, default_request, default_steps, denoiser,
                              prompt_inputs, prompt_text, require_transformers, resolved, sequence_length,
                              workflow_blocks, workflow_inputs)
from . import pipeline_checks as checks, pipeline_frames as stored, pipeline_records as records
from .harness import (HOST_CLOCK_NOTE, Output, Session, device_name, device_tag, run_meta,
                      free, sigterm_as_interrupt)
from .diffusers_best import compile_call
from .pipeline_settings import Best, Eager, PlanSetting, Reference, Setting, plan_precision, row_label
from .roles import BACKEND, DECODE_PRECISION, STEP_CACHE
from .results_file import run_folder
from ..gpu_only import CPU_MAX_HIDDEN, PIPELINE_SMOKE as CPU_SMOKE, pipeline_too_wide, vae_width
from .tables import one_line
from .timing import Clock, ForwardTimer, Progress, Quiet


def _defaults() -> dict[str, Any]:
    from dataclasses import MISSING, fields

    return {f.name: f.default if f.default_factory is MISSING else f.default_factory()
            for f in fields(PipelineBenchConfig)}


DEFAULTS = _defaults()
VAE_PRECISIONS = ("fp32", "fp16", "bf16")
CPU_MAX_TOKENS = 16384


@dataclass(frozen=True)
class PipelineBenchOptions:
    video: str | None
    """HEIGHTxWIDTHxFRAMES; None: the pipeline's default request."""
    text_tokens: int
    warmup: int
    steps: int
    rounds: int
    decode_warmup: int
    best: bool
    eager: bool
    """diffusers eager rows (PipelineBenchConfig.eager)."""
    plan: bool
    """the plans' rows (PipelineBenchConfig.plan)."""
    compile_backend: str
    cp_backend: str
    e2e_steps: int | None
    layers: int | None
    vae: tuple
    """The VAE precisions of the eager and best rows; () for auto (fp32 plus every plan's precision)."""
    plans: tuple
    """Extra plans: override strings resolved beside the main plan."""
    reference: bool
    stock_bits: bool
    seed: int
    workflow: str
    """t2va | fl2va | ref2va: the request's workflow (its media from pipeline_build.workflow_inputs)."""
    prompt: bool
    """A prompt string through the seeded conditioner (PipelineBenchConfig.prompt); False: prompt_embeds."""
    whole: bool
    """Every row times one whole call too (PipelineBenchConfig.whole)."""
    frames_dir: str | None
    """Rows' frames kept on disk for runs in other processes (PipelineBenchConfig.frames_dir)."""
    text_encoder_weight_sets: int | None
    """The seeded conditioner's decoder layers sharing that many layers' weights (PipelineBenchConfig)."""
    out_dir: str
    tag: str | None


def _get(node, key, default=None):
    if node is None:
        return default
    try:
        v = node.get(key, default) if hasattr(node, "get") else getattr(node, key, default)
    except Exception:  # noqa: BLE001 -- a struct config without the key
        return default
    return default if v is None and default is not None else v


def _vae_list(v) -> tuple:
    items = [str(x).strip() for x in (v if isinstance(v, (list, tuple))
                                      else str(v).split(","))] if v is not None else []
    items = [x for x in items if x]
    if items in ([], ["auto"]):
        return ()
    bad = [x for x in items if x not in VAE_PRECISIONS]
    if bad:
        raise UsageError(f"bench.pipeline.vae={','.join(items)}: auto or a list of {', '.join(VAE_PRECISIONS)}")
    return tuple(dict.fromkeys(items))


def options(cfg, plan=None) -> PipelineBenchOptions:
    """`video` and `bench.pipeline.*` (defaults: DEFAULTS), `bench.out_dir` / `bench.tag`; one UsageError
    line naming the key on a bad value. `video` is "HxWxF", or the config group (a mapping): then the plan's
    request (plan.derived sequence) gives the size, the frame count and the prompt rows."""
    bench = _get(cfg, "bench")
    p = _get(bench, "pipeline") or {}
    vals = {k: _get(p, k, d) for k, d in DEFAULTS.items()}
    vals = {k: (v.value if hasattr(v, "value") else v) for k, v in vals.items()}
    for key, lo in (("text_tokens", 1), ("warmup", 0), ("steps", 1), ("rounds", 1), ("decode_warmup", 0), ("seed", 0)):
        v = vals[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise UsageError(f"bench.pipeline.{key}={v}: must be an integer >= {lo}")
    for key in ("e2e_steps", "layers", "text_encoder_weight_sets"):
        v = vals[key]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise UsageError(f"bench.pipeline.{key}={v}: must be null or an integer >= 1")
    vals["vae"] = _vae_list(vals["vae"])
    plans = vals["plans"] or ()
    if isinstance(plans, str):
        plans = [plans]
    vals["plans"] = tuple(str(x) for x in plans)
    for key in ("best", "eager", "plan", "reference", "stock_bits", "prompt", "whole"):
        if not isinstance(vals[key], bool):
            raise UsageError(f"bench.pipeline.{key}={vals[key]}: true or false")
    if not (vals["best"] or vals["eager"] or vals["plan"]):
        raise UsageError("bench.pipeline.best=false eager=false plan=false: no row to time")
    if vals["text_encoder_weight_sets"] is not None and not vals["prompt"]:
        raise UsageError(f"bench.pipeline.text_encoder_weight_sets={vals['text_encoder_weight_sets']}: only with "
                         "bench.pipeline.prompt=true (without it no conditioner is built)")
    if vals["frames_dir"] is not None and not str(vals["frames_dir"]).strip():
        raise UsageError("bench.pipeline.frames_dir='': a folder, or null")
    if vals["workflow"] not in TASKS:
        raise UsageError(f"bench.pipeline.workflow={vals['workflow']}: one of {', '.join(TASKS)}")
    video = _get(cfg, "video")
    seq = plan.derived_value("sequence") if plan is not None else None
    if hasattr(video, "keys"):  # the `video` config group
        video = None
        if seq and str(seq.get("source", "")).startswith("video"):
            video, vals["text_tokens"] = f"{seq['height']}x{seq['width']}x{seq['frames']}", int(seq["text_rows"])
    if video is not None:
        Request.parse(video)
    tag = _get(bench, "tag")
    if tag is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", str(tag)):
        raise UsageError(f"bench.tag={tag!r}: letters, digits, '_', '.', '-' only (it names the output files)")
    return PipelineBenchOptions(video=None if video is None else str(video), out_dir=run_folder(_get(bench, "out_dir")),
                                tag=tag, **vals)


def extra_plans(cfg, opts: PipelineBenchOptions) -> list:
    """bench.pipeline.plans: each an override string ("recipe=fp8", "recipe.vae=fp16 levers.vae_graphs=off")
    resolved from the packaged config with the run's own hardware, parallel, model and vae choices."""
    base = [f"{g}={_get(_get(cfg, g), 'name')}" for g in ("hardware", "parallel", "model", "vae")
            if _get(_get(cfg, g), "name")]
    out = []
    for spec in opts.plans:  # a group the spec names replaces the run's (a plan takes one option per group)
        named = {o.partition("=")[0] for o in spec.split()}
        out.append(resolve(compose([b for b in base if b.partition("=")[0] not in named] + spec.split())))
    if opts.stock_bits:
        out.append(stock_bits_plan(cfg, base))
    return out


def stock_bits_plan(cfg, base: list):
    """bench.pipeline.stock_bits: the run's lossless plan (its recipe and forced levers) with levers.attention=sdpa,
    diffusers' default attention; a lossy recipe has no stock bits to keep (UsageError)."""
    recipe = _get(_get(cfg, "recipe"), "name")
    forced = [f"levers.{k}={v}" for k, v in (dict(_get(cfg, "levers") or {})).items()
              if k != BACKEND and str(getattr(v, "name", v)) != "auto"]
    plan = resolve(compose(base + ([f"recipe={recipe}"] if recipe else []) + forced + [f"levers.{BACKEND}=sdpa"]))
    if not plan.lossless:
        raise UsageError(f"bench.pipeline.stock_bits=true: recipe {recipe} is lossy; the stock-bits row needs a "
                         f"lossless recipe (recipe=bf16)")
    return plan


# ---------------------------------------------------------------- rows, clips, the session


@dataclass
class _Row:
    setting: Setting
    forwards: list
    walls: list
    first: float | None = None
    frames: Any = None
    peak_gib: float | None = None
    counters: dict | None = None
    error: str | None = None
    full: dict | None = None  # a step-cache row's whole call (_Session.full_turn)
    whole: dict | None = None  # a whole-call row's call and its short call (_Session.whole_turn)
    call_forwards: list = field(default_factory=list)  # every forward of the whole call, computed or skipped
    call_computed: list | None = None  # a step-cache call: which of them the cache computed
    frames_forwards: int | None = None  # the forwards of the call that made `frames` (frames compare at equal counts)
    parts: list = field(default_factory=list)  # per call: seconds of the rest's timed parts (_Session.call)
    left_gib: float | None = None  # device memory an earlier row left allocated at this row's start (_Session.settle)
    left_what: str = ""  # then: the largest CUDA tensors beyond the first row's start that Python reaches
    stored: bool = False  # its frames written to bench.pipeline.frames_dir
    compared: dict = field(default_factory=dict)  # id of the row compared against -> _compare's result (once each)


def clip_lengths(vae, latent_frames: int) -> set:
    """The temporal lengths of the clips diffusers' AutoencoderKLMiniMaxH3._decode hands the decoder for a latent
    of `latent_frames` frames (its chunking: tokens_chunk_size + token_overlap per clip, padded to whole chunks)."""
    tcs, ov, drop = vae.tokens_chunk_size, vae.token_overlap, vae.config.token_drop
    n = latent_frames + drop
    pad = (-n) % tcs
    chunks = (n + pad) // tcs - int(drop > 0)
    return {min(tcs + ov, latent_frames + pad - i * tcs) for i in range(chunks)}


def warm_latent_frames(vae, latent_frames: int) -> int:
    """The fewest latent frames whose decode makes the same clip shapes as `latent_frames` (the warm-up decode)."""
    want = clip_lengths(vae, latent_frames)
    return next((t for t in range(1, latent_frames + 1) if clip_lengths(vae, t) == want), latent_frames)


class _WarmedUp(Exception):
    """Ends the sparse warm-up call (_Session.warm_sparse) once its first sparse forward has run."""


class _Session(Session):
    """The pipeline bench's session: the one pipeline, the request, the prompt, a timer on every transformer
    forward; `turn` runs one row's call."""

    def __init__(self, torch, pipe, request, opts, device, progress):
        super().__init__(torch, device, opts, progress)
        self.pipe, self.request = pipe, request
        self.prompt = ({"prompt": prompt_text(opts.text_tokens)} if opts.prompt
                       else prompt_inputs(pipe, opts.text_tokens, seed=opts.seed))
        self.media = workflow_inputs(pipe, opts.workflow, request.height, request.width, seed=opts.seed,
                                     keyframes=("first", "last"))
        self.fw = ForwardTimer(torch, device.type == "cuda")
        self.S = None  # the packed rows of the call's forwards (keyframe / reference rows included)
        t = denoiser(pipe, opts.workflow)
        self.handles = [t.register_forward_pre_hook(self.fw.pre), t.register_forward_hook(self.fw.post),
                        t.register_forward_pre_hook(self._rows, with_kwargs=True)]
        self.parts = self._time_parts(device.type == "cuda")
        self.calls = opts.warmup + opts.steps
        self.resting, self.tensors = None, Counter()  # GiB allocated and the CUDA tensors when the first row started
        _, latent_frames, _ = resolved(pipe, request)
        r = pipe.vae_spatial_compression_ratio
        frames = warm_latent_frames(pipe.vae, latent_frames)
        self.warm_shape = (1, pipe.vae.config.latent_channels, frames, request.height // r, request.width // r)

    def _time_parts(self, cuda: bool) -> dict:
        """Timers on the parts of the rest of the call: the text encoder (its model's forward, the placement's moves
        included: the timer's pre-hook runs before the placement's) and the video VAE's encode and decode (the
        public methods, wrapped on the instance; install replaces only the private `_encode` / `_decode`)."""
        pipe, parts = self.pipe, {}
        te = getattr(pipe, "text_encoder", None) if "text_encoder" in pipe.component_names else None
        if te is not None:
            parts["text_encoder"] = ForwardTimer(self.torch, cuda)
            self.handles += [te.model.register_forward_pre_hook(parts["text_encoder"].pre, prepend=True),
                             te.model.register_forward_hook(parts["text_encoder"].post)]
        for name in ("encode", "decode"):
            timer = parts[f"vae_{name}"] = ForwardTimer(self.torch, cuda)
            method = getattr(pipe.vae, name)

            def timed(*a, _method=method, _timer=timer, **k):
                _timer.pre(None, a)
                out = _method(*a, **k)
                _timer.post(None, a, out)
                return out

            pipe.vae.__dict__[name] = timed
        return parts

    def _rows(self, module, args, kwargs):
        rows = [kwargs.get(k) for k in ("hidden_states", "audio_hidden_states", "encoder_hidden_states")]
        self.S = sum(int(t.shape[1]) for t in rows if t is not None)

    def warm_decode(self):
        """One untimed decode of a short latent with the request's tile and clip shapes (see the module doc)."""
        torch = self.torch
        z = torch.randn(self.warm_shape, generator=torch.Generator("cpu").manual_seed(self.opts.seed + 7))
        with torch.no_grad():
            for _ in range(self.opts.decode_warmup):
                self.pipe.vae.decode(z.to(self.device), return_dict=False)
        self.fw.sync()

    def call(self, forwards: int | None = None):
        """The user's call, once, with `forwards` transformer forwards (default warmup + steps): (frames, forward
        seconds, wall seconds)."""
        r, fw = self.request, self.fw
        calls = forwards or self.calls
        for t in (fw, *self.parts.values()):
            t.spans, t.on = [], True
        fw.sync()
        host = Clock(self.torch, self.torch.device("cpu"))  # the wall clock around the call and its last kernel
        try:
            wall, frames = host.timed(lambda: (self.pipe(
                **self.prompt, **self.media, height=r.height, width=r.width, num_frames=r.num_frames,
                num_inference_steps=calls + 1, output_type="pt", output="videos",
                generator=self.torch.Generator("cpu").manual_seed(self.opts.seed)), fw.sync())[0])
            wall /= 1e3
        finally:
            for t in (fw, *self.parts.values()):
                t.on = False
        secs = fw.seconds()
        self.last_parts = {k: sum(t.seconds()) for k, t in self.parts.items()}
        if len(secs) != calls:
            raise RuntimeError(f"the call made {len(secs)} transformer forwards, expected {calls}")
        return frames, secs, wall

    def settle(self, row: _Row) -> None:
        """Before a row: collect the garbage (a failed row's traceback, reference cycles), so that every row starts
        from what the first one did; what an earlier row still holds is recorded (row.left_gib, a note) when it is
        over LEFT_GIB. The allocator's cache stays warm, as in a server's next call (an allocation that does not
        fit releases it by itself before it fails)."""
        gc.collect()
        if self.device.type != "cuda":
            return
        torch = self.torch
        torch.cuda.synchronize(self.device)
        now = torch.cuda.memory_allocated(self.device) / 2**30
        if self.resting is None:
            self.resting, self.tensors = now, cuda_tensors(torch)
        elif now - self.resting > LEFT_GIB:
            row.left_gib = max(row.left_gib or 0.0, now - self.resting)
            row.left_what = extra_tensors(cuda_tensors(torch), self.tensors)

    def turn(self, row: _Row, first_turn: bool) -> None:
        torch, s = self.torch, row.setting
        self.settle(row)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        s.enter()
        try:
            if first_turn and self.opts.decode_warmup:
                self.warm_decode()
            self.warm_sparse(s)
            reset_counters()
            if cached(s):
                self.full_turn(row)
            elif self.opts.whole:
                self.whole_turn(row, s)
            else:
                self.plain_turn(row, s)
        finally:
            s.exit()
        if self.device.type == "cuda":  # the peak of every row, the step cache's whole call included
            row.peak_gib = max(torch.cuda.max_memory_allocated(self.device) / 2**30, row.peak_gib or 0.0)

    def warm_sparse(self, s) -> None:
        """A plan with block-sparse attention (whole calls only): its own schedule run, untimed, up to its first sparse
        forward and stopped there, so that the block-sparse kernel's JIT stays out of the timed call (the short warm-up
        call's timesteps are off the sparse schedule: every forward of it runs dense)."""
        sparse = records.sparse_decision(s.plan) if s.name == "plan" and (cached(s) or self.opts.whole) else None
        if sparse is None or self.full_forwards <= sparse.param("dense_forwards"):
            return
        r, seen, stop = self.request, [], sparse.param("dense_forwards") + 1

        def count(_module, _args, _out):
            seen.append(1)
            if len(seen) >= stop:
                raise _WarmedUp

        handle = self.pipe.transformer.register_forward_hook(count)
        try:
            self.pipe(**self.prompt, **self.media, height=r.height, width=r.width, num_frames=r.num_frames,
                      num_inference_steps=self.full_forwards + 1, output_type="pt", output="videos",
                      generator=self.torch.Generator("cpu").manual_seed(self.opts.seed))
        except _WarmedUp:
            pass
        finally:
            handle.remove()
        self.fw.sync()
        if len(seen) != stop:
            raise RuntimeError(f"the sparse warm-up made {len(seen)} forwards, expected {stop}")

    def plain_turn(self, row: _Row, s) -> None:
        """`warmup` untimed + `steps` timed forwards of one call: forward is their median, rest the call less its
        forwards."""
        frames, secs, wall = self.call()
        row.counters = dict(counters()) if s.name == "plan" else None
        if row.first is None:
            row.first = secs[0]
        row.forwards += secs[self.opts.warmup:]
        row.walls.append(wall - sum(secs))
        row.parts.append(self.last_parts)
        if row.frames is None:
            row.frames, row.frames_forwards = _host(frames), len(secs)
        self.progress.step(f"{row_label_of(s)} ({s.vae} VAE): forward {statistics.median(secs[self.opts.warmup:]):.3f} "
                           f"s, rest {wall - sum(secs):.2f} s")

    def whole_turn(self, row: _Row, s) -> None:
        """bench.pipeline.whole: the short call of `warmup` untimed + `steps` timed forwards (the figures every other
        row extrapolates from; it warms compile, JIT and the decode's graphs), then the whole call of `full_forwards`
        forwards timed end to end, every forward between CUDA events: E2E is its wall time, forward the median of
        all its forwards, and the short call's extrapolation is checked against it (pipeline_checks.extrapolation)."""
        frames, secs, wall = self.call()
        short, short_rest = secs[self.opts.warmup:], wall - sum(secs)
        if row.first is None:
            row.first = secs[0]
        reset_counters()
        frames, secs, wall = self.call(self.full_forwards)
        row.counters = dict(counters()) if s.name == "plan" else None
        row.forwards += secs
        row.call_forwards = list(secs)
        row.walls.append(wall - sum(secs))
        row.parts.append(self.last_parts)
        row.whole = {"e2e_s": wall, "forwards": len(secs), "short_forwards_s": short, "short_rest_s": short_rest}
        row.frames, row.frames_forwards = _host(frames), len(secs)
        self.progress.step(f"{row_label_of(s)} ({s.vae} VAE): the whole call {wall:.2f} s, {len(secs)} forwards "
                           f"(median {statistics.median(secs):.3f} s)")

    def full_turn(self, row: _Row) -> None:
        """A step-cache plan's row: one untimed short call (kernel JIT, allocator; its timesteps are off the cache's
        schedule, so it computes every forward), then the whole call of `full_forwards` forwards, timed end to end:
        E2E is its wall time, forward the median of the forwards the schedule computed."""
        self.call()
        reset_counters()
        frames, secs, wall = self.call(self.full_forwards)
        cache = of_lever(STEP_CACHE)  # the cache's runtime: its generations and state
        made = cache.calls(self.pipe.transformer)[-1:]  # this call's generation
        if len(made) != 1 or made[0]["forwards"] != len(secs):
            raise RuntimeError(f"the step cache placed {made} for a call of {len(secs)} forwards")
        st = self.pipe.transformer.__dict__[cache.STATE]
        mask = list(st.done)  # what each forward of this call did: computed (every block) or skipped
        if len(mask) != len(secs):
            raise RuntimeError(f"the step cache decided {len(mask)} forwards of a call that made {len(secs)}")
        row.counters = dict(counters())
        row.forwards += [x for x, m in zip(secs, mask) if m]
        row.call_forwards, row.call_computed = list(secs), [bool(m) for m in mask]
        row.walls.append(wall - sum(secs))
        row.parts.append(self.last_parts)
        row.full = {"e2e_s": wall, "forwards": len(secs), "computed": made[0]["computed"],
                    "skipped": made[0]["skipped"],
                    "skipped_s": sum(x for x, m in zip(secs, mask) if not m), "mode": st.spec["mode"]}
        row.frames, row.frames_forwards = _host(frames), len(secs)
        self.progress.step(f"{row_label_of(row.setting)}: {made[0]['computed']} of {len(secs)} forwards computed, "
                           f"E2E {wall:.2f} s")

    def close(self):
        for h in self.handles:
            h.remove()
        for name in ("encode", "decode"):
            self.pipe.vae.__dict__.pop(name, None)


def _host(frames):
    return frames.detach().to("cpu") if hasattr(frames, "detach") else frames


def cached(s: Setting) -> bool:
    """A plan row whose plan skips forwards (step_cache): it runs the whole call (_Session.full_turn)."""
    if s.name != "plan":
        return False
    try:
        return s.plan.decision(STEP_CACHE).enabled
    except (KeyError, ValueError):
        return False


LEFT_GIB = 0.25  # a row that starts with more than this allocated beyond the first row's start says so


def cuda_tensors(torch) -> Counter:
    """Every CUDA storage gc reaches, counted by (bytes, shape, dtype): a weight put back in new memory (uninstall)
    counts as the one it replaced."""
    seen: dict[int, tuple] = {}
    for o in gc.get_objects():
        if not issubclass(type(o), torch.Tensor):  # type(): isinstance reads __class__, which some proxies warn on
            continue
        try:
            if not o.is_cuda:
                continue
            st = o.untyped_storage()  # a fake or wrapper tensor (compile's, a subclass) has none to count
            seen.setdefault(st.data_ptr(), (st.nbytes(), tuple(o.shape), str(o.dtype).replace("torch.", "")))
        except (RuntimeError, NotImplementedError, TypeError):
            continue
    return Counter(seen.values())


def extra_tensors(now: Counter, before: Counter, n: int = 3) -> str:
    """The `n` largest storages in `now` beyond `before` (what an earlier row still holds), or where the memory is
    not Python's to see (a library's cache)."""
    top = sorted((now - before).elements(), reverse=True)[:n]
    return ", ".join(f"{list(shape)} {dtype} {b / 2**20:.0f} MiB"
                     for b, shape, dtype in top) or "none that Python reaches"


def forward_kinds(secs: list[float], computed: list[bool], dense: int | None) -> list[tuple[int, float]]:
    """(count, median) of the computed forwards of one call, by kind: the first `dense` (all where None) and the rest,
    which run sparse attention."""
    groups: list[list[float]] = [[], []]
    for i, (t, m) in enumerate(zip(secs, computed)):
        if m:
            groups[0 if dense is None or i < dense else 1].append(t)
    return [(len(g), statistics.median(g)) for g in groups if g]


def step_cache_notes(f: dict, kinds: list[tuple[int, float]], rest: float | None) -> tuple[list[str], dict]:
    """A step-cache row's note and its overhead check from its whole call `f` (full_turn's row.full) and its computed
    forwards by kind (forward_kinds) / the rest (pipeline_checks.overhead: every mode; first_block's skipped forwards
    run its first block and the decision, a cost the check counts)."""
    what = ("each ran the first block and the decision" if f.get("mode") == "first_block" else "reused or extrapolated")
    note = (f"step_cache: the whole call, {f['computed']} of {f['forwards']} forwards computed, timed end to end; the "
            f"{f['skipped']} skipped forwards ({what}) took {f['skipped_s']:.3f} s")
    return [note], checks.overhead(f, kinds, rest)


def row_label_of(s: Setting) -> str:
    return s.label or s.name


# ---------------------------------------------------------------- the run


def _distributed(torch, degree: int):
    """(rank, group, device) for Ulysses degree `degree`; U > 1 needs a torchrun launch with that many processes."""
    if degree == 1:
        return 0, None, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != degree:
        raise UsageError(f"parallel.ulysses={degree}: launch {degree} processes, e.g. torchrun "
                         f"--nproc_per_node={degree} -m h3plan action=bench bench.target=pipeline parallel=u{degree} "
                         f"... (WORLD_SIZE is {world})")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), None, device


def _check_size(cfg, device, pipe_tokens: int | None = None, video: str | None = None) -> None:
    if device.type == "cuda":
        return
    hidden = int(cfg["model"]["diffusers_config"]["hidden_size"])
    width = vae_width(cfg["vae"]["diffusers_config"])
    if pipe_tokens is None and (hidden > CPU_MAX_HIDDEN or width > CPU_MAX_HIDDEN):
        raise UsageError(pipeline_too_wide(hidden, width))
    if pipe_tokens is not None and pipe_tokens > CPU_MAX_TOKENS:
        raise UsageError(f"video={video}: {pipe_tokens:,} tokens is too long for the CPU smoke form (at most "
                         f"{CPU_MAX_TOKENS:,}); use a small canvas, e.g. {CPU_SMOKE}")


def _lossless_but_vae(plan) -> bool:
    """Every lever keeps eager's bits given the attention backend and the decode precision."""
    return all(d.lossless or d.lever == DECODE_PRECISION for d in plan.decisions)


def row_specs(plans, opts, degree: int) -> list[tuple]:
    """The rows of the run in order, as (kind, vae, plan): per VAE precision (fp32 first) eager, best, then the
    plans decoding at that precision, each after its reference (diffusers' whole transformer and, with a prompt, the
    conditioner beside it: the heaviest row runs before anything a plan's install could leave on the device); at
    U > 1 the best rows last (context parallelism cannot be undone)."""
    vaes = list(opts.vae) or list(dict.fromkeys(["fp32"] + [plan_precision(p) for p in plans]))
    rows, tail = [], []
    plans = plans if opts.plan else []
    for v in vaes:
        if opts.eager:
            rows.append(("eager", v, None))
        if opts.best:
            (rows if degree == 1 else tail).append(("best", v, None))
        for p in plans:
            if plan_precision(p) == v:
                # extra_plans appends the stock-bits plan last: eager is its reference
                stock = opts.stock_bits and p is plans[-1]
                if opts.reference and _lossless_but_vae(p) and not stock:
                    rows.append(("reference", v, p))
                rows.append(("plan", v, p))
    # a plan decoding at a precision without eager / best rows of its own (a step-cache row beside the fp32 anchors)
    rows += [("plan", plan_precision(p), p) for p in plans if plan_precision(p) not in vaes]
    return rows + tail


def _rows(pipe, specs, opts, degree, S, group, progress, stock_plan=None) -> list[_Row]:
    """`stock_plan`: the stock-bits plan (extra_plans' last), whose frames must be diffusers eager's bit for bit."""
    rows, shared, refs = [], None, {}
    for kind, v, p in specs:
        if kind == "eager":
            s = Eager(pipe, v)
        elif kind == "best":
            s = Best(pipe, degree, S, opts, v, shared)
            shared = shared or s
        elif kind == "plan":
            s = PlanSetting(pipe, p, group, progress, num_inference_steps=opts.warmup + opts.steps + 1,
                            workflow=opts.workflow)
            s.stock = p is stock_plan
            if id(p) in refs:
                refs.pop(id(p)).of = s  # the row this reference checks (row_specs: right before it)
        else:
            s = refs[id(p)] = Reference(pipe, p)
        rows.append(_Row(s, [], []))
    return rows


def _compare(torch, device, frames, ref) -> dict:
    """Bitwise, PSNR and SSIM of two rows' frames (kept on the host), on `device`; where the device has no room
    left for them (a row that failed holding memory), on the host, and the result says so."""
    if frames is None or ref is None:
        return {}
    try:
        return _compared(torch, frames.to(device), ref.to(device))
    except torch.OutOfMemoryError:
        free(torch)
        out = _compared(torch, frames.cpu(), ref.cpu())
        out["note"] = (out.get("note", "") + "; " if out.get("note")
                       else "") + "compared on the host (no device memory left)"
        return out


def _compared(torch, a, b) -> dict:
    out = {"bitwise": bool(torch.equal(a, b))}
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        out["note"] = "non-finite frames (diverged seeded weights?): comparison unreliable"
    out.update(compare(a, b))
    return out


def _record(torch, device, run_id, request, S, degree, layers, n_sched, steps_e2e, opts, row: _Row, rows,
            store: dict | None = None) -> dict:
    """`store`: {"dir", "fingerprint"} where bench.pipeline.frames_dir keeps frames (pipeline_frames)."""
    s = row.setting
    fwd = statistics.median(row.forwards) if row.forwards else None
    rest = statistics.median(row.walls) if row.walls else None
    plan = getattr(s, "plan", None)
    rec = records.CallRecord(
        run=run_id, video=request.label, S=S, gpus=degree, setting=s.name, label=row_label_of(s), vae=s.vae,
        workflow=opts.workflow,
        forward_s=fwd, rest_s=rest, wall_s=(rest + sum(row.forwards) if rest is not None else None),
        e2e_s=records.e2e(steps_e2e, fwd, rest), steps_e2e=steps_e2e, forwards_s=list(row.forwards),
        first_forward_s=row.first, peak_gib=row.peak_gib, counters=row.counters or {},
        device=device_name(torch, device),
        timing="cuda-events" if device.type == "cuda" else "host-clock", layers=layers, num_inference_steps=n_sched,
        forwards_per_call=opts.warmup + opts.steps, warmup_forwards=opts.warmup,
        recipe=str(plan.get("recipe").get("name", "")) if plan is not None else "",
        lossless=bool(plan.lossless) if plan is not None else None, config=getattr(s, "config", ""), error=row.error)
    if row.parts:
        rec.rest_parts = {k: round(statistics.median(p[k] for p in row.parts), 4) for k in row.parts[0]}
    if row.full is not None:
        rec.e2e_s, rec.steps_e2e, rec.wall_s = row.full["e2e_s"], row.full["forwards"], row.full["e2e_s"]
        sparse = records.sparse_decision(plan) if plan is not None else None
        dense = sparse.param("dense_forwards") if sparse is not None else None
        note, check = step_cache_notes(row.full, forward_kinds(row.call_forwards, row.call_computed, dense), rest)
        rec.notes += note
        rec.checks.append(check)
    if row.whole is not None:
        w = row.whole
        rec.e2e_s, rec.steps_e2e, rec.wall_s = w["e2e_s"], w["forwards"], w["e2e_s"]
        sf = statistics.median(w["short_forwards_s"]) if w["short_forwards_s"] else None
        rec.short_call = {"forwards_s": list(w["short_forwards_s"]), "forward_s": sf, "rest_s": w["short_rest_s"],
                          "forwards_per_call": opts.warmup + opts.steps,
                          "e2e_s": records.e2e(w["forwards"], sf, w["short_rest_s"])}
        rec.checks.append(checks.extrapolation(w["forwards"], sf, w["short_rest_s"], w["e2e_s"]))
    rec.whole_call = row.full is not None or row.whole is not None
    rec.call_forwards_s, rec.call_computed = list(row.call_forwards), row.call_computed
    if opts.prompt:
        rec.text_encoder_weight_sets = opts.text_encoder_weight_sets
        rec.notes.append(f"prompt: a {opts.text_tokens}-byte string through diffusers' text encoder step and the "
                         f"seeded Qwen3-VL at the packaged widths, placed by the plan's memory.text_encoder for every "
                         f"row; its encode (and any move) is in rest, E2E and the peak"
                         + (f"; its decoder layers share {opts.text_encoder_weight_sets} layers' weights (bench."
                            "pipeline.text_encoder_weight_sets): every layer computes at its width, the peak is short "
                            "by the weights of the rest" if opts.text_encoder_weight_sets else ""))
    if row.left_gib is not None:
        rec.notes.append(f"started with {row.left_gib:.2f} GiB more allocated on the device than the first row did "
                         f"(held by an earlier row after gc; the largest tensors beyond the first row's: "
                         f"{row.left_what}): in this row's peak")
    if s.name == "best" and row.first is not None:
        rec.notes.append(f"the first forward (regional compile included) took {row.first:.2f} s")
    if s.name == "plan":
        rec.request, rec.recipe_overrides = records.request_overrides(plan), records.recipe_overrides(plan)
        if row.first is not None:
            rec.notes.append(f"the first forward (kernel JIT included) took {row.first:.2f} s")
        rec.notes.append(f"vae_precision {plan_precision(plan)}; lossless apart from it: {_lossless_but_vae(plan)}")
        planned = {"text_encoder": (plan.derived_value("text_encoder") or {}).get("call_s"),
                   "vae_encode": plan.derived_value("encode_s_est"), "vae_decode": plan.derived_value("decode_s_est")}
        if rec.rest_parts and rec.rest_s is not None:  # where the rest of the call went, against the plan's parts
            timed = [f"{k.replace('_', ' ')} {v:.2f} s" + (f" (planned {planned[k]:.2f})" if planned.get(k) is not None
                                                           else "") for k, v in rec.rest_parts.items()]
            other = rec.rest_s - sum(rec.rest_parts.values())
            rec.notes.append(f"rest: {', '.join(timed)}; everything else {other:.2f} s")
        pf, pc = records.predicted_forward(plan, asdict(rec)), records.predicted_call(plan, asdict(rec))
        if pf is not None and fwd is not None:  # the plan's own time line against this row
            rec.notes.append(f"predicted: forward {pf:.3f} s ({pf / fwd - 1:+.1%})" + (
                "" if pc is None or rec.e2e_s is None else f", call {pc:.1f} s ({pc / rec.e2e_s - 1:+.1%}) against the "
                                                           f"measured")
                + (" (first_block: the plan's call at the forwards this call computed; how many it skips is the "
                   "checkpoint's)"
                   if row.full is not None and row.full.get("mode") == "first_block" else ""))
    _frames(torch, device, opts, row, rows, rec, store)
    return asdict(rec)


def _same_call(a: _Row, b: _Row) -> bool:
    """Two rows whose frames came from calls of as many forwards (only those compare)."""
    return a.frames is not None and b.frames is not None and a.frames_forwards == b.frames_forwards


def _frames(torch, device, opts, row: _Row, rows, rec, store) -> None:
    """rec.frames: a plan against its reference (bitwise, a check), the stock-bits plan against eager (bitwise, a
    check), every other row against eager with the same VAE, each from a call of as many forwards; a lossy plan's
    frames against the lossless plan's too (rec.frames_vs_lossless: this run's, else frames_dir's). With a frames_dir
    the row's frames are kept there, once."""
    s = row.setting
    ref = (next((r for r in rows if r.setting.name == "reference" and r.setting.of is s), None)
           if s.name == "plan" else None)
    stock = s.name == "plan" and getattr(s, "stock", False)
    against = ref
    if against is None and s.name != "eager":
        against = next((r for r in rows if r.setting.name == "eager" and r.setting.vae == s.vae
                        and _same_call(r, row)), None)
    if s.name == "eager" and s.vae != "fp32":  # the lossy decode precision against diffusers' default
        against = next((r for r in rows if r.setting.name == "eager" and r.setting.vae == "fp32"
                        and _same_call(r, row)), None)
    in_run = against is not None and _same_call(row, against)
    if in_run:
        rec.frames = dict(_compared_once(torch, device, row, against))
        rec.frames["against"] = f"{row_label_of(against.setting)} ({against.setting.vae} VAE)"
    elif s.name != "eager" and store and row.frames is not None:  # diffusers' rows of an earlier run (frames_dir)
        best = "diffusers " + compile_call("transformer", opts.compile_backend).split(";")[0]
        rec.frames = next((f for f in (_stored(torch, device, opts, row, store, rec.video, label, s.vae)
                                       for label in ("diffusers eager", best) if label != row_label_of(s)) if f), {})
    if s.name == "plan" and rec.frames and not (in_run and (against is ref or stock)):
        rec.frames["bitwise"] = rec.frames["bitwise"] or None  # no same-backend reference: PSNR/SSIM only
    if ref is not None or stock:  # declared before the run: these frames must be equal bit for bit
        what = (f"{row_label_of(against.setting)} ({against.setting.vae} VAE)" if against is not None
                else "its reference" if ref is not None else "diffusers eager")
        rec.checks.append(checks.bitwise(rec.frames if in_run else None, what))
    if s.name == "plan" and not s.plan.lossless and row.frames is not None:
        rec.frames_vs_lossless = _vs_lossless(torch, device, opts, row, rows, store, rec.video)
    if store and row.frames is not None and not row.stored:
        stored.save(torch, store["dir"], row.frames, {**_frames_meta(opts, rec.video, row), "run": rec.run,
                                                      "fingerprint": store["fingerprint"]})
        row.stored = True


def _compared_once(torch, device, row: _Row, other: _Row) -> dict:
    if id(other) not in row.compared:  # every write records every row: compare each pair once
        row.compared[id(other)] = _compare(torch, device, row.frames, other.frames)
    return row.compared[id(other)]


def _frames_meta(opts, video: str, row: _Row, label: str | None = None, vae: str | None = None) -> dict:
    return {"workflow": opts.workflow, "video": video, "forwards": row.frames_forwards,
            "label": label or row_label_of(row.setting), "vae": vae or row.setting.vae}


def lossless_label(plan) -> str:
    """The label of the lossless plan a lossy one is compared with: the bf16 recipe on the same hardware and degree,
    nothing forced (its decode at diffusers' fp32)."""
    hw, par = plan.get("hardware"), plan.get("parallel")
    return f"{hw.get('name', '?')}/bf16/{par.get('name') or 'u' + str(par.get('ulysses', 1))}"


def _vs_lossless(torch, device, opts, row: _Row, rows, store, video: str) -> dict:
    label = lossless_label(row.setting.plan)
    mine = next((r for r in rows if r.setting.name == "plan" and row_label_of(r.setting) == label
                 and r.setting.vae == "fp32" and _same_call(r, row)), None)
    if mine is not None:
        return {**_compared_once(torch, device, row, mine), "against": f"{label} (fp32 VAE)", "from": "this run"}
    return _stored(torch, device, opts, row, store, video, label, "fp32")


def _stored(torch, device, opts, row: _Row, store, video: str, label: str, vae: str) -> dict:
    """`row`'s frames against the row `label` at `vae` of an earlier run with these weights, kept in frames_dir from a
    call of as many forwards ({} where there is none)."""
    if store is None or row.frames_forwards is None:
        return {}
    key = ("stored", label, vae)
    if key not in row.compared:
        got = stored.load(torch, store["dir"], {**_frames_meta(opts, video, row, label, vae),
                                                "fingerprint": store["fingerprint"]})
        row.compared[key] = None if got is None else {
            **_compare(torch, device, row.frames, got[0]), "against": f"{label} ({vae} VAE)",
            "from": f"run {got[1].get('run')} (bench.pipeline.frames_dir)"}
    return dict(row.compared[key] or {})


def setup_failed(plans, opts, degree: int, run_id: str, device: str, error: str) -> list[dict]:
    """One record per row of the run (row_specs) when the run failed before its pipeline and rows existed (a build or
    a first install out of memory): each with the error, so a check declared for its row reads "failed", not "not run".
    The request and its tokens are the plan's (the pipeline that counts them was not built)."""
    seq = plans[0].derived_value("sequence") or {}
    video = opts.video or (f"{seq['height']}x{seq['width']}x{seq['frames']}" if seq.get("frames") else "default")
    forwards = opts.e2e_steps or seq.get("transformer_forwards") or 0
    label = {"eager": lambda p: Eager.label, "best": lambda p: Best.label_of(opts), "plan": row_label,
             "reference": Reference.label_of}
    out = []
    for kind, vae, p in row_specs(plans, opts, degree):
        rec = records.CallRecord(run=run_id, video=video, S=int(seq.get("seq_len") or 0), gpus=degree, setting=kind,
                                 label=label[kind](p), vae=vae, forward_s=None, rest_s=None, wall_s=None, e2e_s=None,
                                 steps_e2e=int(forwards), device=device, workflow=opts.workflow, error=error)
        rec.whole_call = opts.whole
        if kind == "plan":
            rec.request, rec.recipe_overrides = records.request_overrides(p), records.recipe_overrides(p)
        out.append(asdict(rec))
    return out


def _measure(torch, cfg, plans, opts, device, rank, group, progress, write) -> int:
    plan = plans[0]
    degree = int(plan.get("parallel").get("ulysses", 1))
    if opts.workflow != "t2va" and degree > 1:
        raise UsageError(f"bench.pipeline.workflow={opts.workflow} runs on one GPU for now (parallel=u1); the t2va "
                         "request runs at any Ulysses degree")
    wf = {} if opts.workflow == "t2va" and not opts.prompt else {  # t2va, prompt_embeds: the core denoise step alone
        "blocks": workflow_blocks(text_encoder=opts.prompt),
        "partitions": (PARTITION[opts.workflow],)}
    if opts.prompt:  # built on the device (seconds, where a host init of 33B parameters takes a minute) and placed
        wf.update(text_encoder=conditioner_config(cfg), text_encoder_placement=conditioner_setting(plan),
                  text_encoder_weight_sets=opts.text_encoder_weight_sets)
        if opts.text_encoder_weight_sets and device.type == "cuda":  # its layers are shared after the init: initialised
            wf.update(text_encoder_device="cpu")  # where the whole conditioner fits (the host), then placed
    pipe = build_pipeline(cfg["model"]["diffusers_config"], cfg["vae"]["diffusers_config"], vae_name=cfg["vae"]["name"],
                          layers=opts.layers, device=device, dtype="bf16", seed=opts.seed, **wf)
    te_placement = placed_text_encoder(pipe.text_encoder) if opts.prompt else None
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the fp32 staging of the seeded weights
    request = Request.parse(opts.video) if opts.video else default_request(pipe)
    S = sequence_length(pipe, request, opts.text_tokens)  # t2va's rows; the first call counts the workflow's own
    _check_size(cfg, device, S, request.label)
    if opts.workflow == "ref2va" and device.type != "cuda":  # the smoke form: the reference at the canvas, not 2048 px
        pipe.register_to_config(reference_image_short_edge=min(request.height, request.width))
    n_sched, steps_e2e = default_steps(pipe)
    if opts.e2e_steps is not None:
        n_sched, steps_e2e = None, opts.e2e_steps
    layers = len(denoiser(pipe, opts.workflow).transformer_blocks)
    run_id = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    progress.write(f"request {request.label} ({opts.workflow}): {S:,} tokens without conditioning rows "
                   f"({opts.text_tokens} text), {layers} layers, {degree} GPU(s)"
                   + (f"; prompt through the seeded text encoder, {te_placement.line}" if te_placement else ""))
    s = _Session(torch, pipe, request, opts, device, progress)
    s.full_forwards = steps_e2e
    rows = _rows(pipe, row_specs(plans, opts, degree), opts, degree, S, group, progress,
                 stock_plan=plans[-1] if opts.stock_bits else None)
    store = None if not opts.frames_dir else {  # another run's frames compare only where the weights are these
        "dir": opts.frames_dir, "fingerprint": stored.fingerprint(torch, pipe, denoiser(pipe, opts.workflow))}
    failed = 0
    try:
        for rnd in range(opts.rounds):
            for row in rows if rnd % 2 == 0 else rows[::-1]:
                if row.error:
                    continue
                try:
                    s.turn(row, first_turn=rnd == 0)
                except (KeyboardInterrupt, MemoryError):
                    raise
                except Exception as exc:  # noqa: BLE001 -- recorded; the other rows still run
                    row.error = one_line(exc)
                    progress.write(f"{row_label_of(row.setting)} ({row.setting.vae}): failed: {row.error}")
                    failed += row.setting.name in ("eager", "plan")
                if rank == 0:
                    write([_record(torch, device, run_id, request, s.S or S, degree, layers, n_sched, steps_e2e, opts,
                                   r, rows, store) for r in rows if r.walls or r.error])
    finally:
        s.close()
        if rank == 0:
            write([_record(torch, device, run_id, request, s.S or S, degree, layers, n_sched, steps_e2e, opts, r, rows,
                           store) for r in rows if r.walls or r.error])
        if te_placement is not None:
            te_placement.restore()
    return failed


def conditioner_config(cfg):
    """The seeded conditioner's widths: model.text_encoder (model.path's text_encoder/config.json) or the packaged
    model.text_encoder_default."""
    model = cfg["model"]
    te = model.get("text_encoder") or model.get("text_encoder_default")
    if te is None:
        raise UsageError(f"bench.pipeline.prompt=true: model={model.get('name')} has no text encoder config "
                         "(model.text_encoder_default)")
    return te


def conditioner_setting(plan) -> str:
    """Where the plan puts the conditioner (memory.text_encoder); a plan that places none cannot run a prompt."""
    setting = (plan.derived_value("text_encoder") or {}).get("setting")
    if setting in (None, "none"):
        raise UsageError("bench.pipeline.prompt=true: the plan places no text encoder (prompt_embeds given); add "
                         "memory.text_encoder=resident|offload_after|host (the plan refuses one that does not fit and "
                         "names the one that does)")
    return setting


def run(cfg, plan) -> int:
    """The pipeline bench (`python -m h3plan action=bench bench.target=pipeline`); 0 when every eager and plan
    row ran."""
    opts = options(cfg, plan)
    degree = int(plan.get("parallel").get("ulysses", 1))
    import torch

    require_transformers()
    rank, group, device = _distributed(torch, degree)
    _check_size(cfg, device)
    plans = [plan] + extra_plans(cfg, opts)
    if opts.prompt:  # refused before any file or model is made
        conditioner_setting(plan), conditioner_config(cfg)
    out = None
    if rank == 0:
        out = Output(records, opts.out_dir, "pipeline", opts.tag or device_tag(device_name(torch, device)))
        if device.type != "cuda":
            print(HOST_CLOCK_NOTE, flush=True)
    n_rows = len(row_specs(plans, opts, degree))
    progress = Progress(n_rows * opts.rounds, "pipeline bench (the user's call)") if rank == 0 else Quiet()
    done: list[dict] = []

    def write(recs):
        if rank != 0 or not recs:
            return
        doc = out.doc
        records.fill_speedups(recs, [r for r in doc["records"] if r["run"] != recs[0]["run"]])
        doc["records"] = [r for r in doc["records"] if r["run"] != recs[0]["run"]] + recs
        if not any(r.get("run") == recs[0]["run"] for r in doc["runs"]):
            out.add_run(run_meta(torch, device, {"run": recs[0]["run"]},
                                 {"gpus": degree, "options": {k: v for k, v in asdict(opts).items()
                                                              if k not in ("out_dir", "tag")}}))
        out.write()
        done[:] = recs

    with sigterm_as_interrupt():
        try:
            failed = _measure(torch, cfg, plans, opts, device, rank, group, progress, write)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 -- printed; rows measured so far are written
            failed = 1
            progress.write(f"failed: {one_line(exc)}")
            traceback.print_exc()  # where it failed, for the log
            if not done:  # nothing written: the run failed in setup, each of its rows records the error
                write(setup_failed(plans, opts, degree, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                                   device_name(torch, device), one_line(exc)))
        finally:
            progress.close()
    if rank != 0:
        return 1 if failed else 0
    out.report(done, out.chart())
    return 1 if failed or not done else 0
