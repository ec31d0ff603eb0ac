"""diffusers' MiniMaxH3ModularPipeline assembled from local components with seeded random weights (no download).

Scope: the requests without the text encoder, the form a user with precomputed embeddings runs, and, with
`workflow_blocks(text_encoder=True)` and a conditioner config, the requests with a prompt string through diffusers'
own text encoder step (the seeded Qwen3-VL, tokenizer and processor of text_encoder_build.py). `workflow_blocks()`
with `partitions=("transformer", "transformer_ref")` gives all three workflows (t2va, fl2va, ref2va: diffusers'
auto blocks less the text encoder step; `workflow_inputs` the seeded keyframes and references). By default the
`t2va` request:
diffusers' own `MiniMaxH3CoreDenoiseStep` (layout, noise, two schedules, the denoise loop, unpack) and
`MiniMaxH3DecodeStep` (sub-blocks `video` and `audio`), as `SequentialPipelineBlocks.from_blocks_dict(...)
.init_pipeline()` builds them, the components handed in with `update_components` (diffusers' documented
way to use components it did not load itself). `pipe(**inputs, output_type=...)` runs the whole request;
`run_block(pipe, "denoise" | "decode" | "decode.video" | "decode.audio", ...)` one stage of it. Latents:
`run_block(pipe, "denoise", ...).get("latents")` (diffusers' decode step takes output_type pil / np / pt
only and says to run without the decode blocks for latents); frames: output_type="pt". Audio off
means not running `decode.audio`: the soundtrack is still denoised (its rows are part of the packed
sequence), and the audio VAE stays a component because the layout reads its latent width.

Components:
- transformer: h3plan.actions.inputs.build_model (seeded, released mixed precision: bf16 except
  `_keep_in_fp32_modules`); `layers` cuts the stack (None: all of the config's layers).
- vae: `AutoencoderKLMiniMaxH3.from_config` seeded; the residual scales and register tokens, zeros in
  diffusers' init (the decoder blocks would change nothing), drawn from N(0, 0.1), as benchmarks/vae.py
  does. fp32 by default, as the released checkpoint; another `vae_dtype` is cast the way
  `from_pretrained(torch_dtype=...)` casts it (`_keep_in_fp32_modules` stay fp32).
- audio_vae: `AutoencoderKLMiniMaxH3Audio`, diffusers' defaults (the release) for the `h3` VAE config,
  AUDIO_VAE_CONFIGS["h3_tiny_pipe"] for the tiny one; fp32 (diffusers keeps the whole BigVGAN stack in fp32).
- scheduler / audio_scheduler: `MiniMaxH3Scheduler`s at the packaged `pipeline` group's video and audio shifts
  (the pipeline's documented ones; facts/pipeline.py).

Text conditioning: `prompt_inputs` gives seeded N(0, 1) `prompt_embeds` of shape (1, text_tokens,
text_dim) in the transformer's dtype and `text_token_tags` (all text), what the text encoder step would
hand the denoise step; `prompt_text(n)` a prompt string of n text rows for the text encoder step. `Request` is one
request (height x width x frames); `sequence_length` is the packed length it makes, from diffusers' own frame and canvas
arithmetic.

Needs diffusers' transformers extra (MiniMaxH3ModularPipeline imports transformers); without it a
one-line UsageError names the install command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from h3plan.errors import UsageError
from h3plan.facts.pipeline import schedule_facts
from h3plan.facts.workflows import PARTITION, PARTITIONS, TASKS

from .text_encoder_build import conditioner_components

AUDIO_VAE_CONFIGS: dict[str, dict] = {
    "h3": {},  # diffusers' AutoencoderKLMiniMaxH3Audio defaults are the released audio VAE
    # latent_channels = h3_tiny's audio_in_channels; decoder_dim 128 halves to 1 channel over 7 upsamplers;
    # the rates keep the release's 800-sample hop (40 latents/s at 32 kHz, which the pipeline assumes)
    "h3_tiny_pipe": dict(encoder_dim=8, encoder_rates=(2, 4, 4, 5, 5), latent_dim=32, latent_channels=8,
                    num_attention_heads=2, decoder_dim=128, decoder_rates=(5, 5, 2, 2, 2, 2, 2),
                    decoder_kernel_sizes=(9, 9, 4, 4, 4, 4, 4), resblock_kernel_sizes=(3,),
                    resblock_dilation_sizes=((1,),)),
}
VAE_SCALE_STD = 0.1


@dataclass(frozen=True)
class Request:
    """One generation request: pixels and frames (MiniMax-H3 rounds frames up to 17n + 5)."""

    height: int
    width: int
    num_frames: int

    @classmethod
    def parse(cls, spec: str) -> "Request":
        m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*x\s*(\d+)\s*", str(spec))
        if not m:
            raise UsageError(f"video={spec!r}: expected HEIGHTxWIDTHxFRAMES, e.g. video=768x1344x124")
        return cls(*(int(g) for g in m.groups()))

    @property
    def label(self) -> str:
        return f"{self.height}x{self.width}x{self.num_frames}"


def _tuples(cfg: Mapping[str, Any]) -> dict:
    return {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
            for k, v in cfg.items()}


def require_transformers() -> None:
    from diffusers.utils import is_transformers_available

    if not is_transformers_available():
        raise UsageError("diffusers' MiniMaxH3ModularPipeline needs the 'transformers' package: "
                         "pip install transformers (or pip install -e '.[runtime]')")


def cast_like_from_pretrained(model, dtype):
    """Floating parameters and buffers to `dtype`, except `_keep_in_fp32_modules` (what from_pretrained does)."""
    import torch

    from h3plan.install.vae.weights import castable

    with torch.no_grad():
        for _, t in castable(model):
            t.data = t.data.to(dtype)
    return model


def build_vae(vae_config: Mapping[str, Any], *, device="cpu", dtype=None, seed: int = 1):
    import torch
    from diffusers import AutoencoderKLMiniMaxH3

    from h3plan.planning.checkpoint import plain

    cfg = _tuples(plain(vae_config))
    c = int(cfg.get("latent_channels", 24))
    cfg.setdefault("latents_mean", (0.0,) * c)  # diffusers' defaults (0, 1) at this VAE's latent width
    cfg.setdefault("latents_std", (1.0,) * c)
    torch.manual_seed(seed)
    with torch.device(device):
        vae = AutoencoderKLMiniMaxH3.from_config(cfg)
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if "scale" in name or "register_tokens" in name:
                p.normal_(0.0, VAE_SCALE_STD)
    if dtype is not None and dtype != torch.float32:
        cast_like_from_pretrained(vae, dtype)
    return vae.eval().requires_grad_(False)


def build_audio_vae(name: str, *, device="cpu", seed: int = 2):
    import torch
    from diffusers import AutoencoderKLMiniMaxH3Audio

    if name not in AUDIO_VAE_CONFIGS:
        raise UsageError(f"no audio VAE config for vae={name!r}; known: {', '.join(AUDIO_VAE_CONFIGS)}")
    cfg = dict(AUDIO_VAE_CONFIGS[name])
    c = int(cfg.get("latent_channels", 32))
    # the released config carries measured statistics; diffusers' default is None, which its decode step cannot use
    cfg.setdefault("latents_mean", [0.0] * c)
    cfg.setdefault("latents_std", [1.0] * c)
    torch.manual_seed(seed)
    with torch.device(device):
        audio_vae = AutoencoderKLMiniMaxH3Audio.from_config(cfg)
    return audio_vae.eval().requires_grad_(False)


def pipeline_blocks():
    """diffusers' t2va denoise step and its decode step (video + audio), as one SequentialPipelineBlocks."""
    from diffusers.modular_pipelines import SequentialPipelineBlocks
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import (MiniMaxH3CoreDenoiseStep,
                                                                                 MiniMaxH3DecodeStep)

    return SequentialPipelineBlocks.from_blocks_dict({"denoise": MiniMaxH3CoreDenoiseStep(),
                                                      "decode": MiniMaxH3DecodeStep()})


