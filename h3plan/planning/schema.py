"""Structured configs: the dataclasses and enums that every config group is merged onto.

Scope: types and the checks that types cannot express (divisibility, positive lengths, known lever
names). Hydra merges each group's YAML onto these typed nodes, so an unknown key or a value outside
an enum fails during composition; `validate` runs after composition and raises `ConfigError` with
one line naming the key and what is allowed. No torch, no logic about what is fast: that lives in
h3plan/levers/.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from enum import Enum
from typing import Any, List, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from h3plan.facts.attention import BF16, missing_facts
from h3plan.errors import ConfigError, unknown_key_line
from h3plan.levers import LEVER_SETTINGS, SPECS  # declared by each lever module (SPEC), registry order

from h3plan.facts import tuned
from .action_configs import BenchConfig, CalibrateConfig, TuneConfig, VerifyConfig, validate_actions
from .hardware_config import HardwareConfig
from .memory import MemoryConfig
from .request import MIN_STEPS, STEPS_RULE, PipelineConfig, VideoConfig, sequence
from h3plan.facts.vae.tiling import tile_rule

RECIPE_DEFAULTS = {s.recipe_section: s.recipe_defaults for s in SPECS.values() if s.recipe_section}
"""A lossy lever's own recipe section -> the defaults of its knobs, declared by the lever (Spec.recipe_defaults)."""

PLAN_SECTIONS = ("hardware", "recipe", "parallel", "model", "vae", "video", "pipeline", "memory", "levers")
"""The config sections a plan holds (the composed config's, less the action's own)."""


def _setting_enum(lever: str) -> type[Enum]:
    name = "".join(p.capitalize() for p in lever.split("_")) + "Setting"
    return Enum(name, {s: s for s in ("auto",) + LEVER_SETTINGS[lever]}, type=str, module=__name__)


LEVER_ENUMS: dict[str, type[Enum]] = {lever: _setting_enum(lever) for lever in LEVER_SETTINGS}
for _enum in LEVER_ENUMS.values():
    globals()[_enum.__name__] = _enum  # picklable by name (joblib / submitit launchers)


class Action(str, Enum):
    plan = "plan"
    verify = "verify"
    bench = "bench"
    calibrate = "calibrate"
    tune = "tune"


class Format(str, Enum):
    table = "table"
    yaml = "yaml"
    json = "json"


class Detail(str, Enum):
    summary = "summary"
    full = "full"


class Checkpoint(str, Enum):
    bf16 = "bf16"
    fp8 = "fp8"
    nvfp4 = "nvfp4"


class Precision(str, Enum):
    bf16 = "bf16"
    fp8 = "fp8"


class Policy(str, Enum):
    lossless = "lossless"
    budget = "budget"


class ScaleMode(str, Enum):
    auto = "auto"
    static = "static"
    dynamic = "dynamic"


class PaddingMode(str, Enum):
    auto = "auto"
    padded = "padded"
    fixed_valid = "fixed_valid"
    valid_only = "valid_only"


class VaePrecision(str, Enum):
    """recipe.vae: the decode precision (levers/vae_precision.py); fp8: FP8 decoder GEMMs around fp16."""
    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"
    fp8 = "fp8"


# ---------------------------------------------------------------- recipe / parallel


@dataclass
class Budget:
    psnr_db_min: Optional[float] = None
    ssim_min: Optional[float] = None
    source: Optional[str] = None


