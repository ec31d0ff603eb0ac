"""The action sections of the config: `verify:` (h3plan/actions/verify.py), `bench:` (h3plan/actions/bench/,
`bench.pipeline`: h3plan/actions/bench/pipeline.py) and `calibrate:` (h3plan/actions/calibrate.py), each with
the checks of its own values (`validate_actions`; h3plan/planning/schema.py types them into the whole config).

Plain dataclasses (no torch, no omegaconf), so the torch-free plan side types the sections the actions read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, List, Optional

from h3plan.errors import ConfigError
from h3plan.facts import scale_table
from h3plan.facts.workflows import DEFAULT_TASK


class Target(str, Enum):
    block = "block"
    pipeline = "pipeline"


@dataclass
class TuneConfig:
    """action=tune (h3plan/actions/tune.py): measure this GPU at the plan's shapes, write a tuned hardware file."""

    out: Optional[str] = None
    """The hardware file to write (a folder `hardware/` above it goes on hydra.searchpath); null:
    tuned/hardware/<hardware>_tuned.yaml. tune-<stem>.json / .md go beside it."""
    results: Optional[str] = None
    """Path prefix of the tune's record (<prefix>.json / .md, e.g. benchmarks/results/tune-h200); null: tune-<stem>
    beside the hardware file."""
    quick: bool = False
    """Fewer repeats, the plan's own recipe and decode precision only, a shorter latent and shorter checks."""
    check_blocks: int = 2
    """Real-width blocks action=verify's checks run on."""


@dataclass
class CalibrateConfig:
    target: str = scale_table.NAME
    """fp8_scales: the static FP8 scale table (below); step_cache: step-cache settings measured against the uncached
    video and audio (h3plan/actions/calibrate_step_cache.py); sparse_attention: keep fractions measured against the
    dense frames and soundtrack (h3plan/actions/calibrate_sparse_attention.py). Both write every candidate as a
    calibrated quality point to `evidence_out` (recipe.cache.evidence / recipe.sparse.evidence read it) and the fastest
    inside the recipe's budget as a plan, citing those points, to `plan_out`."""
    plan_out: Optional[str] = None
    """target=step_cache / sparse_attention: where the winning plan goes; null: <target>_plan.yaml."""
    evidence_out: Optional[str] = None
    """target=step_cache / sparse_attention: where every candidate's calibrated quality point goes; null:
    <target>_points.yaml."""
    prompts: Optional[str] = None
    """target=step_cache: a text file of prompts, one a line, that the checkpoint's text encoder encodes (model.path
    with text_encoder/ and tokenizer/); null: seeded prompt embeddings (calibrate.seeds), refused where the
    checkpoint has a text encoder."""
    text_tokens: int = 16
    """target=step_cache / sparse_attention: text rows of each seeded prompt."""
    out: str = f"{scale_table.NAME}.json"
    """Where the table goes. A table the held-out check refuses goes to <stem>.rejected.json instead (never
    loadable: its provenance says it failed) and the command exits 2."""
    inputs: Optional[str] = None
    """Captured inputs: a .pt file (one dict of MiniMaxH3Transformer3DModel.forward keyword arguments, or a list
    of them) or a directory of such files (h3plan.actions.calibration.capture_inputs writes one). null: seeded
    synthetic inputs (seeds x steps below)."""
    heldout_inputs: Optional[str] = None
    """Captured held-out inputs (same forms). null with `inputs` set: the last quarter (at least one) of the
    captured inputs, in file order, is held out and not calibrated on."""
    seeds: List[int] = field(default_factory=lambda: [0, 1])
    """Seeds of the synthetic calibration inputs (latents, text and audio conditioning)."""
    steps: Optional[List[int]] = None
    """Denoising steps (indices into the scheduler's timesteps) per seed; null: `count` steps evenly spread."""
    count: int = 4
    """Steps per seed when `steps` is null."""
    heldout_seeds: List[int] = field(default_factory=lambda: [1000])
    """Seeds of the held-out inputs; must not overlap `seeds`."""
    heldout_steps: Optional[List[int]] = None
    """Held-out steps; null: the midpoints between the calibration steps (other noise levels)."""
    num_inference_steps: int = 50
    """The schedule the steps index: diffusers' MiniMaxH3Scheduler.set_timesteps(num_inference_steps), at the
    pipeline group's shifts (pipeline.schedulers)."""
    seq_len: Optional[int] = None
    """Packed rows of the synthetic inputs; null: 48 on the CPU, parallel.seq_len on a GPU."""
    margin: Optional[float] = None
    """scale = 448 / (amax * margin) in the held-out check; null: recipe.fp8_static_margin."""
    max_loss_db: Optional[float] = 3.0
    """Held-out check: on the blocks' own update (final hidden state minus the stack's input) static scales may
    lose at most this much PSNR to dynamic ones (null: only the recipe's budget on the outputs counts)."""
    statistic: str = "amax"
    """What the table stores: `amax` (max |x| over every calibration input) or `percentile` (the
    `percentile` of |x| over all of them, which clips the rarest outliers)."""
    percentile: Optional[float] = 99.99
    """Also record this percentile of |x| per site (a log2 histogram, 1/16 octave); null: skip it."""
    checkpoint: Optional[str] = None
    """A diffusers MiniMaxH3Transformer3DModel directory (from_pretrained); null: seeded random weights
    (model=..., `weights_seed`), like action=verify."""
    subfolder: Optional[str] = None
    """from_pretrained subfolder (e.g. transformer) of `checkpoint`."""
    weights_seed: int = 0
    blocks: Optional[int] = None
    """Truncate the block stack (GPU smoke runs); null: every block of the model."""
    device: str = "auto"
    dtype: str = "bf16"


