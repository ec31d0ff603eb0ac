"""The hardware config group's typed node: HardwareConfig and the facts it holds (conf/hardware/*.yaml).

Hydra merges each GPU's YAML onto `HardwareConfig`, so an unknown key or a wrongly typed fact fails during
composition; the cross-group rules on these facts are `schema.validate`'s. `AttentionPoint` has one TFLOP/s field
per registered attention backend (h3plan.facts.attention's registry, torch-free); the sections a lever owns (its
capability facts, its evidence under `measured`) are typed in its module and declared in `Spec.hardware`, and
`HardwareConfig` and `MeasuredFacts` take them from the lever registry. The same YAML read as plain dicts by
code that runs on a device is h3plan/facts/hardware.py. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from h3plan.facts.attention import BACKENDS, BF16
from h3plan.facts.provenance import Provenance
from h3plan.levers import SPECS


def _lever_sections(scope: str) -> list[tuple[str, Any, Any]]:
    """The hardware sections the levers declare (Spec.hardware) under `scope` ("" top level, "measured") as
    make_dataclass fields, a List defaulting to empty, a dataclass to its defaults; sorted by key, so the schema's
    key order (the `allowed:` list of an unknown key's error) does not follow the registry's decision order."""
    out = []
    for spec in SPECS.values():
        for path, kind in spec.hardware.items():
            where, _, key = path.rpartition(".")
            if where == scope:
                empty = list if getattr(kind, "__origin__", None) is list else kind
                out.append((key, kind, field(default_factory=empty)))
    return sorted(out, key=lambda f: f[0])


@dataclass
class DeviceFacts:
    sm_count: Optional[int] = MISSING
    memory_gb: Optional[float] = MISSING
    memory_gib: Optional[float] = None
    """The device's memory in GiB (2^30 bytes), as torch.cuda reports it; set, it replaces memory_gb (which
    validate() then holds in vendor GB), e.g. hardware.device.memory_gib=80 for an 80 GiB card. A command line gives
    one of the two (config.check_overrides)."""
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
    head_dim_limit: int = MISSING
    """The largest head_dim FA4's forward takes here (a multiple of 8, at least 8), checked per call."""
    head_dim_limit_source: str = MISSING
    block_sparse: Optional[List[int]] = None
    """[query block, key block] rows of FA4's block-sparse forward at head_dim 128 with its default tile (the
    sparse_attention router's block); null: no block-sparse forward here."""
    block_sparse_source: Optional[str] = None
    block_sparse_router: List[Dict[str, Any]] = field(default_factory=list)
    """The sparse_attention router's time per call, measured: {gflop (its pooled scores' FLOPs), ms, provenance};
    the estimate interpolates in GFLOP between the points (empty: not counted)."""
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
class AttentionRank:
    order: List[str] = MISSING
    """BF16 attention backends, fastest first."""
    measured: bool = MISSING
    source: str = MISSING
    fp8_source: str = MISSING
    """Why (or on what evidence) cuDNN FP8 is the FP8 attention on this hardware."""