PARTITION_SEEDS = dict(zip(PARTITIONS, (0, 3)))  # added to `seed` (vae +1, audio_vae +2)


def workflow_blocks(text_encoder: bool = False):
    """diffusers' MiniMaxH3Blocks less its text encoder step (prompt_embeds given): before_encode, vae_encoder,
    denoise and decode, each the auto block that picks t2va / fl2va / ref2va from the inputs (`image` /
    `last_image`: fl2va; `references`: ref2va), as diffusers' own pipeline does. text_encoder=True: with its text
    encoder step too (`MiniMaxH3AutoTextEncoderStep`, after before_encode, as in MiniMaxH3Blocks): the call takes
    `prompt`, a string."""
    from diffusers.modular_pipelines import SequentialPipelineBlocks
    from diffusers.modular_pipelines.minimax_h3 import modular_blocks_minimax_h3 as b

    steps = {"before_encode": b.MiniMaxH3AutoBeforeEncodeStep()}
    if text_encoder:
        steps["text_encoder"] = b.MiniMaxH3AutoTextEncoderStep()
    steps.update({"vae_encoder": b.MiniMaxH3AutoVaeEncoderStep(), "denoise": b.MiniMaxH3AutoDenoiseStep(),
                  "decode": b.MiniMaxH3DecodeStep()})
    return SequentialPipelineBlocks.from_blocks_dict(steps)


