"""`python -m h3plan action=bench bench.target=pipeline video=...`: diffusers' MiniMaxH3ModularPipeline end to end.

What runs: diffusers' own modular blocks (pipeline_build.py: `MiniMaxH3CoreDenoiseStep` - layout, noise, the
two schedules, the denoise loop, unpack - and `MiniMaxH3DecodeStep`), seeded random weights, one request
(`video`, default: the pipeline's own 16:9 canvas and 124 frames; `text_tokens` text rows stand in for the
text encoder), in one process, for three settings on ONE transformer instance:
- eager: diffusers as it ships;
- best: diffusers' best setting for the same GPUs. One GPU: `transformer.compile_repeated_blocks(fullgraph=True)`
  (regional compile; diffusers' default attention, which on one GPU is as fast as `_native_cudnn`: docs/sources.md#h200-anchors).
  Ulysses degree U > 1: `set_attention_backend(cp_backend)` (a backend diffusers registers for context
  parallelism, `_native_cudnn` by default), `enable_parallelism(config=ContextParallelConfig(ulysses_degree=U,
  ulysses_anything=S % U != 0))`, then the regional compile. The VAE as diffusers leaves it (eager), so
  best_decode_s is eager's decode time, not measured twice;
- plan: `install_pipeline(pipe, plan)` (transformer levers, VAE levers; the audio VAE has none).

Memory (the 50-layer bf16 transformer is ~39 GB; eager + compiled + plan copies would not fit beside the
VAE and activations on one H200): the settings share the transformer and switch in place. The plan is
installed on entering its turn and uninstalled on leaving it (an FP8 plan's quantised weights, ~19 GB, live
only meanwhile). Regional compile is applied once; its compiled callables are kept aside and switched on
(`block._compiled_call_impl`) for the best setting's turn and off otherwise, so eager and the plan run the
plain blocks and the compiled code is reused without recompiling. Context parallelism cannot be undone
(diffusers has no disable_parallelism), so at U > 1 the best setting runs after the others. The settings'
enter / exit: pipeline_settings.py.

Order and timing: `rounds` rounds; in each, every setting runs one denoise call of `warmup + steps` transformer
forwards (num_inference_steps = warmup + steps + 1: MiniMaxH3Scheduler counts the terminal sigma); the
order alternates between rounds (eager, plan, best / best, plan, eager), i.e. interleaved. A step is the time
between consecutive transformer calls of diffusers' loop (device events from a forward pre-hook on the
transformer; the last one ends when the denoise step returns), so it includes the scheduler updates; the
first `warmup` steps of every call are dropped; medians over steps x rounds. The video decode is timed in
round one after `decode_warmup` untimed decodes (the plan's first decode captures its CUDA graphs), under
FP16 autocast on a GPU (VAE weights fp32 as released: the decode docs/sources.md#h200-anchors and benchmarks/vae.py measure;
`vae=bf16` casts like `load_components(dtype=torch.bfloat16)` and decodes without autocast).
End to end: overhead (layout, noise) + steps_e2e x step + decode (+ the audio decode, the same code for
all), steps_e2e = transformer forwards at the pipeline's default num_inference_steps (50, diffusers'
`INPUT_PARAM_TEMPLATES`, used by `MiniMaxH3SetTimestepsStep`; 49 forwards). Compile and graph capture are
one-off costs, excluded (their first-call times are recorded).

Correctness: the plan's frames against diffusers eager's (PSNR, SSIM: quality.py) and, for a lossless plan,
bitwise against diffusers eager with the plan's attention backend (the `reference` setting: the plan's
attention levers only, run once, untimed; eager itself when that backend is sdpa, diffusers' own SDPA call).

Config: `video`; `bench.pipeline.{text_tokens, warmup, steps, rounds, decode_warmup, audio, best,
compile_backend, cp_backend, e2e_steps, layers, vae, seed}` (DEFAULTS; missing keys take them, so a plain
dict config works too); `bench.out_dir`, `bench.tag`.

Output (rank 0), in bench.out_dir: pipeline-<tag>.json (records merged by video, gpus, plan, device),
.md and .png (pipeline_records.py). U > 1: launch U processes with torchrun
(`torchrun --nproc_per_node=U -m h3plan action=bench bench.target=pipeline parallel=uU ...`).
On a CPU only the tiny smoke form runs (CPU_SMOKE: model=h3_tiny vae=h3_tiny_pipe on a 32x32 canvas): host clock,
plumbing only.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from h3plan.errors import UsageError

from . import pipeline_records as records
from .bench.measure import device_tag, plan_label
from .bench.records import _one_line
from .bench.timing import Progress
from .pipeline_settings import Best, Eager, PlanSetting, Reference, Setting

def _defaults() -> dict[str, Any]:
    from dataclasses import fields

    from h3plan.schema import PipelineBenchConfig  # bench.pipeline.*: one definition, the schema's

    return {f.name: f.default for f in fields(PipelineBenchConfig)}


DEFAULTS = _defaults()
VAE_MODES = ("auto", "fp16_autocast", "bf16", "fp32")
CPU_MAX_HIDDEN = 1024  # wider transformers are real width: GPU only
CPU_MAX_TOKENS = 16384
# The CPU form that runs (tests/bench/test_pipeline_bench_smoke.py runs it): the tiny pipeline on a 32x32 canvas,
# one round, dynamo without Inductor's C++ compiles.
CPU_SMOKE = ("python -m h3plan action=bench bench.target=pipeline model=h3_tiny vae=h3_tiny_pipe video.height=32 "
             "video.width=32 bench.pipeline.rounds=1 bench.pipeline.warmup=0 bench.pipeline.compile_backend=eager")


@dataclass(frozen=True)
class PipelineBenchOptions:
    video: str | None
    """HEIGHTxWIDTHxFRAMES; None: the pipeline's default request."""
    text_tokens: int
    warmup: int
    steps: int
    rounds: int
    decode_warmup: int
    audio: bool
    best: bool
    compile_backend: str
    cp_backend: str
    e2e_steps: int | None
    layers: int | None
    vae: str
    seed: int
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
    for key in ("e2e_steps", "layers"):
        v = vals[key]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise UsageError(f"bench.pipeline.{key}={v}: must be null or an integer >= 1")
    if vals["vae"] not in VAE_MODES:
        raise UsageError(f"bench.pipeline.vae={vals['vae']}: one of {', '.join(VAE_MODES)}")
    video = _get(cfg, "video")
    seq = plan.derived_value("sequence") if plan is not None else None
    if hasattr(video, "keys"):  # the `video` config group
        video = None
        if seq and str(seq.get("source", "")).startswith("video"):
            video, vals["text_tokens"] = f"{seq['height']}x{seq['width']}x{seq['frames']}", int(seq["text_rows"])
    if video is not None:
        from .pipeline_build import Request

        Request.parse(video)
    tag = _get(bench, "tag")
    if tag is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", str(tag)):
        raise UsageError(f"bench.tag={tag!r}: letters, digits, '_', '.', '-' only (it names the output files)")
    from .results_file import run_folder

    return PipelineBenchOptions(video=None if video is None else str(video), out_dir=run_folder(_get(bench, "out_dir")),
                                tag=tag, **vals)


