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
from typing import Any, Dict, List, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from h3plan.attention import BACKENDS, BF16, missing_facts
from h3plan.errors import ConfigError, unknown_key_line
from h3plan.levers import LEVER_SETTINGS  # declared by each lever module (SPEC), registry order

from .action_configs import BenchConfig, CalibrateConfig, VerifyConfig, validate_actions
from .memory import MemoryConfig
from .request import PipelineConfig, VideoConfig, sequence
from h3plan.vae.tiling import tile_rule

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


# ---------------------------------------------------------------- hardware


@dataclass
class DeviceFacts:
    sm_count: Optional[int] = MISSING
    memory_gb: Optional[float] = MISSING
    memory_gib: Optional[float] = None
    """The device's memory in GiB (2^30 bytes), as torch.cuda reports it; set, it replaces memory_gb (which
    validate() then holds in vendor GB), e.g. hardware.device.memory_gib=80 for an 80 GiB card."""
    hbm_tbps: Optional[float] = MISSING
    nvlink_gbps: Optional[float] = MISSING
    """NVLink bandwidth per GPU, both directions together (vendor convention); one direction is half."""
    nic_gbps: Optional[float] = None
    """Network GB/s one way per GPU between nodes (the ring's P2P); null: never measured, the ring lever assumes
    one 400 Gb/s NIC per GPU and says so."""
    source: str = MISSING


@dataclass
class PeakFacts:
    """Vendor dense (no sparsity) tensor-core peaks in TFLOP/s; null where no source publishes one."""

    bf16: Optional[float] = MISSING
    fp8: Optional[float] = MISSING
    nvfp4: Optional[float] = MISSING
    source: str = MISSING


@dataclass
class Fa4TileSpeed:
    """FA4-default time / tile time at one attention shape, one entry per measuring run."""

    seq_len: int = MISSING
    heads: int = MISSING
    speedups: List[float] = MISSING
    block_speedups: List[float] = field(default_factory=list)
    """The whole lossless block with the tile against the same plan with FA4's default tile (plan A / plan
    B interleaved in one process), one entry per run: what the tile buys where it is used."""


@dataclass
class Fa4Tile:
    """A measured forward tile for FA4 on this hardware, by head dim (FA4's `_flash_attn_fwd` arguments)."""

    head_dim: int = MISSING
    tile_m: int = MISSING
    tile_n: int = MISSING
    mma_pv_is_rs: bool = MISSING
    intra_wg_overlap: bool = MISSING
    bitwise_vs_default: bool = MISSING
    """The tile's output is bit-identical to FA4's own default tile at the measured shapes."""
    measured: List[Fa4TileSpeed] = MISSING
    """Where the tile was timed against FA4's default; auto uses it at the nearest sequence length only
    when every run there measured it faster."""
    source: str = MISSING


@dataclass
class Fa4Facts:
    bf16: bool = MISSING
    one_cta: bool = MISSING
    two_cta: bool = MISSING
    fp8: bool = MISSING
    two_cta_regresses_long: bool = MISSING
    source: str = MISSING
    tuned_tiles: List[Fa4Tile] = field(default_factory=list)
    """Measured tiles that beat FA4's default (empty: FA4's own heuristic is all there is)."""


@dataclass
class CudnnFacts:
    version: Optional[str] = MISSING
    """The cuDNN version the plan assumes is installed (override to match yours)."""
    bf16: bool = MISSING
    fp8: bool = MISSING
    fp8_output_dtypes: List[str] = MISSING
    fp8_min_version: str = MISSING
    fp8_excluded_versions: List[str] = field(default_factory=list)
    bf16_output_min_version: Optional[str] = None
    fp8_requires: List[str] = field(default_factory=list)
    fp8_output_note: Optional[str] = None
    source: str = MISSING


@dataclass
class GemmFacts:
    fp8: bool = MISSING
    nvfp4: bool = MISSING
    source: str = MISSING


@dataclass
class VaeOpsFacts:
    registered: bool = MISSING
    source: str = MISSING
    h3plan_speedup: Optional[List[float]] = None
    """[min, max] end-to-end decode speedup of h3plan's fused path over diffusers eager on this GPU; null: never measured."""
    h3plan_source: Optional[str] = None
    graphs_speedup: Optional[List[float]] = None
    """[min, max] decode speedup over diffusers eager with vae_graphs=on and diffusers' ops; null: never measured."""
    graphs_fused_speedup: Optional[List[float]] = None
    """[min, max] decode speedup over diffusers eager with vae_graphs=on and the fused ops; null: never measured."""
    graphs_source: Optional[str] = None