def workflow_inputs(pipe, workflow: str, height: int, width: int, *, seed: int = 0, keyframes=("first",),
                    audio_reference: bool = False) -> dict:
    """Seeded media a `workflow` request passes beside the prompt: fl2va the keyframes (`image` first, `last_image`
    last; PIL RGB at height x width), ref2va one image reference at height x width (the setup step resizes it to
    the pipeline's reference_image_short_edge) and, with audio_reference, a 5 s stereo soundtrack at the audio VAE's
    rate; t2va nothing."""
    import numpy as np
    from PIL import Image

    if workflow not in TASKS:
        raise UsageError(f"workflow={workflow!r}: expected one of {', '.join(TASKS)}")
    rng = np.random.default_rng(seed)

    def image():
        return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))

    if workflow == "fl2va":
        if not keyframes or set(keyframes) - {"first", "last"}:
            raise UsageError(f"keyframes={keyframes}: first and/or last")
        return {k: image() for k, name in (("image", "first"), ("last_image", "last")) if name in keyframes}
    if workflow == "ref2va":
        import torch
        from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3AudioReference, MiniMaxH3ImageReference

        refs = [MiniMaxH3ImageReference(image())]
        if audio_reference:
            sr = pipe.audio_sampling_rate
            audio = torch.from_numpy(rng.uniform(-0.5, 0.5, (pipe.audio_channels, 5 * sr)).astype(np.float32))
            refs.append(MiniMaxH3AudioReference(audio, sample_rate=sr))
        return {"references": refs}
    return {}


def build_pipeline(model_config: Mapping[str, Any], vae_config: Mapping[str, Any], *, vae_name: str = "h3",
                   layers: int | None = None, device="cpu", dtype="bf16", vae_dtype=None, seed: int = 0,
                   blocks=None, partitions=("transformer",), text_encoder: Mapping[str, Any] | None = None,
                   text_encoder_device=None, text_encoder_placement: str | None = None,
                   text_encoder_weight_sets: int | None = None):
    """A MiniMaxH3ModularPipeline on `device`; see the module docstring. blocks: other pipeline blocks to use
    (workflow_blocks(): all three workflows); partitions: the transformer components to build ("transformer",
    "transformer_ref"), each seeded on its own (PARTITION_SEEDS); text_encoder: a conditioner config (model.
    text_encoder or text_encoder_default) for blocks with the text encoder step (workflow_blocks(text_encoder=True)):
    the seeded Qwen3-VL, tokenizer and processor (text_encoder_build.py), built on `text_encoder_device` (None:
    `device`; install/text_encoder.py places it as a plan says). text_encoder_placement: place it so (resident,
    offload_after, host; `placed(pipe.text_encoder)` undoes it); off the device, it is built and placed before the
    transformers, whose float32 staging needs the room (at the real widths the conditioner is 62 GiB and the
    staging of one transformer 123 GiB). text_encoder_weight_sets: its decoder layers share that many layers'
    weights (text_encoder_build.share_decoder_weights)."""
    require_transformers()
    import torch
    from diffusers import MiniMaxH3Scheduler

    from h3plan.install.text_encoder import place as place_text_encoder

    from .inputs import build_model

    pipe = (blocks if blocks is not None else pipeline_blocks()).init_pipeline()
    unknown = [p for p in partitions if p not in PARTITION_SEEDS]
    if unknown or not partitions:
        raise UsageError(f"partitions={list(partitions)}: one or both of {', '.join(PARTITION_SEEDS)}")
    wants_te = "text_encoder" in pipe._component_specs
    if wants_te and text_encoder is None:
        raise UsageError("these pipeline blocks run the text encoder step: give a conditioner config "
                         "(model.text_encoder_default)")
    te_device = device if text_encoder_device is None else text_encoder_device
    conditioner = {}
    if wants_te and text_encoder_placement not in (None, "resident"):  # built first, placed off the device
        conditioner = conditioner_components(text_encoder, seed=seed + 4, device=te_device,
                                             weight_sets=text_encoder_weight_sets)
        place_text_encoder(conditioner["text_encoder"], text_encoder_placement, device)
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()  # its 62 GiB of freed blocks, cut to its shapes, would not serve the staging
    vae = build_vae(vae_config, device=device, dtype=vae_dtype, seed=seed + 1)
    shifts = schedule_facts()
    components = dict(vae=vae, scheduler=MiniMaxH3Scheduler(shift=shifts["video_shift"]),
                      audio_scheduler=MiniMaxH3Scheduler(shift=shifts["audio_shift"]))
    narrow = _narrow_before_conditioner(wants_te and not conditioner, te_device, device)
    for name in partitions:
        components[name] = build_model(model_config, blocks=layers, device=device, dtype=dtype,
                                       seed=seed + PARTITION_SEEDS[name], narrow=narrow)
    if "audio_vae" in pipe._component_specs:
        components["audio_vae"] = build_audio_vae(vae_name, device=device, seed=seed + 2)
    if wants_te and not conditioner:
        conditioner = conditioner_components(text_encoder, seed=seed + 4, device=te_device,
                                             weight_sets=text_encoder_weight_sets)
        if text_encoder_placement is not None:
            place_text_encoder(conditioner["text_encoder"], text_encoder_placement, device)
    components.update(conditioner)
    pipe.update_components(**{k: v for k, v in components.items() if k in pipe._component_specs})
    quiet(pipe)
    mismatch = _shape_mismatch(pipe) or _conditioner_mismatch(pipe)
    if mismatch:
        raise UsageError(f"model and VAE configs do not fit one pipeline: {mismatch}")
    return pipe