# ---------------------------------------------------------------- timing


class _Marks:
    """Timestamps of the transformer's calls (forward pre-hook) and of arbitrary points: CUDA events, else the host clock."""

    def __init__(self, torch, device):
        self.torch, self.cuda, self.marks, self.on = torch, device.type == "cuda", [], False

    def now(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def hook(self, module, args):
        if self.on:
            self.marks.append(self.now())

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a


@dataclass
class _Result:
    steps: list
    first: list
    overhead: list
    latents: Any = None
    audio_latents: Any = None
    decode_s: float | None = None
    frames: Any = None
    peak_gib: float | None = None
    error: str | None = None


class _Session:
    def __init__(self, torch, pipe, request, opts, device, progress, rank):
        from .pipeline_build import prompt_inputs

        self.torch, self.pipe, self.request, self.opts, self.device = torch, pipe, request, opts, device
        self.progress, self.rank = progress, rank
        self.prompt = prompt_inputs(pipe, opts.text_tokens, seed=opts.seed)
        self.marks = _Marks(torch, device)
        self.handle = pipe.transformer.register_forward_pre_hook(self.marks.hook)
        self.calls = opts.warmup + opts.steps
        self.video_block = "decode.video"
        mode = opts.vae if opts.vae != "auto" else ("fp16_autocast" if device.type == "cuda" else "fp32")
        self.vae_mode = mode
        self.results: dict[str, _Result] = {}
        self.counters: dict[str, int] = {}

    def vae_context(self):
        if self.vae_mode == "fp16_autocast":
            return self.torch.autocast(self.device.type, dtype=self.torch.float16)
        return contextlib.nullcontext()

    def denoise(self):
        from .pipeline_build import run_block

        m, r = self.marks, self.request
        m.marks, m.on = [], True
        start = m.now()
        try:
            st = run_block(self.pipe, "denoise", **self.prompt, height=r.height, width=r.width, num_frames=r.num_frames,
                           num_inference_steps=self.calls + 1,
                           generator=self.torch.Generator("cpu").manual_seed(self.opts.seed))
        finally:
            m.on = False
        end = m.now()
        m.sync()
        calls = m.marks
        if len(calls) != self.calls:
            raise RuntimeError(f"the denoise loop made {len(calls)} transformer calls, expected {self.calls}")
        steps = [m.seconds(a, b) for a, b in zip(calls, calls[1:] + [end])]
        return st.get("latents"), st.get("audio_latents"), steps, m.seconds(start, calls[0])

    def decode(self, block=None, **inputs):
        from .pipeline_build import run_block

        m = self.marks
        with self.vae_context():
            start = m.now()
            st = run_block(self.pipe, block or self.video_block, **inputs)
            end = m.now()
        m.sync()
        return st, m.seconds(start, end)

    def run(self, setting: Setting, decode: bool, decode_warmup: int | None = None):
        torch, res = self.torch, self.results.setdefault(setting.name, _Result([], [], []))
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        setting.enter()
        try:
            if setting.name == "plan":
                from h3plan.runtime.counters import reset_counters

                reset_counters()
            latents, audio_latents, steps, overhead = self.denoise()
            res.first.append(steps[0])
            res.steps += steps[self.opts.warmup:]
            res.overhead.append(overhead)
            if res.latents is None:
                res.latents, res.audio_latents = latents, audio_latents
            self.progress.step(f"{setting.name} denoise ({len(steps)} steps, {statistics.median(steps):.3f} s/step)")
            if decode:
                for _ in range(self.opts.decode_warmup if decode_warmup is None else decode_warmup):
                    self.decode(latents=latents, output_type="pt")
                st, res.decode_s = self.decode(latents=latents, output_type="pt")
                res.frames = st.get("videos")
                self.progress.step(f"{setting.name} decode {res.decode_s:.2f} s")
            if setting.name == "plan":
                from h3plan.runtime.counters import counters

                for k, v in counters().items():
                    self.counters[k] = self.counters.get(k, 0) + v
        finally:
            setting.exit()
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) / 2**30
            res.peak_gib = max(peak, res.peak_gib or 0.0)

    def audio_decode(self, audio_latents) -> float:
        secs = None
        for _ in range(self.opts.decode_warmup + 1):
            _, secs = self.decode(block="decode.audio", audio_latents=audio_latents)
        self.progress.step(f"audio decode {secs:.2f} s")
        return secs

    def close(self):
        self.handle.remove()