@dataclass
class CacheBudget:
    """recipe.cache: the quality budget step caching must stay inside (levers/step_cache.py), apart from the kernel
    levers' `budget`, and the knobs of its schedule. No budget and no policy (the default): step_cache stays off.
    Set it as `recipe.cache={psnr_db_min:28,ssim_min:0.93}` (against the same seed's uncached frames) or name the
    published policy, `recipe.cache.policy=high`. A knob left null takes the setting's default (levers/step_cache.py
    DEFAULTS, the one place they are written), or under auto the knobs of the evidence it picks."""

    psnr_db_min: Optional[float] = None
    ssim_min: Optional[float] = None
    audio_snr_db_min: Optional[float] = None
    """The audio's SNR (dB) against the uncached soundtrack; null: not judged (most published points are video only)."""
    policy: Optional[str] = None
    """A named, published policy (levers/step_cache.POLICIES): high (SGLang's quality=high); it fixes the knobs."""
    evidence: Optional[str] = None
    """A quality points file of your checkpoint (action=calibrate calibrate.target=step_cache writes it); its points
    join the published ones and take precedence."""
    unmeasured: bool = False
    """true: a forced setting no evidence covers may run (the plan says `unmeasured`); auto never picks one."""
    computed: Optional[int] = None
    """fixed / taylor: forwards computed of the request's; null: TeleFuser's 34 of 49 scaled to the request."""
    warmup: Optional[int] = None
    """The first forwards, always computed (never skipped); null: the setting's default."""
    final: Optional[int] = None
    """The last forwards, always computed (never skipped); null: the setting's default (first_block: none, as
    Cache-DiT)."""
    threshold: Optional[float] = None
    """first_block: skip while the first block's residual changed by less than this (relative L1); 0: never skip;
    null: the high policy's."""
    max_skip: Optional[int] = None
    """At most this many forwards skipped in a row; null: the setting's default (fixed, taylor: no limit)."""
    source: Optional[str] = None


@dataclass
class SparseBudget:
    """recipe.sparse: the quality budget block-sparse attention must stay inside (levers/sparse_attention.py), apart
    from the kernel levers' `budget`; both bounds null (the default): no budget, attention stays dense. Set it as
    `recipe.sparse={ssim_min:0.8}` (against the same seed's dense frames; the published SubBlock point reports SSIM
    only, so a PSNR bound needs your checkpoint's points, recipe.sparse.evidence). keep, dense_forwards and video_only
    default to the published point's knobs (levers/sparse_attention.py DEFAULTS, the one place they are written,
    declared as its Spec.recipe_defaults)."""

    psnr_db_min: Optional[float] = None
    ssim_min: Optional[float] = None
    keep: float = RECIPE_DEFAULTS["sparse"]["keep"]
    """The fraction of key blocks a routed query block keeps."""
    dense_forwards: int = RECIPE_DEFAULTS["sparse"]["dense_forwards"]
    """The first forwards of a generation run dense attention."""
    video_only: bool = RECIPE_DEFAULTS["sparse"]["video_only"]
    """Route target-video query blocks only (every other query block dense); false routes every query block."""
    evidence: Optional[str] = None
    """A quality points file of your checkpoint (action=calibrate calibrate.target=sparse_attention writes it); its
    points take precedence over the published one."""
    unmeasured: bool = False
    """Run block_sparse at knobs no published or calibrated point covers (the plan says no measurement backs it)."""
    source: Optional[str] = None


@dataclass
class Tier:
    """recipe.tier: a named stack of lossy levers (conf/tier/<name>.yaml sets the recipe, its budgets and this)."""

    name: str = MISSING
    evidence: str = MISSING
    """What is known of the stack's quality as a whole, with its source (each part's own evidence is its lever's)."""


@dataclass
class RecipeConfig:
    name: str = MISSING
    tier: Optional[Tier] = None
    """The named tier that set this recipe and its budgets (conf/tier/, `tier=quality`); null: none."""
    checkpoint: Checkpoint = MISSING
    """Quantization of the block linears in the checkpoint."""
    attention: Precision = MISSING
    """Attention precision the recipe asks for."""
    policy: Policy = MISSING
    """lossless: no lossy lever, forced or auto; budget: lossy levers allowed within `budget`."""
    budget: Budget = field(default_factory=Budget)
    fp8_scale_mode: ScaleMode = ScaleMode.auto
    fp8_static_table: Optional[str] = None
    fp8_static_margin: float = 1.0
    vae: VaePrecision = VaePrecision.fp32
    """The VAE decode: fp32 (diffusers' default, lossless), fp16 / bf16 (lossy), fp8 (FP8 tiles, fp16 around them)."""
    cache: CacheBudget = field(default_factory=CacheBudget)
    """The step-caching budget and schedule (levers/step_cache.py); no budget: no step cache."""
    sparse: SparseBudget = field(default_factory=SparseBudget)
    """The sparse attention budget and routing (levers/sparse_attention.py); no budget: dense attention."""
    source: str = MISSING