def _narrow_before_conditioner(conditioner_follows: bool, te_device, device) -> bool | None:
    """True where the conditioner is built on the same CUDA device after the transformer: build_model's float32 build
    would fit the free memory then, but its staging leaves the allocator's reserve cut to float32 shapes (12 GiB on
    the H200 at real width), and the 62 GiB conditioner after it ran out of memory there; the narrow build holds the
    same values and leaves no such reserve. None (build_model decides by the free memory) otherwise."""
    import torch

    on_cuda = torch.device(device).type == "cuda" and torch.device(te_device).type == "cuda"
    return True if conditioner_follows and on_cuda else None


def _shape_mismatch(pipe) -> str | None:
    t = denoiser(pipe).config
    if pipe.vae.config.latent_channels != t.in_channels:
        return f"vae latent_channels {pipe.vae.config.latent_channels} != transformer in_channels {t.in_channels}"
    audio_vae = getattr(pipe, "audio_vae", None)
    if audio_vae is not None and audio_vae.config.latent_channels != t.audio_in_channels:
        return (f"audio_vae latent_channels {audio_vae.config.latent_channels} != transformer audio_in_channels "
                f"{t.audio_in_channels}")
    return None


def _conditioner_mismatch(pipe) -> str | None:
    te = getattr(pipe, "text_encoder", None) if "text_encoder" in pipe._component_specs else None
    if te is None:
        return None
    c, t = te.config.text_config, denoiser(pipe).config
    if c.hidden_size != t.text_dim:
        return f"text_encoder hidden_size {c.hidden_size} != transformer text_dim {t.text_dim}"
    if c.num_hidden_layers <= pipe.text_encoder_layer:
        return (f"text_encoder has {c.num_hidden_layers} decoder layers; diffusers keeps hidden_states"
                f"[{pipe.text_encoder_layer}], which needs more")
    return None