# ---------------------------------------------------------------- the run


def _distributed(torch, degree: int):
    """(rank, group, device) for Ulysses degree `degree`; U > 1 needs a torchrun launch with that many processes."""
    if degree == 1:
        return 0, None, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != degree:
        raise UsageError(f"parallel.ulysses={degree}: launch {degree} processes, e.g. torchrun --nproc_per_node={degree} "
                         f"-m h3plan action=bench bench.target=pipeline parallel=u{degree} ... (WORLD_SIZE is {world})")
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
    smoke = CPU_SMOKE
    if device.type == "cuda":
        return
    hidden = int(cfg["model"]["diffusers_config"]["hidden_size"])
    vae = cfg["vae"]["diffusers_config"]
    vae_width = int(vae["decoder_num_attention_heads"]) * int(vae["decoder_attention_head_dim"])
    if pipe_tokens is None and (hidden > CPU_MAX_HIDDEN or vae_width > CPU_MAX_HIDDEN):
        raise UsageError(f"bench.target=pipeline at real width (hidden {hidden}, VAE decoder width {vae_width}) needs a CUDA "
                         f"GPU; on the CPU run the tiny smoke form: {smoke}")
    if pipe_tokens is not None and pipe_tokens > CPU_MAX_TOKENS:
        raise UsageError(f"video={video}: {pipe_tokens:,} tokens is too long for the CPU smoke form (at most "
                         f"{CPU_MAX_TOKENS:,}); use a small canvas, e.g. {smoke}")