@dataclass
class VerifyConfig:
    """action=verify (h3plan/actions/verify.py)."""

    blocks: int = 2
    """Transformer blocks to build (real width on a GPU; the tiny model on the CPU)."""
    seq_len: Optional[int] = None
    """Packed rows; null: parallel.seq_len on a GPU, 48 on the CPU."""
    seed: int = 0
    device: str = "auto"
    """auto | cpu | cuda | cuda:N"""
    dtype: str = "bf16"
    """bf16 | fp16 | fp32"""


@dataclass
class PipelineBenchConfig:
    """bench.target=pipeline (h3plan/actions/bench/pipeline.py): diffusers' `pipe(...)` as users call it."""

    text_tokens: int = 110
    """Rows of the random prompt_embeds when the video request names none."""
    warmup: int = 2
    """Untimed transformer forwards at the start of every call (diffusers' first step has another temb shape, so
    a compiled setting traces twice: two untimed forwards keep both traces out of the timed ones)."""
    steps: int = 3
    """Timed transformer forwards per call; a row's forward figure is their median (3: the fewest a median of timed
    forwards stands on)."""
    rounds: int = 1
    """Timed calls per row, the row order reversed every round."""
    decode_warmup: int = 1
    """Untimed decodes of a short latent with the request's tile and clip shapes before a row's first call."""
    best: bool = True
    """Time diffusers' best setting (regional compile; context parallel + compile at degree > 1)."""
    eager: bool = True
    """Time diffusers eager (false: a run of other rows only, e.g. one whole call of diffusers' best)."""
    plan: bool = True
    """Time the plans (false: diffusers' rows only; the plan still names the request, the degree and the
    conditioner)."""
    compile_backend: str = "inductor"
    cp_backend: str = "_native_cudnn"
    e2e_steps: Optional[int] = None
    """Transformer forwards of one generation (null: the pipeline's num_inference_steps - 1)."""
    layers: Optional[int] = None
    """Transformer layers (null: the model config's)."""
    vae: str = "auto"
    """The VAE precisions of the eager and best rows: auto (fp32, diffusers' default, plus each plan's own) or a
    comma list of fp32, fp16, bf16."""
    plans: List[str] = field(default_factory=list)
    """More plans in the same run, each an override string resolved beside the main plan ("recipe=fp8")."""
    reference: bool = True
    """Also run diffusers eager with a lossless plan's attention backend and VAE precision (the bitwise check)."""
    stock_bits: bool = False
    """Also time the stock-bits plan: the (lossless) plan with levers.attention=sdpa, diffusers' default attention,
    whose frames must be diffusers eager's bit for bit."""
    seed: int = 0
    workflow: str = DEFAULT_TASK
    """The request's workflow: t2va (text only), fl2va (first and last keyframe, seeded images), ref2va (one seeded
    image reference); one per run, its partition alone built (two real-width partitions do not fit one GPU)."""
    prompt: bool = False
    """true: every row calls pipe(prompt="...") through diffusers' own text encoder step with a seeded conditioner at
    the model's packaged widths (model.text_encoder or model.text_encoder_default; actions/text_encoder_build.py),
    placed as the plan's memory.text_encoder says (install/text_encoder.py) for every row; the prompt has
    text_tokens bytes (one text row each). false: seeded prompt_embeds, the conditioner outside the call."""
    whole: bool = False
    """true: every row also times one whole call of the generation's forwards (e2e_steps) end to end, every forward
    between CUDA events, after its short call of warmup + steps forwards; E2E is the whole call, and the row's
    `extrapolation` check holds it against forwards x the short call's median forward + its rest (within 1%)."""
    text_encoder_weight_sets: Optional[int] = None
    """With prompt=true: the seeded conditioner's decoder layers share this many layers' weights
    (actions/text_encoder_build.share_decoder_weights): every layer and width still computes, in that many layers'
    memory, for a device or host that cannot hold the released conditioner beside the seeded pipeline the bench builds
    (a bf16 transformer an fp8 plan quantises at install); each row says so and its peak is short by the rest.
    null: every layer its own weights, as released."""
    frames_dir: Optional[str] = None
    """A folder that keeps each row's frames on disk (with the seeded weights' fingerprint): a later run of the same
    request (another process, e.g. the next device call) compares its rows against them; null: this run's rows only."""