def prompt_text(rows: int) -> str:
    """A fixed ASCII prompt of exactly `rows` characters: `rows` text rows through the byte-level tokenizer
    (text_encoder_build.build_tokenizer), as many as prompt_inputs' stand-ins."""
    if rows < 1:
        raise UsageError(f"text_tokens={rows}: need at least one text row")
    base = "A red fox runs across a snowy field at dawn, its breath steaming in the cold air. "
    return (base * (rows // len(base) + 1))[:rows]


def denoiser(pipe, workflow: str | None = None):
    """The transformer partition `workflow` runs against (None: whichever the pipeline holds, `transformer` first)."""
    names = (PARTITION[workflow],) if workflow else PARTITIONS
    for n in names:
        if getattr(pipe, n, None) is not None:
            return getattr(pipe, n)
    raise UsageError(f"the pipeline holds no {' or '.join(names)} component" + (f" for {workflow}" if workflow else ""))


def run_block(pipe, name: str, **inputs):
    """Run `pipe`'s sub-block `name` ("denoise", "decode", or a dotted path such as "decode.video") on
    `inputs` with `pipe` as its components, the way
    ModularPipeline.__call__ runs its blocks (inputs not given take the block's defaults); returns the
    PipelineState. The whole pipeline is passed as components because diffusers' layout arithmetic reads the
    VAEs' geometry from it even in the denoise step."""
    import torch
    from diffusers.modular_pipelines import PipelineState

    block = pipe._blocks  # the blocks it runs (`pipe.blocks` is a deep copy)
    for part in name.split("."):
        block = block.sub_blocks[part]
    state = PipelineState()
    for p in block.inputs:
        if p.name is not None and p.name in inputs:
            state.set(p.name, inputs.pop(p.name), p.kwargs_type)
        elif p.kwargs_type is not None and p.kwargs_type in inputs:
            for k, v in inputs.pop(p.kwargs_type).items():
                state.set(k, v, p.kwargs_type)
        elif p.name is not None and p.name not in state.values:
            state.set(p.name, p.default, p.kwargs_type)
    if inputs:
        raise ValueError(f"{name} takes no input(s) {sorted(inputs)}")
    with torch.no_grad():
        _, state = block(pipe, state)
    return state


def quiet(pipe) -> None:
    """No diffusers progress bars (the denoise loop sits two levels down, where set_progress_bar_config
    of the pipeline does not reach)."""
    stack = list(pipe._blocks.sub_blocks.values())
    while stack:
        b = stack.pop()
        if hasattr(b, "set_progress_bar_config"):
            b.set_progress_bar_config(disable=True)
        stack.extend(getattr(b, "sub_blocks", {}).values())


def prompt_inputs(pipe, text_tokens: int, *, seed: int = 0) -> dict:
    """Seeded stand-ins for the text encoder's outputs: prompt_embeds (1, n, text_dim) and text_token_tags (n,)."""
    import torch

    if text_tokens < 1:
        raise UsageError(f"text_tokens={text_tokens}: need at least one text row")
    t = denoiser(pipe)
    g = torch.Generator("cpu").manual_seed(seed)
    dtype = next(p.dtype for n, p in t.named_parameters() if "transformer_blocks" in n)
    embeds = torch.randn(1, text_tokens, t.config.text_dim, generator=g).to(pipe._execution_device, dtype)
    return {"prompt_embeds": embeds, "text_token_tags": torch.full((text_tokens,), pipe.text_tag, dtype=torch.long)}


def default_request(pipe) -> Request:
    """The request the pipeline makes without height/width/num_frames: its own 16:9 canvas
    (canvas_short_edge / canvas_max_pixels configs) and the layout step's default frame count."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import resolve_canvas_size

    h, w = resolve_canvas_size(16, 9, pipe.canvas_multiple, pipe.config.canvas_short_edge,
                               pipe.config.canvas_max_pixels)
    frames = next(p.default for p in pipe._blocks.sub_blocks["denoise"].inputs if p.name == "num_frames")
    if frames is None:  # the auto denoise step (workflow_blocks): its t2va branch's layout default
        frames = next(p.default for p in pipe._blocks.sub_blocks["denoise"].sub_blocks["t2va"].inputs
                      if p.name == "num_frames")
    return Request(int(h), int(w), int(frames))


def resolved(pipe, request: Request) -> tuple[int, int, int]:
    """(num_frames, latent_frames, audio_latents) as diffusers' layout step resolves the request."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (align_num_frames, audio_latent_num_frames,
                                                                         video_latent_num_frames)

    frames = align_num_frames(request.num_frames, pipe.vae_frames_per_chunk, pipe.vae_latents_per_chunk)
    return (frames, video_latent_num_frames(frames, pipe.vae_frames_per_chunk, pipe.vae_latents_per_chunk),
            audio_latent_num_frames(frames, pipe.fps))


def sequence_length(pipe, request: Request, text_tokens: int) -> int:
    """Packed rows of a t2va request: text + stereo audio rows + video patches (diffusers' layout)."""
    m = pipe.canvas_multiple
    if request.height % m or request.width % m:
        raise UsageError(f"video={request.label}: height and width must be multiples of {m} for this pipeline")
    _, latent_frames, audio_latents = resolved(pipe, request)
    _, ph, pw = pipe.patch_size
    r = pipe.vae_spatial_compression_ratio
    per_frame = (request.height // r // ph) * (request.width // r // pw)
    return text_tokens + audio_latents * pipe.audio_channels + latent_frames * per_frame


def default_steps(pipe) -> tuple[int, int]:
    """(num_inference_steps default, transformer forwards it gives): the pipeline's input default (diffusers'
    INPUT_PARAM_TEMPLATES, 50) through MiniMaxH3Scheduler, whose grid counts the terminal sigma (50 -> 49)."""
    from diffusers import MiniMaxH3Scheduler

    n = next(p.default for p in pipe.blocks.inputs if p.name == "num_inference_steps")
    shift = pipe.scheduler.config.shift if pipe.scheduler is not None else schedule_facts()["video_shift"]
    s = MiniMaxH3Scheduler(shift=shift)
    s.set_timesteps(int(n))
    return int(n), int(s.timesteps.numel())