def _rel(torch, x, ref) -> float | None:
    if x is None or ref is None:
        return None
    d = x.float() - ref.float()
    return (d.norm() / ref.float().norm().clamp_min(1e-30)).item()


def _median(xs):
    return statistics.median(xs) if xs else None


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM (timeout?): writing what was measured")


def _measure(torch, cfg, plan, opts, device, rank, group, progress, label) -> tuple[dict, int]:
    from .pipeline_build import Request, build_pipeline, default_request, default_steps, sequence_length
    from .quality import compare

    degree = int(plan.get("parallel").get("ulysses", 1))
    pipe = build_pipeline(cfg["model"]["diffusers_config"], cfg["vae"]["diffusers_config"], vae_name=cfg["vae"]["name"],
                          layers=opts.layers, device=device, dtype="bf16", seed=opts.seed,
                          vae_dtype=torch.bfloat16 if opts.vae == "bf16" else None)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the fp32 staging of the seeded weights
    request = Request.parse(opts.video) if opts.video else default_request(pipe)
    S = sequence_length(pipe, request, opts.text_tokens)
    _check_size(cfg, device, S, request.label)
    n_sched, steps_e2e = default_steps(pipe)
    if opts.e2e_steps is not None:
        n_sched, steps_e2e = None, opts.e2e_steps
    layers = len(pipe.transformer.transformer_blocks)
    rec = records.PipelineRecord(
        video=request.label, S=S, gpus=degree, plan=label, steps_timed=opts.steps * opts.rounds, steps_e2e=steps_e2e,
        eager_step_s=None, best_step_s=None, plan_step_s=None, eager_decode_s=None, best_decode_s=None,
        plan_decode_s=None, e2e_speedup_vs_eager=None, e2e_speedup_vs_best=None, best_config="not run (bench.pipeline.best=false)",
        frames_bitwise=None, frames_psnr_db=None, recipe=str(plan.get("recipe").get("name", "")),
        lossless=bool(plan.lossless), device=_device_name(torch, device),
        timing="cuda-events" if device.type == "cuda" else "host-clock", layers=layers, num_inference_steps=n_sched,
        steps_per_call=opts.warmup + opts.steps, warmup_steps=opts.warmup, rounds=opts.rounds, audio=opts.audio)
    progress.write(f"request {request.label}: {S:,} tokens ({opts.text_tokens} text), {layers} layers, {degree} GPU(s)")
    s = _Session(torch, pipe, request, opts, device, progress, rank)
    rec.vae_precision = s.vae_mode
    eager, plan_s = Eager(), PlanSetting(pipe, plan, group, progress)
    best = Best(pipe, degree, S, opts) if opts.best else None
    if best is not None:
        rec.best_config = best.config
    rotating = [eager, plan_s] + ([best] if best is not None and degree == 1 else [])
    tail = [best] if best is not None and degree > 1 else []
    rec.order = (f"interleaved over {opts.rounds} round(s), order reversed every round"
                 + ("; best after them (context parallelism cannot be undone)" if tail else ""))
    failed = 0
    try:
        for r in range(opts.rounds):
            for setting in rotating if r % 2 == 0 else rotating[::-1]:
                _guarded(s, setting, decode=(r == 0 and setting.name != "best"))
        ref_name = _reference_setting(plan)
        ref_frames, rec.frames_reference = None, ""
        eager_res = s.results.get("eager")
        if plan.lossless and ref_name is not None:
            _guarded(s, Reference(pipe, plan), decode=True, decode_warmup=0)  # frames only, untimed
            ref_frames = s.results["reference"].frames
            rec.frames_reference = (f"diffusers eager with the plan's attention backend {ref_name}, every other lever "
                                    "off (the plan's frames must equal it bit for bit)")
        elif plan.lossless:
            ref_frames = eager_res.frames if eager_res else None
            rec.frames_reference = ("diffusers eager (the plan's attention is sdpa: diffusers' own SDPA call, so eager is "
                                    "the same-backend reference)")
        else:
            rec.frames_reference = "diffusers eager (lossy plan: PSNR/SSIM only)"
        for r in range(opts.rounds):
            for setting in tail:
                _guarded(s, setting, decode=False)
        if opts.audio and eager_res is not None and eager_res.audio_latents is not None:
            rec.audio_decode_s = s.audio_decode(eager_res.audio_latents)
    finally:
        s.close()
    res = s.results
    for name in records.SETTINGS:
        r_ = res.get(name)
        if r_ is None:
            continue
        setattr(rec, f"{name}_step_s", _median(r_.steps))
        if r_.steps:
            rec.step_s_ranges[name] = [min(r_.steps), max(r_.steps)]
        rec.first_step_s[name] = r_.first[0] if r_.first else None
        rec.peak_mem_gib[name] = r_.peak_gib
    for name, r_ in res.items():
        if r_.error:
            rec.notes.append(f"{name} failed: {r_.error}")
            failed += name != "best"
    rec.eager_decode_s = res["eager"].decode_s if "eager" in res else None
    rec.plan_decode_s = res["plan"].decode_s if "plan" in res else None
    rec.best_decode_s = rec.eager_decode_s if best is not None else None
    rec.overhead_s = _median([x for r_ in res.values() for x in r_.overhead])
    e2e = {n: records.e2e(rec.overhead_s, steps_e2e, getattr(rec, f"{n}_step_s"), getattr(rec, f"{n}_decode_s"),
                          rec.audio_decode_s) for n in records.SETTINGS}
    rec.eager_e2e_s, rec.best_e2e_s, rec.plan_e2e_s = e2e["eager"], e2e["best"], e2e["plan"]
    rec.e2e_speedup_vs_eager = records.ratio(e2e["eager"], e2e["plan"])
    rec.e2e_speedup_vs_best = records.ratio(e2e["best"], e2e["plan"])
    eager_lat = res["eager"].latents if "eager" in res else None
    rec.latents_rel_error = {n: _rel(torch, res[n].latents, eager_lat) for n in ("plan", "best", "reference") if n in res}
    rec.counters = dict(s.counters)
    if rank == 0 and "plan" in res and res["plan"].frames is not None and eager_lat is not None:
        bad = [n for n in ("eager", "plan", "reference") if n in res and res[n].frames is not None
               and not bool(torch.isfinite(res[n].frames).all())]
        if bad:  # NaN never equals NaN: say so rather than report "not bitwise"
            rec.notes.append(f"non-finite frames from {', '.join(bad)} (diverged seeded weights?): comparisons unreliable")
        q = compare(res["plan"].frames, res["eager"].frames)
        rec.frames_psnr_db, rec.frames_ssim, rec.frames_max_abs = q["psnr_db"], q["ssim"], q["max_abs"]
        if plan.lossless and ref_frames is not None:
            rec.frames_bitwise = bool(torch.equal(res["plan"].frames, ref_frames))
    rec.notes += _notes(rec, best, device)
    return asdict(rec), failed