@dataclass
class ParallelConfig:
    name: str = MISSING
    ulysses: int = MISSING
    """Ulysses degree (GPUs sharing one sequence); must divide the attention heads."""
    ring: int = 1
    """Ring degree: ring blocks of the sequence whose keys/values rotate between Ulysses groups (across nodes);
    world = ring x ulysses ranks (h3plan/facts/ring_plan.py). 1: no ring."""
    seq_len: Optional[int] = None
    """Packed sequence length in tokens (text + audio + video rows); null: derived from the `video` request.
    Set it to plan for a length no request gives (it wins, and the plan says so)."""
    batch: int = 1
    attention_chunks: int = 1
    """Chunks of local heads for the overlapped all-to-all (1 = no overlap)."""
    padding: PaddingMode = PaddingMode.auto
    source: str = MISSING


# ---------------------------------------------------------------- model / vae


@dataclass
class TransformerKwargs:
    """diffusers MiniMaxH3Transformer3DModel.__init__ keyword arguments (diffusers 0.42.1)."""

    num_attention_heads: int = MISSING
    attention_head_dim: int = MISSING
    hidden_size: int = MISSING
    num_layers: int = MISSING
    num_refiner_layers: int = MISSING
    ffn_dim: int = MISSING
    in_channels: int = MISSING
    audio_in_channels: int = MISSING
    patch_size: List[int] = MISSING
    text_dim: int = MISSING
    freq_dim: int = MISSING
    time_embed_hidden_dim: int = MISSING
    time_embed_dim: int = MISSING
    rope_freq_dim: int = MISSING
    rope_theta: float = MISSING
    norm_eps: float = MISSING
    qk_norm_eps: float = MISSING
    final_norm_eps: float = MISSING


@dataclass
class ModelConfig:
    name: str = MISSING
    diffusers_config: TransformerKwargs = field(default_factory=TransformerKwargs)
    source: str = MISSING
    path: Optional[str] = None
    """A local diffusers checkpoint folder (a pipeline's, with transformer/ and vae/, or the transformer's own):
    the plan takes its widths from the folder's config.json files (h3plan/planning/checkpoint.py), and action=verify /
    action=bench load its weights with from_pretrained instead of seeding them. null: seeded weights."""
    text_encoder: Optional[Any] = None
    """The Qwen3-VL conditioner's config (its config.json: text_config, vision_config, tie_word_embeddings), read from
    model.path's text_encoder/config.json or given here; null: prompt_embeds given, the conditioner is not planned
    (planning/text_encoder.py; memory.text_encoder places it)."""
    text_encoder_default: Optional[Any] = None
    """The released pipeline's conditioner config, packaged with its source (model/h3.yaml: Qwen3-VL-32B's widths):
    planned when memory.text_encoder names a placement (resident, offload_after, host) and model.text_encoder is null;
    auto keeps prompt_embeds given. The pipeline bench's seeded conditioner (bench.pipeline.prompt=true) is built
    from it."""


@dataclass
class VaeKwargs:
    """diffusers AutoencoderKLMiniMaxH3.__init__ keyword arguments (latents_mean/std left at diffusers' defaults)."""

    in_channels: int = MISSING
    out_channels: int = MISSING
    latent_channels: int = MISSING
    block_out_channels: List[int] = MISSING
    layers_per_block: int = MISSING
    spatial_downsample_factors: List[int] = MISSING
    temporal_downsample_factors: List[int] = MISSING
    norm_num_groups: int = MISSING
    norm_eps: float = MISSING
    spatial_padding_mode: str = MISSING
    decoder_num_layers: int = MISSING
    decoder_num_attention_heads: int = MISSING
    decoder_attention_head_dim: int = MISSING
    decoder_num_register_tokens: int = MISSING
    decoder_ffn_mult: int = MISSING
    decoder_rope_theta: float = MISSING
    decoder_rope_dim_ratio: float = MISSING
    decoder_norm_eps: float = MISSING
    clip_length: int = MISSING
    token_drop: int = MISSING