@dataclass
class AttentionRank:
    order: List[str] = MISSING
    """BF16 attention backends, fastest first."""
    measured: bool = MISSING
    source: str = MISSING
    fp8_source: str = MISSING
    """Why (or on what evidence) cuDNN FP8 is the FP8 attention on this hardware."""


AttentionPoint = make_dataclass(  # one TFLOP/s field per attention backend (h3plan.attention), BF16 ones first
    "AttentionPoint", [("seq_len", int, field(default=MISSING)), ("heads", int, field(default=MISSING))]
    + [(name, Optional[float], field(default=None)) for name in sorted(BACKENDS, key=lambda n: n not in BF16)],
    namespace={"__doc__": "Measured attention TFLOP/s (4*S^2*H*D / time) at one per-rank shape; null = not measured.",
               "__module__": __name__})


@dataclass
class GemmThroughput:
    bf16: Optional[float] = None
    fp8: Optional[float] = None
    nvfp4: Optional[float] = None


@dataclass
class BlockPoint:
    """One diffusers MiniMaxH3TransformerBlock forward at real width, one GPU (eager; torch.compile)."""

    seq_len: int = MISSING
    eager_ms: Optional[float] = None
    eager_attention_ms: Optional[float] = None
    compile_ms: Optional[float] = None
    compile_rel_err: Optional[float] = None


@dataclass
class VaeDecodeFacts:
    """diffusers AutoencoderKLMiniMaxH3.decode, default config, FP16 autocast."""

    latent: List[int] = field(default_factory=list)
    output: List[int] = field(default_factory=list)
    seconds_min: Optional[float] = None
    seconds_max: Optional[float] = None
    peak_gib: Optional[float] = None


@dataclass
class A2aPoint:
    """dist.all_to_all_single of one per-rank (S/U, H, D) bf16 tensor at Ulysses degree U (median)."""

    degree: int = MISSING
    seq_len: int = MISSING
    tensor_ms: float = MISSING
    gbps_leaving_rank: float = MISSING
    """(U-1)/U of the tensor's bytes / tensor_ms: what one rank sends to the others per second."""


@dataclass
class OverlapPoint:
    """The installed plan's block stack at degree U with ulysses_overlap on against off (off time / on time),
    one entry per interleaved run."""

    degree: int = MISSING
    seq_len: int = MISSING
    speedups: List[float] = MISSING


@dataclass
class ExchangePoint(OverlapPoint):
    """The installed plan's block stack at degree U with ulysses_exchange=<setting> against packed (packed
    time / that setting's time), one entry per interleaved run."""

    setting: str = "projection"


@dataclass
class UlyssesMeasured:
    a2a: List[A2aPoint] = field(default_factory=list)
    overlap: List[OverlapPoint] = field(default_factory=list)
    exchange: List[ExchangePoint] = field(default_factory=list)
    source: str = ""


@dataclass
class CompilePoint:
    """diffusers' regional compile over the installed plan against the same plan uncompiled (plain time /
    compiled time), one entry per interleaved run."""

    recipe: str = MISSING
    seq_len: int = MISSING
    speedups: List[float] = MISSING
    source: str = MISSING


@dataclass
class ActQuantPoint:
    """The installed FP8 block with fp8_act_quant=row against tensor (tensor time / row time), one entry per
    interleaved A/B run."""

    seq_len: int = MISSING
    speedups: List[float] = MISSING


@dataclass
class ActQuantMeasured:
    block: List[ActQuantPoint] = field(default_factory=list)
    source: str = ""


@dataclass
class VaeFp8Point:
    latent: List[int] = MISSING
    speedup: float = MISSING
    """diffusers eager at the same tile geometry / the FP8 plan's decode."""
    psnr_db: float = MISSING
    """The plan's decoded frames against that eager decode."""
    peak_ratio: float = MISSING
    source: str = MISSING