def _guarded(s: _Session, setting: Setting, decode: bool, decode_warmup: int | None = None) -> None:
    """One turn of a setting; a failure is recorded on its result (best's failure leaves eager and plan standing)."""
    try:
        s.run(setting, decode, decode_warmup)
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 -- recorded in the record's notes; the other settings still run
        res = s.results.setdefault(setting.name, _Result([], [], []))
        res.error = _one_line(exc)
        s.progress.write(f"{setting.name}: failed: {res.error}")
        if setting.name in ("eager", "plan"):
            raise


def _reference_setting(plan) -> str | None:
    """The plan's attention backend when a same-backend eager reference must run (None: eager is that reference)."""
    try:
        backend = plan.decision("attention").setting
    except (KeyError, ValueError):
        return None
    return None if backend == "sdpa" else backend


def _notes(rec, best, device) -> list[str]:
    notes = []
    if device.type != "cuda":
        notes.append("CPU run: host clock, fused kernels refuse the CPU (counted fallbacks): plumbing only")
    first = rec.first_step_s
    if best is not None and first.get("best") is not None:
        notes.append(f"best: the first step (regional compile included) took {first['best']:.2f} s")
    if first.get("plan") is not None:
        notes.append(f"plan: the first step (kernel JIT included) took {first['plan']:.2f} s")
    if rec.num_inference_steps is None:
        notes.append(f"steps_e2e={rec.steps_e2e} set by bench.pipeline.e2e_steps, not the pipeline's default")
    else:
        notes.append(f"steps_e2e: num_inference_steps defaults to {rec.num_inference_steps} (diffusers' "
                     f"INPUT_PARAM_TEMPLATES, MiniMaxH3SetTimestepsStep); MiniMaxH3Scheduler counts the terminal sigma, "
                     f"so that is {rec.steps_e2e} transformer forwards")
    return notes


