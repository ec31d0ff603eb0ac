"""Peak GPU memory per rank of one MiniMax-H3 request under a plan: weights, activations, VAE decode.

`estimate(sections, shape, settings)` counts, from the model dims, what is live at the two peaks of a
request and returns GiB per item with the basis of each; `fit(estimate, memory_gb, reserve_fraction)`
says whether it fits and, when not, which nearest change does (each one re-estimated).

- Weights: diffusers' dtypes (bf16 blocks; proj_in/out, audio heads and the timestep MLP float32:
  `_keep_in_fp32_modules`). gemm_quant fp8: the six block linears 1 byte + a float32 scale per output
  channel; nvfp4: 0.5 byte + an e4m3 scale per 16 weights + a float32 global scale. Quantised at install
  (the checkpoint is not in that format) the installer keeps the bf16 originals for uninstall: both count.
- adaln_table=on: the AdaLN linears (every block's adaln_proj and norm_out.linear, bf16) wait in pinned host
  memory; their table stays on every rank: rows (levers/adaln_table.table_plan: the request's timestep vectors)
  x their output features, bf16. `fit` offers levers.adaln_table=on first to a plan that has the lever off.
- Denoise step (no_grad, per rank, L = ceil(S/U) rows): the residual stream plus the larger of the
  attention phase and the FFN phase of one block forward, and the full-S tensors outside the stack
  (every rank embeds and gathers the whole sequence). Counted as diffusers' eager code keeps them alive
  (the basis lists each tensor); not yet calibrated on a GPU (tests/gpu/test_memory_gpu.py measures it).
- VAE decode (diffusers' decode step: no autocast, no_grad, the VAE in its dtype): weights (float32 as
  released; vae_precision fp16/bf16 casts all but diffusers' _keep_in_fp32_modules, the float32 originals
  on the host), activations and frames in the decode's dtype, vae_graphs' one CUDA-graph pool (shared by every tile
  shape, sized by one decoder call), and the decode's own peak: the decoded chunks and their final torch.cat, or the
  last clip's tiles being stitched; then diffusers' MiniMaxH3VideoDecodeStep postprocess (float32 copies). Calibrated on
  the H200 anchors (docs/sources.md#h200-anchors, benchmarks/results/vae-h200.md): within 10% for one decode, within 3%
  when the harness's previous output (alive during its timed decode) is added.
- Install (a pipeline loaded on the host, `h3plan.install(pipe, plan, device="cuda")`, install/placement.py): the
  resident weights as installed plus the largest tensor it stages at a time (one AdaLN linear streamed for its
  entries, a block linear streamed and quantised with its float32 temporaries, a VAE tensor streamed for its cast);
  a phase of the peak, so the fit check covers it. `loaded_gib`: the pipeline as loaded, on the device before
  install (what a pipeline moved to the GPU whole before install holds; the plan's install line says when it does
  not fit); under memory.partitions=both, both transformer partitions as loaded; with a text encoder the plan places,
  its weights too (pipe.to("cuda") moves every component, whatever placement install gives the conditioner after).
- The text encoder (model.text_encoder, a Qwen3-VL config sized by planning/text_encoder.py): placed by the
  text_encoder lever (levers/text_encoder.py; memory.text_encoder)
  (auto: resident where it fits beside the denoise peak, else offload_after where its encode fits beside the
  resident models, else host); resident weights join the denoise phase, and an `encode` phase holds the resident
  models + its weights (or one layer, host) + the encode's peak. Without a config: prompt_embeds given, nothing counted;
  memory.text_encoder naming a placement without one sizes model.text_encoder_default (the released widths).
- memory.partitions=both: the other transformer partition (transformer/ beside transformer_ref/) as installed.
Not counted: the CUDA context, cuBLAS/NCCL workspaces, allocator fragmentation (reserve_fraction covers
them), attention LSE buffers (B x H x S float32), the audio decode, the VAE encode of keyframes and references
(fl2va, ref2va) and the conditioning rows' latents. Torch-free.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Mapping

from h3plan.errors import ConfigError
from h3plan.levers import MEMORY_REGISTRY, MEMORY_SPECS, REGISTRY, SPECS, TERM_OWNERS, terms
from h3plan.facts.timesteps import request_steps, row_kinds

from . import text_encoder
from .derive import _throughput

from .request import VideoRequest, pipeline_defaults, request_from, tokens, vae_geometry
from .request import diffusers_kwargs as _dc
from h3plan.facts.vae.tiling import RELEASED_TILE, Geometry, decoded_frames, tile_span

_TABLES = REGISTRY[TERM_OWNERS["adaln_tables"]]  # adaln_table: its table plan, the rows it keeps

GiB = 2**30
TRANSFORMER_FP32 = ("proj_in", "audio_proj_in", "time_embedder", "proj_out", "audio_proj_out")  # _keep_in_fp32_modules
QUANT_BYTES = {"fp8": "1 byte + a float32 scale per output channel",
               "nvfp4": "0.5 byte + an e4m3 scale per 16 + a float32 global"}
OFFLOAD = ("none", "model")
# memory.holds
HELD = {"pipeline": ("transformer", "vae", "audio_vae"), "transformer": ("transformer",), "vae": ("vae",)}
HOLDS = tuple(HELD)
# what the plan keeps on the host, per item: the model whose install keeps it (counted where memory.holds holds it;
# the conditioner's only where the pipeline runs, which is where the estimate places it)
HOST_OWNER = {"parked_block_linears": "transformer", "parked_adaln_linears": "transformer", "vae_originals": "vae",
              "vae_encode_originals": "vae", "text_encoder": "conditioner"}
VAE_DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass
class MemoryConfig:
    """The optional `memory` section: how the pipeline holds its models (estimate's assumptions)."""

    offload: str = "none"
    """none: transformer, VAE and audio VAE all stay on the GPU (pipe.to('cuda')); model: one model on the
    GPU at a time (enable_model_cpu_offload: the transformer while denoising, the VAEs while decoding)."""
    vae_dtype: str = "fp32"
    """The VAEs' weight dtype: fp32 as released; bf16/fp16 keep diffusers' _keep_in_fp32_modules in fp32."""
    autocast_weight_cache: bool = False
    """VAE parameters require grad, so FP16 autocast caches float16 casts of the decoder linears during a
    decode (the eager anchor (docs/sources.md#h200-anchors)'s setup); false: requires_grad_(False), as h3plan's README
    does."""
    max_ulysses: int = 8
    """fit: the largest Ulysses degree it suggests (one NVLink node)."""
    reserve_fraction: float = 0.08
    """Share of the GPU's memory kept free for what the estimate does not count (CUDA context, cuBLAS/NCCL
    workspaces, allocator fragmentation)."""
    check: bool = True
    """Refuse a plan whose estimated peak does not fit (false: only report it)."""
    text_encoder: str = "auto"
    """Where the Qwen3-VL conditioner (model.text_encoder) sits: auto (the first that fits of resident, offload_after,
    host), none (prompt_embeds given), resident, offload_after (moved to the host after encoding), host (left in host
    memory, streamed a layer at a time). The text_encoder lever's setting (levers/text_encoder.py)."""
    partitions: str = "one"
    """one: the workflow's own transformer partition on the device (ModularPipeline.from_pretrained(repo,
    workflow=...) loads only it); both: transformer/ and transformer_ref/ held at once (one pipeline serving t2va /
    fl2va and ref2va), the other partition's weights counted as the planned one's (same widths)."""
    host_link_gbps: float = 50.0
    """Host <-> device copy rate for moving the conditioner (offload_after, host): assumed, PCIe 5.0 x16's 64 GB/s
    per direction at about 80%; never measured by h3plan (set the link's own)."""
    holds: str = "pipeline"
    """What the plan is installed into, and so what the device holds: pipeline (the transformer, the VAE and the audio
    VAE), transformer (a MiniMaxH3Transformer3DModel alone: no decode) or vae (an AutoencoderKLMiniMaxH3 alone: no
    denoise, no audio VAE). h3plan.plan_for sets it from what it is given."""


def transformer_params(dc: Mapping[str, Any]) -> dict[str, int]:
    """Parameter counts of MiniMaxH3Transformer3DModel by what their dtype follows."""
    h, heads, d, f = dc["hidden_size"], dc["num_attention_heads"], dc["attention_head_dim"], dc["ffn_dim"]
    inner, ted, n, r = heads * d, dc["time_embed_dim"], dc["num_layers"], dc["num_refiner_layers"]
    vpd = dc["in_channels"] * math.prod(dc["patch_size"])
    lin = 3 * h * inner + inner * h + h * 2 * f + f * h
    norms = 2 * h + 2 * d
    fp32 = ((vpd + 1) * h + (dc["audio_in_channels"] + 1) * h + dc["freq_dim"] * dc["time_embed_hidden_dim"]
            + dc["time_embed_hidden_dim"] + dc["time_embed_hidden_dim"] * ted + ted + (h + 1) * vpd
            + (h + 1) * dc["audio_in_channels"])
    rest = (n * (norms + (ted + 1) * 18 * h) + r * (lin + norms) + h
            + (dc["text_dim"] + 1) * h + h + (ted + 1) * 2 * h)
    return {"block_linears": n * lin, "block_linear_rows": n * (3 * inner + 2 * h + 2 * f), "bf16_other": rest,
            "fp32": fp32}


def vae_params(vae_dc: Mapping[str, Any]) -> dict[str, int]:
    """Parameter counts of AutoencoderKLMiniMaxH3: decoder block linears, the float32-kept part, the rest."""
    v = vae_dc
    c, lat, k3 = list(v["block_out_channels"]), v["latent_channels"], 27
    enc = v["in_channels"] * c[0] * k3 + c[0]
    ins = [c[0]] + c[:-1]
    for i, cout in enumerate(c):
        for j in range(v["layers_per_block"]):
            cin = ins[i] if j == 0 else cout
            enc += (2 * cin + cin * cout * k3 + cout + 2 * cout + cout * cout * k3 + cout
                    + (cin * cout + cout if cin != cout else 0))
        if v["temporal_downsample_factors"][i] * v["spatial_downsample_factors"][i] > 1:
            enc += cout * cout * k3 + cout
    enc += 2 * c[-1] + c[-1] * 2 * lat * k3 + 2 * lat
    quant = 2 * lat * 2 * lat + 2 * lat
    dim = v["decoder_num_attention_heads"] * v["decoder_attention_head_dim"]
    ffi = dim * v["decoder_ffn_mult"]
    n = v["decoder_num_layers"]
    linears = n * (4 * (dim * dim + dim) + dim * 2 * ffi + 2 * ffi + ffi * dim + dim)
    g = vae_geometry(v)
    pix = v["out_channels"] * g["temporal"] * g["spatial"] ** 2
    kept = enc + quant + n * 4 * dim + 2 * dim  # encoder, quant_conv, norm1/norm2/scale1/scale2, norm_out
    rest = lat * lat + lat + (lat + 1) * dim + v["decoder_num_register_tokens"] * dim + (dim + 1) * pix
    return {"decoder_linears": linears, "fp32_kept": kept, "encode_path": enc + quant, "other": rest, "dim": dim,
            "ffn_inner": ffi, "pixels_per_token": pix}


def vae_decode(vae_dc, latent_frames: int, latent_h: int, latent_w: int, tile: Mapping[str, Any], *, batch: int = 1,
               fused: bool = False, fp16_weights: bool = True, act: int = 2) -> dict[str, Any]:
    """Bytes of one `vae.decode` at these latents and tile geometry (pixels; frames: diffusers' temporal chunks
    of tokens_chunk_size + token_overlap latent frames, the only ones it has). act: bytes of the decode's
    activations and frames (2: float16 / bfloat16, 4: float32); fused: vae_ops's fused SwiGLU (no silu
    temporary); fp16_weights False: FP16 autocast casts ff.net.0.proj's weight per call (a float32 VAE under
    autocast)."""
    g, p = Geometry.from_config(vae_dc), vae_params(vae_dc)
    ratio, dim, ffi = g.spatial_ratio, p["dim"], p["ffn_inner"]
    H, W = latent_h * ratio, latent_w * ratio
    ov = tile.get("overlap") or 0
    ny, th = tile_span(H, tile.get("height") or H, ov)
    nx, tw = tile_span(W, tile.get("width") or W, ov)
    clip_lat = g.clip_latent_frames
    clip_px = clip_lat * g.temporal_ratio
    T = clip_lat * (th // ratio) * (tw // ratio) + vae_dc["decoder_num_register_tokens"] + 1
    # One decoder call, FFN moment of the heaviest block: fp32 residual, fp16 normed input, proj (2F),
    # silu(gate) (F, eager only), product (F); proj_out's output and its contiguous permute.
    per_token = 4 * dim + act * dim + act * 2 * ffi + (0 if fused else act * ffi) + act * ffi
    cast = 0 if fp16_weights else 2 * (dim * 2 * ffi + 2 * ffi)  # autocast's float16 cast of ff.net.0.proj
    call = batch * (T * per_token + 2 * T * p["pixels_per_token"] * act) + cast
    frames = decoded_frames(latent_frames, g)
    px = batch * 3 * H * W * act  # one frame of video in the decode's dtype
    out, clip_out, tiles = frames * px, clip_px * px, ny * nx * batch * 3 * clip_px * th * tw * 2
    final_cat, stitch = 2 * out + clip_out, out + tiles + 2 * clip_out + call
    return {"call": call, "tokens_per_call": T, "tiles": (ny, nx), "tile_px": (th, tw), "frames": frames,
            "clip_frames": clip_px,
            "output": out, "peak": max(final_cat, stitch), "peak_at": "final torch.cat" if final_cat >= stitch
            else "last clip's stitching",
            "postprocess": out + 2 * (out // act) * 4}


def _partitions(opts) -> int:
    return 2 if opts["partitions"] == "both" else 1  # transformer/ and transformer_ref/: the same widths


def _gib(b: float) -> float:
    return round(b / GiB, 3)


def _geometry(sections) -> tuple[dict, str]:
    video = sections.get("video")
    if video is not None:
        par = sections.get("parallel") or {}
        return tokens(request_from(video, par.get("batch") or 1), sections["model"], sections["vae"],
                      sections.get("pipeline")), f"video={video.get('name', 'custom')}"
    t = tokens(VideoRequest(text_tokens=1), sections["model"], sections["vae"], sections.get("pipeline"))
    return t, "no video section: the pipeline's default request (768x1344, 124 frames)"


def _options(sections) -> dict[str, Any]:
    m = {**MemoryConfig().__dict__, **(sections.get("memory") or {})}
    if m["offload"] not in OFFLOAD:
        raise ConfigError(f"memory.offload={m['offload']}", f"allowed: {', '.join(OFFLOAD)}")
    if m["holds"] not in HOLDS:
        raise ConfigError(f"memory.holds={m['holds']}", f"allowed: {', '.join(HOLDS)}")
    if m["vae_dtype"] not in VAE_DTYPES:
        raise ConfigError(f"memory.vae_dtype={m['vae_dtype']}", f"allowed: {', '.join(VAE_DTYPES)}")
    if m["partitions"] not in ("one", "both"):
        raise ConfigError(f"memory.partitions={m['partitions']}", "allowed: one, both")
    for name, spec in MEMORY_SPECS.items():  # memory.<lever>: auto or one of its settings
        if m[name] not in ("auto",) + tuple(spec.settings):
            raise ConfigError(f"memory.{name}={m[name]}", f"allowed: auto, {', '.join(spec.settings)}")
    return m


def _shape(shape: Mapping[str, Any]) -> tuple[int, int, int, int]:
    s, u, b = int(shape["seq_len"]), int(shape.get("ulysses_degree", 1)), int(shape.get("batch", 1))
    local = int(shape.get("local_rows") or -(-s // u))
    return s, u, b, local


class _Items:
    """GiB per item and its basis, in the order they were counted."""

    def __init__(self):
        self.gib: dict[str, float] = {}
        self.basis: dict[str, str] = {}
        self.host: dict[str, float] = {}  # what the plan keeps in the host's memory, per process
        self.host_basis: dict[str, str] = {}
        self.conditioner_bytes = 0  # the placed conditioner's weights: pipe.to("cuda") moves them with the rest

    def add(self, name: str, nbytes: float, why: str) -> None:
        self.gib[name], self.basis[name] = _gib(nbytes), why

    def add_host(self, name: str, nbytes: float, why: str) -> None:
        if nbytes > 0:
            self.host[name], self.host_basis[name] = _gib(nbytes), why


def _weights(it: _Items, sections, settings, opts) -> None:
    dc, vdc = _dc(sections["model"]), _dc(sections["vae"])
    pipe = sections.get("pipeline") or pipeline_defaults()
    tp = transformer_params(dc)
    gq = terms(settings).gemm_dtype or "bf16"
    checkpoint = (sections.get("recipe") or {}).get("checkpoint", gq)
    base = 2 * (tp["block_linears"] + tp["bf16_other"]) + 4 * tp["fp32"]
    tables = _adaln_plan(sections, dc, pipe) if terms(settings).adaln_tables else None
    base -= tables["weight_bytes"] if tables else 0
    quant = {"fp8": tp["block_linears"] + 4 * tp["block_linear_rows"],
             "nvfp4": tp["block_linears"] // 2 + tp["block_linears"] // 16 + 4 * 6 * dc["num_layers"]}.get(gq)
    if quant is not None and checkpoint == gq:
        it.add("transformer_weights", base - 2 * tp["block_linears"] + quant,
               f"{gq} checkpoint: {tp['block_linears']:,} block-linear weights at {QUANT_BYTES[gq]}; "
               f"{tp['bf16_other']:,} other bf16, {tp['fp32']:,} float32 ({', '.join(TRANSFORMER_FP32)})")
    elif quant is not None:
        it.add("transformer_weights", base - 2 * tp["block_linears"],
               f"{tp['bf16_other']:,} bf16 + {tp['fp32']:,} float32 parameters on the device; the "
               f"{tp['block_linears']:,} bf16 block-linear weights wait in pinned host memory until uninstall "
               f"(install/parking.py)")
        it.add("transformer_quant_copies", quant, f"gemm_quant={gq} quantised at install from the {checkpoint} "
                                                  f"checkpoint: {QUANT_BYTES[gq]} per block-linear weight")
        it.add_host("parked_block_linears", _partitions(opts) * 2 * tp["block_linears"],
                    f"the {tp['block_linears']:,} bf16 block-linear weights gemm_quant={gq} replaced, pinned until "
                    f"uninstall (install/parking.py)")
    else:
        it.add("transformer_weights", base, f"{tp['block_linears'] + tp['bf16_other']:,} bf16 + {tp['fp32']:,} float32 "
                                            f"parameters ({', '.join(TRANSFORMER_FP32)}: _keep_in_fp32_modules)")
    if tables:
        p = tables
        it.basis["transformer_weights"] += (f"; adaln_table: the {p['linears']} AdaLN linears' {p['parameters']:,} "
                                            f"bf16 parameters wait in pinned host memory (install/adaln_table.py)")
        it.add_host("parked_adaln_linears", _partitions(opts) * p["weight_bytes"],
                    f"adaln_table: the {p['linears']} AdaLN linears' {p['parameters']:,} bf16 parameters, pinned until "
                    "uninstall (install/adaln_table.py)")
        it.add("adaln_tables", p["table_bytes"], f"adaln_table: {p['rows']} rows ({p['vectors']} timestep vectors at "
                                                 f"num_inference_steps {', '.join(map(str, p['steps']))}) x "
                                                 f"{p['linears']} linears' outputs, bf16")
    vb, vp = VAE_DTYPES[opts["vae_dtype"]], vae_params(vdc)
    vd = decode_dtype(settings, opts)
    lb = VAE_DTYPES[vd]
    ed = terms(settings).vae_encode_cast  # vae_encode_precision: the encoder and quant_conv cast at install
    eb = VAE_DTYPES[ed] if ed else 4
    it.add("vae_weights", 4 * (vp["fp32_kept"] - vp["encode_path"]) + eb * vp["encode_path"]
           + lb * (vp["decoder_linears"] + vp["other"]),
           f"AutoencoderKLMiniMaxH3 {vp['decoder_linears'] + vp['fp32_kept'] + vp['other']:,} parameters, {vd}"
           + ("" if lb == 4 else " (encoder, quant_conv, norms and scales kept float32)")
           + (f"; vae_precision={vd}: cast at install, the float32 originals on the host (install/vae/weights.py)"
              if vd != opts["vae_dtype"] else "")
           + (f"; vae_encode_precision={ed}: the encoder and quant_conv's {vp['encode_path']:,} parameters {ed}, their "
              "float32 originals on the host" if ed else ""))
    if vd != opts["vae_dtype"]:
        it.add_host("vae_originals", VAE_DTYPES[opts["vae_dtype"]] * (vp["decoder_linears"] + vp["other"]),
                    f"vae_precision={vd}: the cast parameters' {opts['vae_dtype']} originals until uninstall "
                    "(install/vae/weights.py)")
    if ed:
        it.add_host("vae_encode_originals", 4 * vp["encode_path"],
                    f"vae_encode_precision={ed}: the encoder and quant_conv's float32 originals until uninstall")
    it.add("audio_vae_weights", vb * pipe["audio_vae"]["params"],
           f"AutoencoderKLMiniMaxH3Audio {pipe['audio_vae']['params']:,} parameters, {opts['vae_dtype']}")
    it.add("text_encoder", 0, "not resident: prompt_embeds given (Qwen3-VL runs before, or elsewhere)")  # _conditioner
    # install(pipe, plan, device="cuda") of a pipeline on the host: what it stages on the device, one at a time
    staged = []
    if tables:
        staged.append((2 * _TABLES.MODULATION_OUT * dc["hidden_size"] * (dc["time_embed_dim"] + 1),
                       "one AdaLN linear streamed for its table entries (bf16)", "transformer"))
    if quant is not None and checkpoint != gq:
        big = dc["hidden_size"] * 2 * dc["ffn_dim"]  # ff.net.0.proj, the largest block linear
        staged.append((10 * big, f"the largest block linear ({big:,} weights) streamed in bf16 and quantised: + its "
                                 f"two float32 temporaries (quantize_weight)", "transformer"))
    if vd != opts["vae_dtype"]:
        staged.append((4 * vp["dim"] * 2 * vp["ffn_inner"],
                       "the largest VAE tensor streamed in float32 for its cast", "vae"))
    staged = [(b, why) for b, why, comp in staged if comp in HELD[opts["holds"]]]
    most = max(staged, default=(0, "nothing staged: every tensor moves as it is"))
    it.add("install_staging", most[0], f"install from the host (device=): {most[1]}; the rest of what it moves is the "
                                       "resident weights, a tensor at a time")
    partitions = _partitions(opts)
    as_loaded = quant - 2 * tp["block_linears"] if quant is not None and checkpoint == gq else 0  # quantised as loaded
    loaded = {"transformer": partitions * (base + (tables["weight_bytes"] if tables else 0) + as_loaded),
              "vae": 4 * vp["fp32_kept"] + vb * (vp["decoder_linears"] + vp["other"]),
              "audio_vae": vb * pipe["audio_vae"]["params"]}
    return sum(loaded[k] for k in HELD[opts["holds"]])


def _adaln_plan(sections, dc, pipe) -> dict[str, Any]:
    """adaln_table=on: the AdaLN linears' weights leave the device (pinned host memory), their table stays: one row
    per value of the request's timestep vectors (facts/timesteps.py, its steps and kinds of row)."""
    request = None
    if sections.get("video") is not None:
        try:
            request = _geometry(sections)[0]
        except ConfigError:  # a VAE no request fits: the plain request's rows (audio as asked)
            request = {"audio_rows": int(bool(sections["video"].get("audio", True)))}
    return _TABLES.table_plan(dc, pipe, steps=[request_steps(request, pipe)], **row_kinds(request))


def _block_terms(dc, U: int, settings) -> tuple[list, list]:
    """(attention-phase, FFN-phase) live tensors of one block forward: (name, bytes per local row)."""
    h, f, inner = dc["hidden_size"], dc["ffn_dim"], dc["num_attention_heads"] * dc["attention_head_dim"]
    t = terms(settings)
    ob = t.attention_out_bytes
    att = [("residual", 2 * h), ("modulated norm1", 2 * h), ("q/k/v projections", 3 * 2 * inner)]
    if U == 1:
        att += [] if t.qk_fused else [("eager QK-norm/RoPE temporary", 2 * inner)]
        att += [("q/k/v e4m3 codes", 3 * inner)] if t.qkv_fp8 else []
        att += [("attention output", ob * inner)] + ([("output cast to bf16", 2 * inner)] if ob == 1 else [])
    else:
        w = 1 if t.qkv_fp8 else 2
        att += [("all-to-all send (U,3,B,L,H/U,D)", 3 * w * inner), ("all-to-all receive", 3 * w * inner),
                ("sequence-major q/k/v", 3 * w * inner), ("attention output (U*L rows, H/U heads)", ob * inner)]
    ffn = [("residual", 2 * h), ("modulated norm2", 2 * h), ("ff proj (2F)", 2 * 2 * f)]
    ffn += ([] if t.swiglu_fused else [("silu(gate) (F)", 2 * f)]) + [("swiglu product (F)", 2 * f)]
    return att, ffn


def _denoise(it: _Items, sections, shape, settings, geo, geo_src) -> None:
    dc = _dc(sections["model"])
    S, U, B, L = _shape(shape)
    h = dc["hidden_size"]
    vpd, a, rope = dc["in_channels"] * math.prod(dc["patch_size"]), dc["audio_in_channels"], 2 * 3 * dc["rope_freq_dim"]
    rows = geo or {"video_rows": S, "audio_rows": 0, "text_rows": 0}  # no request: every row counted as video
    step = (B * S * (3 * 8 + 4 * 8 + 2 * rope * 4 + (vpd + a) * 4)
            + B * (rows["video_rows"] * vpd + rows["audio_rows"] * a) * 8
            + B * rows["text_rows"] * dc["text_dim"] * 2)
    it.add("step_inputs", step, f"per row: position_ids fp64, 4 int64 index/tag rows, RoPE cos/sin ({rope} fp32 each), "
                                f"both heads' fp32 outputs; latents + velocity fp32 per video/audio row; prompt_embeds "
                                f"bf16 ({geo_src})")
    att, ffn = _block_terms(dc, U, settings)
    a_row, f_row = sum(b for _, b in att), sum(b for _, b in ffn)
    which, row, listed = ("attention phase", a_row, att) if a_row >= f_row else ("FFN phase", f_row, ffn)
    it.add("block_activations", B * L * row,
           f"one block forward, {which} at {B} x {L:,} rows per rank (U={U}): "
           + " + ".join(f"{n} {b:,}" for n, b in listed)
           + f" bytes per row (the other phase {min(a_row, f_row):,}; diffusers' eager liveness)")
    it.add("stack_boundary", 10 * B * S * h, f"full S={S:,} on every rank outside the block stack: fp32 input "
                                             f"projections + bf16 casts + the packed buffer and its index_copy, or the "
                                             f"gathered stream + norm_out + the fp32 cast for the heads: 10 bytes per "
                                             f"element of (B, S, {h})")


def decode_dtype(settings, opts) -> str:
    """The decode's dtype: the plan's vae_precision where it casts a float32 VAE, else the VAE as loaded."""
    p = terms(settings).vae_cast or "fp32"
    return p if p != "fp32" and opts["vae_dtype"] == "fp32" else opts["vae_dtype"]


def _decode(it: _Items, sections, settings, opts, geo, geo_src, B: int) -> None:
    vdc = _dc(sections["vae"])
    t = terms(settings)
    tile_name = t.vae_tile or "default_tile"
    tile = sections["vae"].get(tile_name) or RELEASED_TILE
    fused = t.vae_fused
    vd = decode_dtype(settings, opts)
    fp16_w = True  # diffusers' decode step runs no autocast: no per-call weight casts
    d = vae_decode(vdc, geo["latent_frames"], geo["latent_height"], geo["latent_width"], tile, batch=B, fused=fused,
                   fp16_weights=fp16_w, act=VAE_DTYPES[vd])
    th, tw = d["tile_px"]
    if t.vae_fp8_gemms:  # install/vae/install.py makes the codes from any float VAE
        vp = vae_params(vdc)
        it.add("vae_fp8_gemms", vp["decoder_linears"], f"vae_tiles=fp8_tiles: e4m3 copies of the "
                                                       f"{vdc['decoder_num_layers']} decoder blocks' six linears "
                                                       f"({vp['decoder_linears']:,} codes) beside the fp16 weights, "
                                                       f"made at install (install/vae/fp8.py)")
    if t.vae_graph_pool:
        it.add("vae_graph_pools", d["call"],
               f"vae_graphs: one CUDA-graph pool shared by every tile shape ({th}x{tw} px here), the size of one "
               "decoder call's activations; held between decodes")
    if opts["autocast_weight_cache"] and opts["vae_dtype"] == "fp32" and not fp16_w:
        it.add("vae_autocast_cache", 2 * vae_params(vdc)["decoder_linears"],
               "FP16 autocast caches float16 casts of the decoder "
               "linears of a requires-grad VAE during the decode")
    it.add("vae_decode", d["peak"], f"vae.decode of [{B}, {vdc['latent_channels']}, {geo['latent_frames']}, "
                                    f"{geo['latent_height']}, {geo['latent_width']}] -> {d['frames']} frames {vd}: "
                                    f"peak at the {d['peak_at']} (2 x output + one {d['clip_frames']}-frame clip, or "
                                    f"output + {d['tiles'][0]}x{d['tiles'][1]} tiles of {th}x{tw} px + 2 clips + one "
                                    f"decoder call of {d['tokens_per_call']:,} tokens); H200 anchors: within 10% for "
                                    f"one decode ({geo_src})")
    it.add("video_postprocess", d["postprocess"], f"MiniMaxH3VideoDecodeStep: (video.float() * std + mean).clamp(0, "
                                                  f"1): the {vd} video + two float32 temporaries")


def _conditioner(it: _Items, sections, opts, phases, resident: list[str], geo) -> dict[str, Any] | None:
    """The Qwen3-VL conditioner (model.text_encoder) placed by the text_encoder lever: its weights join the denoise
    phase when resident; an `encode` phase holds the models resident while it runs plus its weights (resident,
    offload_after) or one decoder layer (host) and its activation peak. Free memory: the GPU's usable bytes
    (hardware.device.memory_gb less memory.reserve_fraction) less each phase's other items. None: not planned."""
    model = sections.get("model") or {}
    config = model.get("text_encoder")
    if config is None and opts["text_encoder"] in ("auto", "none"):
        return None
    if config is None:  # a placement named, no checkpoint config: the released conditioner's packaged widths
        config = model.get("text_encoder_default")
    gb = ((sections.get("hardware") or {}).get("device") or {}).get("memory_gb")
    usable = gb * 1e9 * (1 - opts["reserve_fraction"]) if gb else float("inf")
    base = sum(it.gib[k] for k in resident) * GiB
    hw = sections.get("hardware") or {}
    tflops = _throughput(hw, "gemm", "bf16")[0] if hw.get("measured") else None
    gbps = opts["host_link_gbps"]
    rows = int(geo["text_rows"]) if geo else 0
    s = text_encoder.sizes(config, rows) if config is not None else None
    lever = MEMORY_REGISTRY["text_encoder"]
    room = lever.Room(s, free_denoise=usable - phases["denoise"]["gib"] * GiB, free_encode=usable - base,
                      gemm_tflops=tflops, host_gbps=gbps, requested=opts["text_encoder"])
    try:
        decision = lever.decide(room)
    except ValueError as e:
        raise ConfigError(f"memory.text_encoder={opts['text_encoder']}", str(e)) from None
    setting, reasons = decision.setting, decision.reasons
    if s is None or setting == "none":
        return lever.derived(decision)
    on_device = s["weight_bytes"] if setting != "host" else s["layer_bytes"]
    it.conditioner_bytes = s["weight_bytes"]
    it.add("text_encoder", s["weight_bytes"] if setting == "resident" else 0,
           f"Qwen3-VL {s['params']:,} parameters, bf16: {setting} ({reasons[0]})")
    it.add("text_encoder_encode", on_device + s["activation_bytes"],
           f"encoding {rows:,} rows: {'its weights' if setting != 'host' else 'one decoder layer'} + every hidden "
           f"state ({s['layers'] + 1} x rows x {s['hidden']}) + one layer's MLP, bf16")
    if setting != "resident":
        it.add_host("text_encoder", s["weight_bytes"],
                    f"Qwen3-VL's bf16 weights, pinned: {setting} keeps them on the host "
                    + ("after encoding" if setting == "offload_after" else "and streams a layer at a time")
                    + " (a conditioner loaded pageable is copied to pinned memory once: both for that copy)")
    if setting == "resident":
        phases["denoise"]["items"].append("text_encoder")
        phases["denoise"]["gib"] = round(phases["denoise"]["gib"] + it.gib["text_encoder"], 3)
    keys = resident + ["text_encoder_encode"]
    phases["encode"] = {"gib": round(sum(it.gib[k] for k in keys), 3), "items": keys}
    return lever.derived(decision)


def estimate(sections: Mapping[str, Any], shape: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """Peak GiB per GPU. sections: plain config sections (model, vae; optional recipe, hardware, video,
    pipeline, memory); shape: derive.shape's numbers (seq_len, ulysses_degree, batch[, local_rows]);
    settings: lever -> setting (or Decision). Returns peak_gib, peak_phase, phases, breakdown (GiB per
    item), basis (per item), summary and the inputs fit() re-estimates from."""
    opts = _options(sections)
    try:
        geo, geo_src = _geometry(sections)
    except ConfigError as e:  # a VAE no pipeline request fits (the tiny test VAE): the decode is not estimated
        geo, geo_src = None, f"the decode is not estimated: no video request fits this VAE ({e})"
    it = _Items()
    loaded = _weights(it, sections, settings, opts)
    _denoise(it, sections, shape, settings, geo, geo_src)
    if geo is not None:
        _decode(it, sections, settings, opts, geo, geo_src, _shape(shape)[2])
    else:
        it.add("vae_decode", 0, geo_src)
        it.add("video_postprocess", 0, geo_src)
    g = it.gib
    holds = opts["holds"]
    vae_res = ["vae_weights"] + (["audio_vae_weights"] if holds == "pipeline" else []) + [
        k for k in ("vae_fp8_gemms", "vae_graph_pools") if k in g]
    if opts["partitions"] == "both":  # the other partition as installed: the same widths, weights and tables
        mine = [k for k in ("transformer_weights", "transformer_quant_copies", "adaln_tables") if k in g]
        it.add("other_partition_weights", sum(g[k] for k in mine) * GiB,
               "memory.partitions=both: transformer/ and transformer_ref/ both held, the other one as this one "
               f"({' + '.join(mine)})")
    tr_res = (["transformer_weights"] + [k for k in ("transformer_quant_copies", "adaln_tables",
                                                     "other_partition_weights")
                                         if k in g])
    both = opts["offload"] == "none" and holds == "pipeline"
    # the stack's full-S inputs stay referenced while the blocks run (H200: the denoise peak less the resident
    # weights is block_activations + stack_boundary + step_inputs within 1%, benchmarks/results/memory-h200.md)
    denoise = tr_res + (vae_res if both else []) + ["step_inputs", "block_activations", "stack_boundary"]
    decode = (vae_res + (tr_res if both else []) + [k for k in ("vae_autocast_cache",) if k in g]
              + [max(("vae_decode", "video_postprocess"), key=g.get)])
    # install(pipe, plan, device="cuda") of a pipeline loaded on the host: the resident weights + one staged tensor
    install = (vae_res if holds == "vae" else tr_res) + (vae_res if both else []) + ["install_staging"]
    kept = {"pipeline": ("denoise", "decode"), "transformer": ("denoise",), "vae": ("decode",)}[holds]  # what it runs
    phases = {name: {"gib": round(sum(g[k] for k in keys), 3), "items": keys}
              for name, keys in (("denoise", denoise), ("decode", decode), ("install", install))
              if name in kept + ("install",)}
    # while encoding: the models resident beside it (offload=model: one model on the device at a time, none)
    te = _conditioner(it, sections, opts, phases, tr_res + vae_res if both else [],
                      geo) if holds == "pipeline" else None
    peak_phase = max(phases, key=lambda k: phases[k]["gib"])
    whole = _gib(loaded + it.conditioner_bytes)  # pipe.to("cuda") before install: the conditioner moves too
    host = {k: v for k, v in it.host.items() if HOST_OWNER.get(k, "transformer") in HELD[holds] + ("conditioner",)}
    return {
        "peak_gib": phases[peak_phase]["gib"], "peak_phase": peak_phase, "phases": phases,
        "breakdown": {k: v for k, v in g.items() if holds == "pipeline"
                      or any(k in p["items"] for p in phases.values())},
        "basis": it.basis,
        "install_gib": phases["install"]["gib"], "loaded_gib": whole, "text_encoder": te,
        "host_gib": round(sum(host.values()), 3), "host_items": host,
        "host_basis": {k: it.host_basis[k] for k in host},
        "summary": (f"peak = the largest phase ({peak_phase}; install: a pipeline loaded on the host, moved at "
                    f"install(pipe, plan, device=\"cuda\"); moved to the GPU whole before install, pipe.to(\"cuda\"), "
                    f"it holds {whole} GiB); "
                    f"offload={opts['offload']}: "
                    + (f"memory.holds={holds}: only the {holds} is counted" if holds != "pipeline" else
                       "every model stays resident in both phases" if both
                       else "the transformer while denoising, the VAEs while decoding")),
        "inputs": {"sections": copy.deepcopy(dict(sections)), "shape": dict(shape),
                   "settings": {k: str(getattr(v, "setting", v)) for k, v in settings.items()}},
    }


# ---- fit ---------------------------------------------------------------------------------------------


def _reshape(shape, seq_len=None, degree=None) -> dict[str, Any]:
    s = dict(shape)
    S, U = int(seq_len or s["seq_len"]), int(degree or s.get("ulysses_degree", 1))
    padded = -(-S // U) * U
    s.update(seq_len=S, ulysses_degree=U, padded_len=padded, local_rows=padded // U)
    return s


def _again(est, *, sections=None, shape=None, settings=None) -> dict[str, Any]:
    i = est["inputs"]
    return estimate(sections or i["sections"], shape or i["shape"], settings or i["settings"])


def _candidates(est, usable: float) -> list[tuple[str, dict]]:
    """(change, re-estimate) for each kind of change that fits, in order of least change: more Ulysses
    ranks (the fewest that fit), offload, smaller weights from a checkpoint, a shorter clip."""
    i = est["inputs"]
    sec, shp, st = i["sections"], i["shape"], i["settings"]
    opts, dc = _options(sec), _dc(sec["model"])
    out = []
    if opts["partitions"] == "both":  # the least change: hold only the workflow's own partition
        s = copy.deepcopy(sec)
        s["memory"] = {**(s.get("memory") or {}), "partitions": "one"}
        e = _again(est, sections=s)
        if e["peak_gib"] <= usable:
            out.append(("memory.partitions=one", e))
    # a plan that has the lever (adaln_table): its lossless setting is the least change
    for lever, spec in SPECS.items():
        if spec.fit and st.get(lever) not in (None, spec.fit):
            e = _again(est, settings={**st, lever: spec.fit})
            if e["peak_gib"] <= usable:
                return [(f"levers.{lever}={spec.fit}", e)]
    u = int(shp.get("ulysses_degree", 1))
    for d in (d for d in range(u + 1, opts["max_ulysses"] + 1) if dc["num_attention_heads"] % d == 0):
        e = _again(est, shape=_reshape(shp, degree=d))
        if e["peak_gib"] <= usable:
            out.append((f"parallel.ulysses={d}", e))
            break
    if opts["offload"] == "none":
        s = copy.deepcopy(sec)
        s["memory"] = {**(s.get("memory") or {}), "offload": "model"}
        out.append(("memory.offload=model", _again(est, sections=s)))
    gemm = (sec.get("hardware") or {}).get("gemm") or {"fp8": True, "nvfp4": False}
    gq, ck = terms(st).gemm_dtype or "bf16", (sec.get("recipe") or {}).get("checkpoint")
    gemm_lever = TERM_OWNERS["gemm_dtype"]  # gemm_quant: its setting of each format
    gemm_setting = {t.gemm_dtype: k for k, t in SPECS[gemm_lever].terms.items()}
    for fmt in ("nvfp4", "fp8") if gq in ("fp8", "nvfp4") else ("fp8",):
        if gemm.get(fmt) and not (gq == fmt and ck in (fmt, None)):
            s = copy.deepcopy(sec)
            s["recipe"] = {**(s.get("recipe") or {}), "checkpoint": fmt}
            out.append((f"recipe={fmt} ({fmt} checkpoint)", _again(est, sections=s,
                                                                   settings={**st, gemm_lever: gemm_setting[fmt]})))
            break
    out = [(w, e) for w, e in out if e["peak_gib"] <= usable]
    shorter = _shorter(est, usable)
    return out + ([shorter] if shorter is not None else [])


def _shorter(est, usable: float):
    """The longest shorter clip at the same canvas that fits, or the largest seq_len when S was explicit."""
    i = est["inputs"]
    sec, shp = i["sections"], i["shape"]
    video, par = sec.get("video"), sec.get("parallel") or {}
    if video is not None and par.get("seq_len") is None:
        pipe = sec.get("pipeline") or pipeline_defaults()
        clip = vae_geometry(sec["vae"])["clip_length"]
        frames = tokens(request_from(video), sec["model"], sec["vae"], pipe)["frames"]
        for fr in range(frames - clip, 0, -clip):
            if fr / pipe["fps"] < pipe["min_seconds"]:
                break
            s = copy.deepcopy(sec)
            s["video"] = {**video, "frames": fr, "seconds": None}
            S = tokens(request_from(s["video"]), sec["model"], sec["vae"], pipe)["seq_len"]
            e = _again(est, sections=s, shape=_reshape(shp, seq_len=S))
            if e["peak_gib"] <= usable:
                return f"video.frames={fr} ({fr / pipe['fps']:.2f} s, S={S:,})", e
        return None
    lo, hi, best = 1, int(shp["seq_len"]) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        e = _again(est, shape=_reshape(shp, seq_len=mid))
        if e["peak_gib"] <= usable:
            best, lo = (mid, e), mid + 1
        else:
            hi = mid - 1
    return None if best is None else (f"parallel.seq_len<={best[0]:,}", best[1])


def usable_gib(hardware_memory_gb: float, reserve_fraction: float) -> float:
    """What a plan may use per GPU: the device's memory (vendor GB, 1e9 bytes) in GiB, less reserve_fraction."""
    return hardware_memory_gb * 1e9 / GiB * (1 - reserve_fraction)


def fit(est: Mapping[str, Any], hardware_memory_gb: float, reserve_fraction: float) -> str | None:
    """None when the estimate fits hardware_memory_gb (vendor GB, 1e9 bytes) less reserve_fraction;
    otherwise one line: the peak against the usable size, its largest items, and the nearest change that
    fits (more Ulysses ranks that divide the heads, offload, smaller weights, a shorter clip), each
    re-estimated."""
    if not hardware_memory_gb or hardware_memory_gb <= 0:
        raise ConfigError(f"hardware.device.memory_gb={hardware_memory_gb}", "must be a positive number of GB")
    if not 0 <= reserve_fraction < 1:
        raise ConfigError(f"reserve_fraction={reserve_fraction}", "must be in [0, 1)")
    usable = usable_gib(hardware_memory_gb, reserve_fraction)
    if est["peak_gib"] <= usable:
        return None
    ph = est["phases"][est["peak_phase"]]
    top = sorted(ph["items"], key=lambda k: -est["breakdown"][k])[:3]
    largest = ", ".join(f"{k} {est['breakdown'][k]:.1f}" for k in top)
    doing = {"denoise": "denoising", "decode": "decoding", "install": "installing",
             "encode": "encoding"}[est["peak_phase"]]
    head = (f"peak {est['peak_gib']:.1f} GiB while {doing} ({largest}) > {usable:.1f} GiB usable "
            f"({hardware_memory_gb:g} GB x (1 - {reserve_fraction:g}))")
    fits = _candidates(est, usable)
    if not fits:
        return head + "; nothing tried fits (more Ulysses ranks, offload=model, smaller weights, a shorter clip)"
    (what, e), rest = fits[0], fits[1:]
    line = f"{head}; nearest fit: {what} ({e['peak_gib']:.1f} GiB)"
    if rest:
        line += "; also: " + ", ".join(f"{w} ({x['peak_gib']:.1f} GiB)" for w, x in rest)
    return line


__all__ = ["MemoryConfig", "estimate", "fit", "usable_gib", "transformer_params", "vae_params", "vae_decode"]