@dataclass
class BenchConfig:
    """action=bench (h3plan/actions/bench/): eager vs the plan, side by side in one process."""

    seq_lens: List[int] = field(default_factory=lambda: [19000, 37820])
    blocks: List[int] = field(default_factory=lambda: [1, 4])
    warmup: int = 3
    iters: int = 10
    out_dir: Optional[str] = None
    """Where the results go (records merge with a results file already there: bench.out_dir=benchmarks/results adds
    to the committed tables); null: a folder of this run's own, outputs/<date>/<time> (a sweep: the job's folder)."""
    tag: Optional[str] = None
    """Output file suffix (block-<tag>.json); null: the device's short name (h200, cpu)."""
    best: bool = True
    """on | off: also time diffusers' best one-GPU setting (a copy of the eager blocks under
    `compile_repeated_blocks(fullgraph=True)`), interleaved with eager and the plan; its compile is timed apart."""
    target: Target = Target.block
    """block: transformer blocks (eager, the plan); pipeline: diffusers' MiniMaxH3ModularPipeline end to end for
    the `video` request (eager, diffusers' best setting, the plan)."""
    pipeline: PipelineBenchConfig = field(default_factory=PipelineBenchConfig)


def _positive_ints(key: str, vals) -> None:
    vals = [vals] if isinstance(vals, int) else list(vals or [])
    if not vals or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in vals):
        raise ConfigError(f"{key}={vals}", "must be a non-empty list of positive integers")


VERIFY_DEVICES = r"auto|cpu|cuda(:\d+)?"
DTYPES = ("bf16", "fp16", "fp32")


def validate_actions(c: dict[str, Any]) -> None:
    """verify.* and bench.*: the values the actions would otherwise stumble on. Raises ConfigError."""
    v, b = c["verify"], c["bench"]
    if v["blocks"] is not None and v["blocks"] < 1:
        raise ConfigError(f"verify.blocks={v['blocks']}", "must be >= 1 (the number of transformer blocks to build)")
    if v["seq_len"] is not None and v["seq_len"] < 4:
        raise ConfigError(f"verify.seq_len={v['seq_len']}", "must be >= 4 (text, audio and video rows)")
    if not re.fullmatch(VERIFY_DEVICES, v["device"]):
        raise ConfigError(f"verify.device={v['device']}", "allowed: auto, cpu, cuda, cuda:N")
    if v["dtype"] not in DTYPES:
        raise ConfigError(f"verify.dtype={v['dtype']}", "allowed: " + ", ".join(DTYPES))
    t = c.get("tune") or {}
    if t.get("check_blocks") is not None and t["check_blocks"] < 1:
        raise ConfigError(f"tune.check_blocks={t['check_blocks']}",
                          "must be >= 1 (real-width blocks the checks run on)")
    _positive_ints("bench.seq_lens", b["seq_lens"])
    _positive_ints("bench.blocks", b["blocks"])
    if b["warmup"] < 0:
        raise ConfigError(f"bench.warmup={b['warmup']}", "must be an integer >= 0")
    if b["iters"] < 1:
        raise ConfigError(f"bench.iters={b['iters']}", "must be an integer >= 1")
    if b["tag"] is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", str(b["tag"])):
        raise ConfigError(f"bench.tag={b['tag']!r}", "letters, digits, '_', '.', '-' only (it names the output files)")