@dataclass
class Tile:
    """Spatial decode tile in pixels (diffusers' enable_tiling); frames: null = diffusers' temporal chunks."""

    height: Optional[int] = None
    width: Optional[int] = None
    overlap: Optional[int] = None
    frames: Optional[int] = None
    source: Optional[str] = None


@dataclass
class VaeConfig:
    name: str = MISSING
    diffusers_config: VaeKwargs = field(default_factory=VaeKwargs)
    default_tile: Tile = field(default_factory=Tile)
    fp8_tile: Tile = field(default_factory=Tile)
    custom_tile: Tile = field(default_factory=Tile)
    source: str = MISSING


# ---------------------------------------------------------------- top level


def _levers_dataclass() -> type:
    return make_dataclass(
        "LeversConfig",
        [(lever, LEVER_ENUMS[lever], field(default=LEVER_ENUMS[lever]["auto"])) for lever in LEVER_SETTINGS],
        namespace={"__module__": __name__, "__doc__": "Every lever: `auto` or one of its settings."},
    )


LeversConfig = _levers_dataclass()


@dataclass
class H3PlanConfig:
    action: Action = Action.plan
    format: Format = Format.table
    detail: Detail = Detail.summary
    """format=table: `summary` leads with what runs, what is lossy, what has no kernel or never ran, then one line
    per lever; `full` prints every reason with its sources and the derived numbers."""
    out: Optional[str] = None
    plan: Optional[str] = None
    """A saved plan file (`out=` wrote it; .json or YAML): read and checked (planned again from its own config), then
    printed or acted on, instead of planning from the command line's groups."""
    strict: bool = False
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    vae: VaeConfig = field(default_factory=VaeConfig)
    video: VideoConfig = field(default_factory=VideoConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    levers: LeversConfig = field(default_factory=LeversConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    calibrate: CalibrateConfig = field(default_factory=CalibrateConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)


SCHEMA_NAME = "h3plan_schema"


def register() -> None:
    """Store the schema in Hydra's ConfigStore (config.yaml lists it first in its defaults), once per process:
    building the structured node costs as much as a fifth of a composition."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    if f"{SCHEMA_NAME}.yaml" not in store.repo:
        store.store(name=SCHEMA_NAME, node=H3PlanConfig)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def to_plain(cfg: DictConfig | dict) -> dict[str, Any]:
    """The composed config as plain dicts (enums as their names); a MISSING value raises ConfigError."""
    from omegaconf.errors import MissingMandatoryValue

    if isinstance(cfg, dict):
        cfg = OmegaConf.merge(_schema_node(), cfg)  # merge copies its first argument: the cached node stays as built
    try:
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        raise ConfigError(str(e.full_key), "missing value: the schema requires it (set it in your YAML or on the "
                                           "command line)") from None


def _schema_node() -> DictConfig:
    """OmegaConf.structured(H3PlanConfig), built once a process: a plan file read back or a dict resolved merges onto
    it, and building it costs about five deep copies of it."""
    node = _STRUCTURED.get(H3PlanConfig)
    if node is None:
        node = _STRUCTURED[H3PlanConfig] = OmegaConf.structured(H3PlanConfig)
    return node


_STRUCTURED: dict[type, DictConfig] = {}


def _hints(node: type) -> dict[str, Any]:
    import typing

    cached = _HINTS.get(node)
    if cached is None:
        cached = _HINTS[node] = typing.get_type_hints(node)
    return cached


_HINTS: dict[type, dict[str, Any]] = {}


def _structured(tp) -> tuple[type | None, bool]:
    """(the dataclass a field holds, whether it is a list of them); (None, False) for anything else."""
    import dataclasses
    import typing

    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Union and len(args) == 1:
        tp, args = args[0], list(typing.get_args(args[0]))
    if dataclasses.is_dataclass(tp):
        return tp, False
    if typing.get_origin(tp) in (list, List) and args and dataclasses.is_dataclass(args[0]):
        return args[0], True
    return None, False


def check_keys(c: dict[str, Any], node: type = None, prefix: str = "") -> None:
    """Every key of the composed config is a schema field. Composition already refuses `key=value` on an
    unknown key; `+key=value` adds it past the struct check, so this walk catches it. Raises ConfigError."""
    hints = _hints(node or H3PlanConfig)
    for k, v in c.items():
        key = f"{prefix}{k}"
        if k not in hints:
            raise ConfigError(key, unknown_key_line(key, list(hints)).partition(": ")[2])
        inner, many = _structured(hints[k])
        if inner is not None and many and isinstance(v, list):
            for i, item in enumerate(v):
                if isinstance(item, dict):
                    check_keys(item, inner, f"{key}[{i}].")
        elif inner is not None and isinstance(v, dict):
            check_keys(v, inner, f"{key}.")


PSNR_DB_MAX = 100.0  # a budget above this admits no lossy lever: e4m3 keeps 3 mantissa bits (tens of dB)


POSITIVE = {
    "hardware.device.sm_count": "SMs", "hardware.device.memory_gb": "GB", "hardware.device.memory_gib": "GiB",
    "hardware.device.hbm_tbps": "TB/s", "hardware.device.nvlink_gbps": "GB/s",
    "hardware.device.nic_gbps": "GB/s (null: not known, and the plan says what it assumes)",
    "hardware.peak_dense_tflops.*": "TFLOP/s", "hardware.efficiency.*": "share of the peak",
    "hardware.measured.hbm_copy_tbps": "TB/s",
    "hardware.measured.gemm_tflops.*": "TFLOP/s", "hardware.measured.attention[].*": "TFLOP/s",
    "hardware.measured.gemm_block[].ms": "ms", "hardware.measured.elementwise[].ms": "ms",
    "hardware.measured.decode[].seconds": "s", "hardware.measured.encode[].seconds": "s",
    "hardware.measured.ulysses.a2a[].tensor_ms": "ms", "hardware.measured.ulysses.a2a[].gbps_leaving_rank": "GB/s",
    "memory.host_link_gbps": "GB/s",
}
"""Every size, rate and bandwidth the plan sizes or divides by: null where a fact allows it (unknown), else positive.
`*`: every field of that mapping but its source, the shape keys and what says where it came from; `[]`: every entry
of that list."""
_SHAPE_KEYS = ("seq_len", "heads", "source", "context", "provenance")


def _leaves(node: Any, parts: list[str], path: str):
    """(key path, value) of every number under `node` that `parts` (a POSITIVE path, split at dots) names."""
    if not parts:
        for i, v in enumerate(node if isinstance(node, list) else [node]):
            yield (f"{path}[{i}]" if isinstance(node, list) else path), v
        return
    head, rest = parts[0], parts[1:]
    many = head.endswith("[]")
    name = head[:-2] if many else head
    if name == "*":
        children = [(f"{path}.{k}", v) for k, v in (node or {}).items() if k not in _SHAPE_KEYS]
    else:
        children = [(f"{path}.{name}" if path else name, (node or {}).get(name))]
    for key, child in children:
        if child is None:
            continue
        if many:
            for i, item in enumerate(child):
                yield from _leaves(item, rest, f"{key}[{i}]")
        else:
            yield from _leaves(child, rest, key)


def _check_positive(c: dict[str, Any]) -> None:
    """Every POSITIVE value that is set is a number > 0: a zero rate would divide by zero, a negative one plan a
    negative time, and a zero NIC rate would read as unknown."""
    for pattern, unit in POSITIVE.items():
        for key, v in _leaves(c, pattern.split("."), ""):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
                raise ConfigError(f"{key}={v}", f"must be a positive number of {unit}")


def _check_values(c: dict[str, Any]) -> None:
    """Values in range that the types let through (a step count diffusers refuses, a GPU of no memory ...)."""
    steps = c["pipeline"]["num_inference_steps"]
    if steps < MIN_STEPS:
        raise ConfigError(f"pipeline.num_inference_steps={steps}", STEPS_RULE)
    _check_positive(c)
    m = c["memory"]
    if m["max_ulysses"] < 1:
        raise ConfigError(f"memory.max_ulysses={m['max_ulysses']}",
                          "must be >= 1 (the largest Ulysses degree fit suggests)")
    if not 0 <= m["reserve_fraction"] < 1:
        raise ConfigError(f"memory.reserve_fraction={m['reserve_fraction']}", "must be in [0, 1)")
    for key, none in (("budget", "use recipe=bf16 for a lossless plan"), ("cache", "no step cache: leave both null"),
                      ("sparse", "dense attention: leave both null")):
        b = c["recipe"][key]  # the kernel levers' budget, step caching's and sparse attention's own
        if b["psnr_db_min"] is not None and not 0 < b["psnr_db_min"] <= PSNR_DB_MAX:
            raise ConfigError(f"recipe.{key}.psnr_db_min={b['psnr_db_min']}",
                              f"must be in (0, {PSNR_DB_MAX:g}] dB: a higher bar admits no lossy lever ({none})")
        if b["ssim_min"] is not None and not 0 < b["ssim_min"] <= 1:
            raise ConfigError(f"recipe.{key}.ssim_min={b['ssim_min']}", "must be in (0, 1]")


def validate(cfg: DictConfig | dict) -> dict[str, Any]:
    """Check what types cannot; return the plan sections as plain dicts. Raises ConfigError."""
    import re

    c = to_plain(cfg)
    check_keys(c)
    validate_actions(c)
    heads = c["model"]["diffusers_config"]["num_attention_heads"]
    head_dim = c["model"]["diffusers_config"]["attention_head_dim"]
    p = c["parallel"]
    u = p["ulysses"]
    if u < 1 or heads % u:
        raise ConfigError(
            f"parallel.ulysses={u}",
            f"the Ulysses degree must divide the {heads} attention heads of model {c['model']['name']}; allowed: "
            + ", ".join(map(str, _divisors(heads))),
        )
    if p["batch"] < 1:
        raise ConfigError(f"parallel.batch={p['batch']}", "must be >= 1")
    if isinstance(p["ring"], bool) or not isinstance(p["ring"], int) or p["ring"] < 1:
        raise ConfigError(f"parallel.ring={p['ring']}", "must be an integer >= 1 (1 = no ring)")
    world = p["ring"] * u
    p["seq_len"], c["sequence"], c["sequence_basis"] = sequence(c)  # explicit parallel.seq_len, else the video request
    if p["seq_len"] < world:
        raise ConfigError(f"parallel.seq_len={p['seq_len']}",
                          f"must be at least ring {p['ring']} x ulysses {u} = {world} "
                          "(one row per rank)")
    if p["attention_chunks"] < 1:
        raise ConfigError(f"parallel.attention_chunks={p['attention_chunks']}", "must be >= 1 (1 = no overlap)")
    rope = 2 * 3 * c["model"]["diffusers_config"]["rope_freq_dim"]
    if rope > head_dim:
        raise ConfigError("model.diffusers_config.rope_freq_dim",
                          f"2*3*rope_freq_dim = {rope} exceeds attention_head_dim {head_dim}")
    r = c["recipe"]
    if r["fp8_static_margin"] <= 0:
        raise ConfigError(f"recipe.fp8_static_margin={r['fp8_static_margin']}", "must be > 0")
    if r["policy"] == "budget" and (r["budget"]["psnr_db_min"] is None or r["budget"]["ssim_min"] is None):
        raise ConfigError("recipe.budget", "a budget policy needs psnr_db_min and ssim_min")
    _check_values(c)
    for spec in SPECS.values():  # a lever's own recipe section (recipe.cache, recipe.sparse)
        problem = spec.config_problem(r[spec.recipe_section]) if spec.config_problem else None
        if problem:
            raise ConfigError(*problem)
    vae = c["vae"]["diffusers_config"]
    ratio = 1
    for f in vae["spatial_downsample_factors"]:
        ratio *= f
    for tile_name in ("default_tile", "fp8_tile", "custom_tile"):
        tile = c["vae"][tile_name]
        broken = tile_rule(tile["height"], tile["width"], tile["overlap"], ratio)
        if broken:
            raise ConfigError(f"vae.{tile_name}.{broken[0]}={tile[broken[0]]}", broken[1])
    hw = c["hardware"]
    m = re.fullmatch(r"sm(\d+)", str(hw["name"]))
    cc = str(hw["compute_capability"])
    if m and cc.replace(".", "") != m.group(1):
        raise ConfigError(f"hardware.name={hw['name']}", f"disagrees with hardware.compute_capability={cc} "
                                                         f"(sm{cc.replace('.', '')}): "
                          "an smNN name is its compute capability (name a custom GPU otherwise)")
    if not re.fullmatch(r"\d+\.\d+", cc):
        raise ConfigError(f"hardware.compute_capability={cc}", "must be major.minor, e.g. 9.0")
    dev = c["hardware"]["device"]
    if dev.get("memory_gib") is not None:
        dev["memory_gb"] = round(dev["memory_gib"] * 2**30 / 1e9, 3)
    for part in ("settings", "kernels_checked"):
        for lever, settings in (c["hardware"]["verified"].get(part) or {}).items():
            if lever not in LEVER_SETTINGS:
                raise ConfigError(f"hardware.verified.{part}.{lever}",
                                  "unknown lever; allowed: " + ", ".join(LEVER_SETTINGS))
            bad = [s for s in settings if s not in LEVER_SETTINGS[lever]]
            if bad:
                raise ConfigError(f"hardware.verified.{part}.{lever}",
                                  f"unknown setting {bad[0]!r}; allowed: " + ", ".join(LEVER_SETTINGS[lever]))
    if c["hardware"]["verified"].get("kernels_checked") and not c["hardware"]["verified"].get("kernels_checked_on"):
        raise ConfigError("hardware.verified.kernels_checked",
                          "needs kernels_checked_on: the GPU the kernels were checked on")
    for backend in c["hardware"]["attention_rank"]["order"]:
        if backend not in BF16:
            raise ConfigError("hardware.attention_rank.order",
                              f"unknown BF16 backend {backend!r}; allowed: {', '.join(BF16)}")
    for path, backend in missing_facts(c["hardware"]):
        raise ConfigError(path, f"missing: attention backend {backend} needs this capability fact "
                                f"(conf/hardware/*.yaml)")
    for dt in c["hardware"]["cudnn"]["fp8_output_dtypes"]:
        if dt not in ("fp8", "bf16", "fp16"):
            raise ConfigError("hardware.cudnn.fp8_output_dtypes", f"unknown dtype {dt!r}; allowed: fp8, bf16, fp16")
    _check_tuned(c["hardware"], c.get("strict", False))
    out = {k: c[k] for k in PLAN_SECTIONS}
    out["sequence"], out["sequence_basis"] = c["sequence"], c["sequence_basis"]
    return out


def _check_tuned(hw: dict, strict: bool) -> None:
    """A tuned file's checks name real lever settings; strict=true refuses a stale one (h3plan/facts/tuned.py)."""
    t = hw.get("tuned")
    if not t:
        return
    for i, c in enumerate(t.get("checks") or ()):
        if c["lever"] not in LEVER_SETTINGS or c["setting"] not in LEVER_SETTINGS[c["lever"]]:
            raise ConfigError(f"hardware.tuned.checks[{i}]", f"unknown lever setting {c['lever']}={c['setting']}")
    diff, _ = tuned.stale(t)
    if strict and diff:
        raise ConfigError("hardware.tuned", f"stale: {'; '.join(diff)} (strict=true refuses it; tune again on this "
                                            f"machine: "
                          f"{t['command']})")