@dataclass
class VaePrecisionPoint:
    precision: str = MISSING
    """fp16 | bf16: the decode precision (levers/vae_precision.py) measured against the fp32 decode."""
    latent: List[int] = MISSING
    psnr_db: float = MISSING
    """Its decoded frames against the fp32 decode's (peak 2: the VAE's normalized range)."""
    ssim: float = MISSING
    speedup: float = MISSING
    """The fp32 eager decode's time / this precision's eager decode time, in the same run."""
    source: str = MISSING


@dataclass
class MeasuredFacts:
    on_hardware: bool = MISSING
    hbm_copy_tbps: Optional[float] = None
    gemm_tflops: GemmThroughput = field(default_factory=GemmThroughput)
    attention: List[AttentionPoint] = field(default_factory=list)
    block: List[BlockPoint] = field(default_factory=list)
    vae_decode: VaeDecodeFacts = field(default_factory=VaeDecodeFacts)
    modulation_eager_x_hbm_floor: List[float] = field(default_factory=list)
    """Eager RMSNorm + indexed modulation time over the HBM floor (min, max); compiled below."""
    modulation_compile_x_hbm_floor: Optional[float] = None
    ulysses: UlyssesMeasured = field(default_factory=UlyssesMeasured)
    """Multi-GPU measurements by Ulysses degree (empty: estimates from NVLink bandwidth, borrowed rules)."""
    compile: List[CompilePoint] = field(default_factory=list)
    """The compile lever's evidence (empty: never measured, auto keeps it off)."""
    fp8_act_quant: ActQuantMeasured = field(default_factory=ActQuantMeasured)
    """fp8_act_quant's evidence: row vs tensor on the whole FP8 block (empty: never measured, auto keeps tensor)."""
    vae_fp8: List[VaeFp8Point] = field(default_factory=list)
    """The FP8 VAE decode (vae_tiles=fp8_tiles) against diffusers eager at the same tiles (empty: never measured)."""
    vae_precision: List[VaePrecisionPoint] = field(default_factory=list)
    """The fp16 / bf16 decodes against the fp32 decode (empty: never measured; the plan says so)."""
    never_measured: List[str] = field(default_factory=list)
    source: str = MISSING


@dataclass
class Efficiency:
    """Assumed fraction of the dense peak reached, for estimates on hardware never measured here."""

    attention: Optional[float] = None
    gemm: Optional[float] = None
    source: str = MISSING


@dataclass
class TuningFacts:
    """Thresholds between measured points (interpolations; each YAML says so)."""

    step_fusions_min_rows_per_rank: int = MISSING
    static_scales_min_degree: int = MISSING
    static_scales_min_seq_len: int = MISSING
    overlap_min_seq_len: int = MISSING
    fp8_codes_dynamic_min_seq_len: int = MISSING
    source: str = MISSING


@dataclass
class VerifiedFacts:
    """Which lever settings h3plan has run on real hardware of this kind."""

    max_ulysses_degree: int = 0
    settings: Dict[str, List[str]] = field(default_factory=dict)
    kernels_checked_on: Optional[str] = None
    """The GPU where the kernels of `kernels_checked` passed their GPU tests against their references (their
    settings never ran on this hardware: the NVFP4 levers on Blackwell, checked on sm90)."""
    kernels_checked: Dict[str, List[str]] = field(default_factory=dict)
    source: str = MISSING


@dataclass
class HardwareConfig:
    name: str = MISSING
    arch: str = MISSING
    compute_capability: str = MISSING
    products: List[str] = MISSING
    source: str = MISSING
    device: DeviceFacts = field(default_factory=DeviceFacts)
    peak_dense_tflops: PeakFacts = field(default_factory=PeakFacts)
    fa4: Fa4Facts = field(default_factory=Fa4Facts)
    cudnn: CudnnFacts = field(default_factory=CudnnFacts)
    gemm: GemmFacts = field(default_factory=GemmFacts)
    vae_ops: VaeOpsFacts = field(default_factory=VaeOpsFacts)
    attention_rank: AttentionRank = field(default_factory=AttentionRank)
    measured: MeasuredFacts = field(default_factory=MeasuredFacts)
    efficiency: Efficiency = field(default_factory=Efficiency)
    tuning: TuningFacts = field(default_factory=TuningFacts)
    verified: VerifiedFacts = field(default_factory=VerifiedFacts)


# ---------------------------------------------------------------- recipe / parallel


@dataclass
class Budget:
    psnr_db_min: Optional[float] = None
    ssim_min: Optional[float] = None
    source: Optional[str] = None