AttentionPoint = make_dataclass(  # one TFLOP/s field per attention backend (h3plan.facts.attention), BF16 ones first
    "AttentionPoint", [("seq_len", int, field(default=MISSING)), ("heads", int, field(default=MISSING))]
    + [(name, Optional[float], field(default=None)) for name in sorted(BACKENDS, key=lambda n: n not in BF16)]
    + [("context", str, field(default="kernel")), ("provenance", List[Provenance], field(default_factory=list))],
    namespace={"__doc__": "Measured attention TFLOP/s (4*S^2*H*D / time) at one per-rank shape; null = not measured. "
                          "context: kernel (the kernel alone) or forward (inside the installed forward: a plan's rate "
                          "takes these first at its head count, planning/derive.attention_rate).",
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
class StockFramesPoint:
    attention: str = MISSING
    """A lossless plan's attention backend (levers.attention), put in diffusers' eager pipeline in place of its
    default."""
    shape: str = MISSING
    """The request, height x width x frames (768x1344x124)."""
    psnr_db: float = MISSING
    """Those decoded frames against stock diffusers' (its default attention, torch SDPA)."""
    source: str = MISSING
    provenance: List[Provenance] = field(default_factory=list)


@dataclass
class GemmPoint:
    """The block linears' GEMMs (to_q/k/v, to_out, the FFN) of `layers` blocks at `rows` rows per GPU in `dtype`:
    their kernels' summed time `ms` (rate: 2*rows*params*layers / ms)."""

    rows: int = MISSING
    dtype: str = MISSING
    layers: int = 1
    ms: float = MISSING
    source: str = MISSING
    provenance: List[Provenance] = field(default_factory=list)


@dataclass
class ElementwisePoint:
    """Every kernel of `layers` transformer blocks that is neither a GEMM nor attention (the fused norms, modulation,
    RoPE, residuals, SwiGLU, FP8/NVFP4 casts) at `rows` rows per GPU with `recipe`'s default levers: their times,
    summed (one entry per kernel category of the profile)."""

    recipe: str = MISSING
    rows: int = MISSING
    layers: int = 1
    ms: List[float] = MISSING
    source: str = MISSING
    provenance: List[Provenance] = field(default_factory=list)


@dataclass
class DecodePoint:
    """The rest of diffusers' pipe(...) call after the last forward (the video decode, nearly all of it, and the
    audio decode) at a decode precision and tile geometry (vae_precision, vae_tiles), at `latent`."""

    precision: str = MISSING
    tiles: str = "default"
    latent: List[int] = MISSING
    seconds: float = MISSING
    source: str = MISSING
    provenance: List[Provenance] = field(default_factory=list)


@dataclass
class EncodePoint:
    """One AutoencoderKLMiniMaxH3.encode (fl2va keyframes, ref2va references) at an encode precision
    (vae_encode_precision) and tile geometry, of an input of `input` = [frames, height, width] pixels. A source
    that starts "estimate, not measured" is an estimate (the time line says so)."""

    precision: str = MISSING
    tiles: str = "default"
    """the geometry the encode ran at, named as vae_tiles names them: default is the VAE's own
    (vae_encode_tiles=default); another is vae_tiles' geometry shared with the decode (vae_encode_tiles=decode)."""
    input: List[int] = MISSING
    seconds: float = MISSING
    source: str = MISSING
    provenance: List[Provenance] = field(default_factory=list)


@dataclass
class _MeasuredCommon:
    on_hardware: bool = MISSING
    hbm_copy_tbps: Optional[float] = None
    gemm_tflops: GemmThroughput = field(default_factory=GemmThroughput)
    gemm_block: List[GemmPoint] = field(default_factory=list)
    """The block linears' GEMM rate at the plan's rows (nearest in log rows wins over gemm_tflops)."""
    elementwise: List[ElementwisePoint] = field(default_factory=list)
    """The block's elementwise kernels per recipe (empty: bytes at hbm_copy_tbps, a floor, and the plan says so)."""
    decode: List[DecodePoint] = field(default_factory=list)
    """The call's decode time per precision and tiles (empty: the plan predicts no decode time)."""
    encode: List[EncodePoint] = field(default_factory=list)
    """The video VAE encode's time per encode precision (empty: an fl2va / ref2va plan predicts no encode time)."""
    attention: List[AttentionPoint] = field(default_factory=list)
    block: List[BlockPoint] = field(default_factory=list)
    vae_decode: VaeDecodeFacts = field(default_factory=VaeDecodeFacts)
    modulation_eager_x_hbm_floor: List[float] = field(default_factory=list)
    """Eager RMSNorm + indexed modulation time over the HBM floor (min, max); compiled below."""
    modulation_compile_x_hbm_floor: Optional[float] = None
    ulysses: UlyssesMeasured = field(default_factory=UlyssesMeasured)
    """Multi-GPU measurements by Ulysses degree (empty: estimates from NVLink bandwidth, borrowed rules)."""


_LeverEvidence = make_dataclass("_LeverEvidence", _lever_sections("measured"), bases=(_MeasuredCommon,),
                                namespace={"__module__": __name__})


@dataclass
class MeasuredFacts(_LeverEvidence):
    """What was measured on this hardware: the common facts, each lever's evidence (Spec.hardware's
    `measured.<key>`, by key), then these."""

    stock_frames: List[StockFramesPoint] = field(default_factory=list)
    """A lossless plan keeps the bits of diffusers' eager forward with the plan's attention backend; another backend
    than diffusers' default rounds its own way: how far those frames are from stock diffusers' (empty: never
    measured)."""
    never_measured: List[str] = field(default_factory=list)
    source: str = MISSING


@dataclass
class Efficiency:
    """Assumed fraction of the dense peak reached, for estimates on hardware never measured here: one ratio per
    precision (a precision without its own ratio has no estimate; the source says where each ratio comes from)."""

    attention: Optional[float] = None
    """BF16 attention."""
    attention_fp8: Optional[float] = None
    gemm: Optional[float] = None
    """BF16 GEMMs."""
    gemm_fp8: Optional[float] = None
    gemm_nvfp4: Optional[float] = None
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
class TunedCheck:
    """One lever setting's kernel check on the tuned device (action=verify's check: bitwise against the reference,
    or inside the recipe's budget)."""

    lever: str = MISSING
    setting: str = MISSING
    passed: bool = MISSING
    detail: str = ""
    """What the check found (the failure's reason where it failed)."""


@dataclass
class TunedFacts:
    """Provenance of a tuned hardware file (python -m h3plan action=tune): where and with what it was measured.
    `versions` (torch, triton, fa4, cudnn: package versions; driver: the kernel module) are compared with the running
    ones (h3plan/facts/tuned.py): another version marks the file stale, and strict=true refuses it."""

    device: str = MISSING
    """torch.cuda.get_device_name() on the tuned GPU."""
    compute_capability: str = MISSING
    memory_gib: float = MISSING
    date: str = MISSING
    """UTC date and time the tune finished (YYYY-MM-DD HH:MM)."""
    command: str = MISSING
    """The command that made the file."""
    versions: Dict[str, Optional[str]] = field(default_factory=dict)
    runtime: Dict[str, Optional[str]] = field(default_factory=dict)
    """What torch reported at tune time (CUDA runtime, cuDNN library, Triton): informational, not compared."""
    quick: bool = False
    """tune.quick: fewer shapes and repeats."""
    seconds: Optional[float] = None
    """How long the tune took."""
    checks: List[TunedCheck] = field(default_factory=list)
    source: str = "python -m h3plan action=tune"


@dataclass
class _HardwareCommon:
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


_LeverFacts = make_dataclass("_LeverFacts", _lever_sections(""), bases=(_HardwareCommon,),
                             namespace={"__module__": __name__})


@dataclass
class HardwareConfig(_LeverFacts):
    """One GPU's facts: its own sections, the levers' capability sections (Spec.hardware's top-level keys, by key),
    then these."""

    attention_rank: AttentionRank = field(default_factory=AttentionRank)
    measured: MeasuredFacts = field(default_factory=MeasuredFacts)
    efficiency: Efficiency = field(default_factory=Efficiency)
    tuning: TuningFacts = field(default_factory=TuningFacts)
    verified: VerifiedFacts = field(default_factory=VerifiedFacts)
    option: Optional[str] = None
    """The hardware option the config was composed from (hardware=myhw), set at composition: a file of your own that
    extends a packaged one keeps its `name` (sm90), and the plan names both; a `name` the file sets itself stands only
    where it carries measured, verified or tuned facts of its own (planning/direct.py inherited_name)."""
    tuned: Optional[TunedFacts] = None
    """Set in a file written by action=tune: its provenance and kernel checks; null in the packaged groups."""