def _device_name(torch, device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


class _Quiet:
    def step(self, *a, **k):
        pass

    def write(self, *a, **k):
        pass

    def close(self):
        pass


def run(cfg, plan) -> int:
    """Entry point of `python -m h3plan action=bench target=pipeline`; 0 when eager and the plan ran, 1 otherwise."""
    opts = options(cfg, plan)
    degree = int(plan.get("parallel").get("ulysses", 1))
    import torch

    from .pipeline_build import require_transformers

    require_transformers()
    rank, group, device = _distributed(torch, degree)
    _check_size(cfg, device)
    name = _device_name(torch, device)
    tag = opts.tag or device_tag(name)
    stem = os.path.join(opts.out_dir, f"pipeline-{tag}")
    json_path, md_path, png_path = stem + ".json", stem + ".md", stem + ".png"
    label = plan_label(plan)
    doc = None
    if rank == 0:
        os.makedirs(opts.out_dir, exist_ok=True)
        doc = records.load_doc(json_path)
        if device.type != "cuda":
            print("bench: no CUDA device: host clock on the CPU; these times mean nothing (plumbing only)", flush=True)
    rounds = opts.rounds * (2 + int(opts.best))
    progress = Progress(rounds + 4 + int(opts.audio), f"pipeline bench {label}") if rank == 0 else _Quiet()
    prev = signal.signal(signal.SIGTERM, _on_sigterm) if threading.current_thread() is threading.main_thread() else None
    failed, rec = 0, None
    try:
        rec, failed = _measure(torch, cfg, plan, opts, device, rank, group, progress, label)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 -- written as a failed record
        failed = 1
        video = opts.video or "default"
        rec = asdict(records.PipelineRecord(video, 0, degree, label, 0, 0, None, None, None, None, None, None, None,
                                            None, "", None, None, device=name, error=_one_line(exc)))
        progress.write(f"failed: {rec['error']}")
    finally:
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)
        progress.close()
        if rank == 0 and rec is not None:
            doc["runs"] = doc["runs"][-9:] + [_run_meta(torch, device, label, opts, rec, degree)]
            records.merge_record(doc, rec)
            records.write_doc(doc, json_path, md_path)
    if rank != 0:
        return 1 if failed else 0
    why = records.write_chart(doc["records"], png_path)
    print(records.summary_table([r for r in doc["records"] if r["plan"] == label and r.get("device") == name]))
    print(f"wrote {json_path}, {md_path}" + (f", {png_path}" if why is None else f" ({why})"))
    return 1 if failed else 0


def _run_meta(torch, device, label, opts, rec: Mapping, degree: int) -> dict:
    import diffusers

    return {"plan": label, "video": rec.get("video"), "device": _device_name(torch, device), "gpus": degree,
            "torch": torch.__version__, "cuda": torch.version.cuda, "diffusers": diffusers.__version__,
            "options": {k: v for k, v in asdict(opts).items() if k not in ("out_dir", "tag")},
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