@dataclass
class RecipeConfig:
    name: str = MISSING
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
    source: str = MISSING


@dataclass
class ParallelConfig:
    name: str = MISSING
    ulysses: int = MISSING
    """Ulysses degree (GPUs sharing one sequence); must divide the attention heads."""
    ring: int = 1
    """Ring degree: ring blocks of the sequence whose keys/values rotate between Ulysses groups (across nodes);
    world = ring x ulysses ranks (h3plan/planning/ring_plan.py). 1: no ring."""
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
    from dataclasses import make_dataclass

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
        cfg = OmegaConf.merge(OmegaConf.structured(H3PlanConfig), cfg)
    try:
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        raise ConfigError(str(e.full_key), "missing value: the schema requires it (set it in your YAML or on the command line)") from None


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
        raise ConfigError(f"parallel.seq_len={p['seq_len']}", f"must be at least ring {p['ring']} x ulysses {u} = {world} "
                          "(one row per rank)")
    if p["attention_chunks"] < 1:
        raise ConfigError(f"parallel.attention_chunks={p['attention_chunks']}", "must be >= 1 (1 = no overlap)")
    rope = 2 * 3 * c["model"]["diffusers_config"]["rope_freq_dim"]
    if rope > head_dim:
        raise ConfigError("model.diffusers_config.rope_freq_dim", f"2*3*rope_freq_dim = {rope} exceeds attention_head_dim {head_dim}")
    r = c["recipe"]
    if r["fp8_static_margin"] <= 0:
        raise ConfigError(f"recipe.fp8_static_margin={r['fp8_static_margin']}", "must be > 0")
    if r["policy"] == "budget" and (r["budget"]["psnr_db_min"] is None or r["budget"]["ssim_min"] is None):
        raise ConfigError("recipe.budget", "a budget policy needs psnr_db_min and ssim_min")
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
        raise ConfigError(f"hardware.name={hw['name']}", f"disagrees with hardware.compute_capability={cc} (sm{cc.replace('.', '')}): "
                          "an smNN name is its compute capability (name a custom GPU otherwise)")
    if not re.fullmatch(r"\d+\.\d+", cc):
        raise ConfigError(f"hardware.compute_capability={cc}", "must be major.minor, e.g. 9.0")
    dev = c["hardware"]["device"]
    if dev.get("memory_gib") is not None:
        if dev["memory_gib"] <= 0:
            raise ConfigError(f"hardware.device.memory_gib={dev['memory_gib']}", "must be a positive number of GiB")
        dev["memory_gb"] = round(dev["memory_gib"] * 2**30 / 1e9, 3)
    for part in ("settings", "kernels_checked"):
        for lever, settings in (c["hardware"]["verified"].get(part) or {}).items():
            if lever not in LEVER_SETTINGS:
                raise ConfigError(f"hardware.verified.{part}.{lever}", "unknown lever; allowed: " + ", ".join(LEVER_SETTINGS))
            bad = [s for s in settings if s not in LEVER_SETTINGS[lever]]
            if bad:
                raise ConfigError(f"hardware.verified.{part}.{lever}", f"unknown setting {bad[0]!r}; allowed: " + ", ".join(LEVER_SETTINGS[lever]))
    if c["hardware"]["verified"].get("kernels_checked") and not c["hardware"]["verified"].get("kernels_checked_on"):
        raise ConfigError("hardware.verified.kernels_checked", "needs kernels_checked_on: the GPU the kernels were checked on")
    for backend in c["hardware"]["attention_rank"]["order"]:
        if backend not in BF16:
            raise ConfigError("hardware.attention_rank.order", f"unknown BF16 backend {backend!r}; allowed: {', '.join(BF16)}")
    for path, backend in missing_facts(c["hardware"]):
        raise ConfigError(path, f"missing: attention backend {backend} needs this capability fact (conf/hardware/*.yaml)")
    for dt in c["hardware"]["cudnn"]["fp8_output_dtypes"]:
        if dt not in ("fp8", "bf16", "fp16"):
            raise ConfigError("hardware.cudnn.fp8_output_dtypes", f"unknown dtype {dt!r}; allowed: fp8, bf16, fp16")
    out = {k: c[k] for k in PLAN_SECTIONS}
    out["sequence"], out["sequence_basis"] = c["sequence"], c["sequence_basis"]
    return out
