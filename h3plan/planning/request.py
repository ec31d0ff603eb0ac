"""A video request -> the packed sequence MiniMax-H3's transformer sees (text + audio + video rows).

Scope: diffusers 0.42.1's three workflows (`video.task`): `t2va` (text only), `fl2va` (first and/or last keyframe)
and `ref2va` (references); the conditioning rows of the last two are planning/workflows.py's. Each step mirrors
diffusers' own arithmetic, named where it is used:

1. canvas: no height/width -> `resolve_canvas_size(16, 9, canvas_multiple, short_edge, max_pixels)`;
   given ones must be multiples of `MiniMaxH3ModularPipeline.canvas_multiple` = VAE spatial compression
   x transformer patch width (32 for the released checkpoint), as `MiniMaxH3PrepareLayoutStep` checks.
2. frames: `seconds` becomes round(seconds * fps) frames (the rounding diffusers' docs prescribe for a
   soundtrack's length); `align_num_frames` snaps up to `clip_length * n + tokens_chunk_size`
   (17n+5), and the aligned duration must lie in [min_duration, max_duration] (5-15 s at 24 fps).
3. latents: `video_latent_num_frames` = (frames - tokens_chunk_size) // clip_length *
   tokens_chunk_size + 2; that 2 is tokens_chunk_size - token_drop of the VAE's `_encode` (checked);
   latent height/width = pixels // spatial compression; `audio_latent_num_frames` =
   int(round(frames / fps * 40)).
4. rows (`MiniMaxH3PrepareLayoutStep.build_packed_sequence`): video = latent frames x (latent_h //
   patch_h) x (latent_w // patch_w); audio = audio latents x 2 channels; text = the prompt's tokens
   (`MiniMaxH3TextEncoderStep`: no template, no special tokens); S = text + audio + video. The
   transformer adds no register tokens and no padding (its docstring: "the packed sequence carries no
   padding"); the VAE decoder's 4 register tokens + 1 and `token_drop` only reach S through step 3.
5. conditioning (fl2va, ref2va; planning/workflows.py): keyframe rows, or reference blocks (video rows and clean
   audio rows), between the text and the target audio: S = text + condition video + condition audio + audio + video.

`audio=False` plans the transformer without audio rows (it takes an empty `audio_indices`); diffusers'
`t2va` pipeline itself always generates the stereo soundtrack. Steps: `num_inference_steps` (50 by
default) sigma points drive 49 transformer forwards (`MiniMaxH3Scheduler.set_timesteps`: the terminal
0 is one of the points); `video.num_inference_steps` sets the request's own (a step-distilled Turbo LoRA's 4 forwards:
5). Torch-free; bad requests raise ConfigError naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, List, Mapping, Optional, get_type_hints

from h3plan.errors import ConfigError
from h3plan.facts.pipeline import pipeline_defaults, schedule_facts
from h3plan.facts.ring_plan import world_size
from h3plan.facts.vae.tiling import Geometry
from h3plan.facts.workflows import DEFAULT_TASK, PARTITION

from . import workflows


@dataclass(frozen=True)
class VideoRequest:
    """One request of a workflow (None: the pipeline's default). Its fields less `batch` are the `video` config group's
    (VideoConfig, below)."""

    height: Optional[int] = None
    """Pixels, a multiple of the canvas multiple (32); None with width None: the pipeline's 16:9 canvas (768 x 1344)."""
    width: Optional[int] = None
    """Pixels, as height."""
    seconds: Optional[float] = None
    """Clip length; becomes round(seconds * fps) frames, then aligned. None: `frames` (or the default)."""
    frames: Optional[int] = None
    """Frames asked for; aligned up to clip_length * n + tokens_chunk_size (17n+5). Set with `seconds`, both must
    align alike. None with seconds None: the pipeline's default 124."""
    fps: Optional[float] = None
    """Must be the pipeline's fixed rate (24); anything else is refused. None: that rate."""
    audio: bool = True
    """False: no audio rows (transformer-only shape; diffusers' pipeline always generates the stereo soundtrack)."""
    text_tokens: Optional[int] = None
    """Rows of prompt_embeds: the prompt's Qwen tokens (no chat template, no special tokens); for fl2va / ref2va the
    conditioner's whole presentation (labels and vision blocks, then the prompt). Required when S comes from the
    request."""
    task: str = DEFAULT_TASK
    """The workflow: t2va (text only), fl2va (keyframes; `keyframes`), ref2va (references; `references`, planned
    against the `transformer_ref/` partition). planning/workflows.py gives their conditioning rows."""
    keyframes: Optional[List[str]] = None
    """fl2va: the keyframes' anchors in packed order, [first], [last] or [first,last] (diffusers' image /
    last_image)."""
    keyframe_size: Optional[List[int]] = None
    """fl2va without height/width: [height,width] of the first keyframe, whose aspect gives the canvas."""
    references: Optional[List[Any]] = None
    """ref2va: the references in request order, each {kind: image, height, width} (source pixels), {kind: video,
    frames, fps, height, width, audio_seconds (its soundtrack, null: none)} or {kind: audio, seconds}."""
    num_inference_steps: Optional[int] = None
    """diffusers' num_inference_steps of the call (forwards = steps - 1); None: the pipeline's default (50)."""
    batch: int = 1
    """Sequences per transformer call; every item shares the layout (diffusers' pipeline runs 1). Not a `video`
    field: parallel.batch holds it."""


FIELDS = tuple(f.name for f in fields(VideoRequest) if f.name != "batch")
"""The request's fields that the `video` group holds (`video.<field>=` overrides)."""

_HINTS = get_type_hints(VideoRequest)
VideoConfig = make_dataclass(
    "VideoConfig",
    [("name", str, field(default="custom"))]
    + [(f.name, _HINTS[f.name], field(default=f.default)) for f in fields(VideoRequest) if f.name in FIELDS]
    + [("source", Optional[str], field(default=None)),
       # the fields set over the preset by `video.<field>=` overrides (filled in by `video_overrides`; the plan
       # names them beside the preset)
       ("overrides", List[str], field(default_factory=list))],
    namespace={"__module__": __name__,
               "__doc__": "The `video` config group (Hydra structured node): VideoRequest's fields less batch "
                          "(parallel.batch holds it), the preset's name and source, and `overrides`."})

PAIRED = {"seconds": "frames", "frames": "seconds"}  # two ways to give the length: an override of one nulls the other


def video_overrides(overrides: list[str]) -> list[str]:
    """Hydra overrides with the request's own rules added: `video.seconds=` over a preset that gives
    `frames` nulls the preset's frames (and the other way round) unless both are set, and the fields set
    are recorded in `video.overrides` so the plan names them beside the preset."""
    import re

    seen: list[str] = []
    for o in overrides:
        m = re.match(r"(?:\+\+|\+|~)?video\.(\w+)(?:=|$)", o)
        if m and m.group(1) in FIELDS and m.group(1) not in seen:
            seen.append(m.group(1))
    if not seen:
        return list(overrides)
    out = list(overrides) + [f"video.{PAIRED[k]}=null" for k in seen if k in PAIRED and PAIRED[k] not in seen]
    return out + [f"video.overrides=[{','.join(seen)}]"]


def _value(v) -> str:
    """A value as a Hydra override writes it (lists and mappings included)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ",".join(f"{k}:{_value(x)}" for k, x in v.items()) + "}"
    return f"{v:g}" if isinstance(v, float) else str(v)


def request_label(video: Mapping[str, Any] | None) -> str:
    """`video=<preset>`, or `video=<preset> with video.seconds=10 ...` after overrides of its fields."""
    video = video or {}
    label = f"video={video.get('name', 'custom')}"
    fields = [k for k in video.get("overrides") or () if k in FIELDS]
    return label + (" with " + " ".join(f"video.{k}={_value(video.get(k))}" for k in fields) if fields else "")


@dataclass
class CanvasFacts:
    short_edge: int = 768
    max_pixels: int = 1032192
    aspect: List[int] = field(default_factory=lambda: [16, 9])
    min_aspect: float = 0.25
    max_aspect: float = 4.0


@dataclass
class ReferenceFacts:
    image_short_edge: int = 2048
    max_images: int = 9
    max_videos: int = 3
    max_audios: int = 3
    max_references: int = 12


@dataclass
class AudioFacts:
    latents_per_second: int = 40
    channels: int = 2


@dataclass
class AudioVaeFacts:
    params: int = 151321489
    sampling_rate: int = 32000
    hop_length: int = 800


def _packaged(key: str) -> Any:
    """A field defaulting to the packaged pipeline group's value (conf/pipeline/h3.yaml holds it)."""
    return field(default_factory=lambda: schedule_facts()[key])


@dataclass
class SchedulerFacts:
    video_shift: float = _packaged("video_shift")
    audio_shift: float = _packaged("audio_shift")


@dataclass
class PipelineConfig:
    """The `pipeline` config group: diffusers MiniMaxH3ModularPipeline facts (conf/pipeline/h3.yaml holds
    the values and their sources; these defaults only type the node)."""

    name: str = "h3"
    fps: float = 24
    min_seconds: float = 5.0
    max_seconds: float = 15.0
    default_num_frames: int = 124
    num_inference_steps: int = 50
    schedulers: SchedulerFacts = field(default_factory=SchedulerFacts)
    keyframe_noise_aug: float = _packaged("keyframe_noise_aug")
    canvas: CanvasFacts = field(default_factory=CanvasFacts)
    references: ReferenceFacts = field(default_factory=ReferenceFacts)
    audio: AudioFacts = field(default_factory=AudioFacts)
    audio_vae: AudioVaeFacts = field(default_factory=AudioVaeFacts)
    source: Optional[str] = None


MIN_STEPS = 2  # the smallest num_inference_steps diffusers' MiniMaxH3Scheduler.set_timesteps takes
STEPS_RULE = (f"must be >= {MIN_STEPS}: diffusers' MiniMaxH3Scheduler.set_timesteps needs {MIN_STEPS} sigma points at "
              f"least (n points, the terminal 0 included, drive n - 1 forwards)")


def diffusers_kwargs(section: Mapping[str, Any]) -> Mapping[str, Any]:
    """A config section (with `diffusers_config`) or the diffusers kwargs themselves."""
    return section["diffusers_config"] if "diffusers_config" in section else section


def vae_geometry(vae_cfg: Mapping[str, Any]) -> dict[str, int]:
    """AutoencoderKLMiniMaxH3.__init__'s derived chunking (h3plan/facts/vae/tiling.py): compression ratios,
    tokens_chunk_size, overlaps."""
    g = Geometry.from_config(diffusers_kwargs(vae_cfg))
    return {"spatial": g.spatial_ratio, "temporal": g.temporal_ratio, "clip_length": g.clip_length,
            "token_drop": g.token_drop, "tokens_chunk_size": g.tokens_chunk_size, "token_overlap": g.token_overlap,
            "frame_pre_padding": g.frame_pre_padding}


def align_frames(frames: int, clip_length: int, chunk: int) -> int:
    """diffusers `align_num_frames`: the next count of the form clip_length * n + chunk."""
    return frames + (chunk - frames) % clip_length


def _positive(key: str, value, kind=int) -> None:
    """None passes (the default applies); otherwise a positive int (kind int) or finite number."""
    if value is None:
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or value <= 0 or (kind is int and not float(value).is_integer()):
        raise ConfigError(f"{key}={value}", f"must be a positive {'integer' if kind is int else 'number'}")


def _canvas(req: VideoRequest, multiple: int, pipe: Mapping[str, Any]) -> tuple[int, int, str]:
    if (req.height is None) != (req.width is None):
        missing = "video.width" if req.width is None else "video.height"
        raise ConfigError(missing, "height and width go together (both set, or both null for the default canvas)")
    if req.height is None:
        c = pipe["canvas"]
        if req.task == "fl2va":  # MiniMaxH3ResizeStep: the first keyframe's aspect, not 16:9
            return workflows.keyframe_canvas(req.keyframe_size, multiple, c)
        height, width = workflows.resolve_canvas(c["aspect"][0], c["aspect"][1], multiple, c)
        return height, width, (f"pipeline default canvas: resolve_canvas_size({c['aspect'][0]}, {c['aspect'][1]}, "
                               f"{multiple}, {c['short_edge']}, {c['max_pixels']})")
    for key, v in (("video.height", req.height), ("video.width", req.width)):
        _positive(key, v)
        if v % multiple:
            lo, hi = v // multiple * multiple, (v // multiple + 1) * multiple
            near = hi if lo == 0 or hi - v < v - lo else lo
            raise ConfigError(f"{key}={v}", f"must be a multiple of {multiple} (VAE spatial compression x patch width; "
                                            f"MiniMaxH3PrepareLayoutStep refuses it); nearest: "
                                            + (f"{lo} or {hi}" if lo else f"{hi}"), fix={key: str(near)})
    return req.height, req.width, f"requested, a multiple of {multiple}"


def _frames(req: VideoRequest, fps: float, g: Mapping[str, int], pipe: Mapping[str, Any]) -> tuple[int, int, str]:
    """(requested frames, aligned frames, key that set them)."""
    clip, chunk = g["clip_length"], g["tokens_chunk_size"]
    _positive("video.seconds", req.seconds, float)
    _positive("video.frames", req.frames)
    from_seconds = None if req.seconds is None else int(round(req.seconds * fps))
    if from_seconds is not None and from_seconds < 1:
        raise ConfigError(f"video.seconds={req.seconds}", f"is under one frame at {fps:g} fps")
    if from_seconds is not None and req.frames is not None:
        a, b = align_frames(from_seconds, clip, chunk), align_frames(int(req.frames), clip, chunk)
        if a != b:
            raise ConfigError(f"video.frames={req.frames}", f"disagrees with video.seconds={req.seconds} "
                                                            f"({from_seconds} frames at "
                                                           f"{fps:g} fps): they align to {b} and {a} frames; set one "
                                                           f"of them (the other null)")
    if req.frames is not None:
        asked, key = int(req.frames), "video.frames"
    elif from_seconds is not None:
        asked, key = from_seconds, "video.seconds"
    else:
        asked, key = int(pipe["default_num_frames"]), "pipeline.default_num_frames"
    aligned = align_frames(asked, clip, chunk)
    lo, hi = pipe["min_seconds"], pipe["max_seconds"]
    if not lo <= aligned / fps <= hi:
        value = req.frames if key == "video.frames" else req.seconds
        first, last = align_frames(math.ceil(lo * fps), clip, chunk), _aligned_max(hi * fps, clip, chunk)
        near = first if aligned / fps < lo else last  # the nearest length the pipeline generates
        fix = {key: str(near) if key == "video.frames"
               else f"{near / fps:g}"} if key != "pipeline.default_num_frames" else None
        raise ConfigError(f"{key}={value}", f"aligns to {aligned} frames = {aligned / fps:.3f} s at {fps:g} fps; the "
                                            f"pipeline generates {lo:g}-{hi:g} s, i.e. {clip}n+{chunk} frames from "
                                            f"{first} to {last}", fix=fix)
    return asked, aligned, key


def _aligned_max(max_frames: float, clip: int, chunk: int) -> int:
    n = (int(max_frames) - chunk) // clip
    return clip * n + chunk


def tokens(request: VideoRequest, model_cfg: Mapping[str, Any], vae_cfg: Mapping[str, Any],
           pipeline_cfg: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The packed sequence of one request: rows per modality, S, the geometry behind them, and a basis
    string per key under "basis". model_cfg / vae_cfg: the `model` / `vae` sections or their
    `diffusers_config`; pipeline_cfg: the `pipeline` section (None: conf/pipeline/h3.yaml)."""
    pipe = pipeline_cfg or pipeline_defaults()
    m, g = diffusers_kwargs(model_cfg), vae_geometry(vae_cfg)
    pt, ph, pw = m["patch_size"]
    if pt != 1:
        raise ConfigError(f"model.diffusers_config.patch_size={list(m['patch_size'])}",
                          "build_packed_sequence counts latent frames, not temporal patches: diffusers' layout needs "
                          "patch t = 1")
    tail = g["tokens_chunk_size"] - g["token_drop"]
    if tail != 2:
        raise ConfigError("vae.diffusers_config.token_drop",
                          f"diffusers' video_latent_num_frames adds 2 latent frames, but this VAE's "
                                                            f"_encode leaves tokens_chunk_size - token_drop = {tail}")
    fps = pipe["fps"] if request.fps is None else request.fps
    _positive("video.fps", request.fps, float)
    if fps != pipe["fps"]:
        raise ConfigError(f"video.fps={request.fps}", f"MiniMax-H3 generates at {pipe['fps']:g} fps only "
                                                      f"(MINIMAX_H3_FPS; no fps input)")
    if request.text_tokens is None:
        raise ConfigError("video.text_tokens", "required: the prompt's length in tokens (rows of prompt_embeds)")
    _positive("video.text_tokens", request.text_tokens)
    _positive("video.batch", request.batch)
    _positive("video.num_inference_steps", request.num_inference_steps)
    workflows.check_task(request.task, request.keyframes, request.keyframe_size, request.references)

    multiple = g["spatial"] * pw
    height, width, canvas = _canvas(request, multiple, pipe)
    asked, frames, frames_key = _frames(request, fps, g, pipe)
    clip, chunk = g["clip_length"], g["tokens_chunk_size"]
    latent_frames = (frames - chunk) // clip * chunk + tail
    lh, lw = height // g["spatial"], width // g["spatial"]
    rows_per_frame = (lh // ph) * (lw // pw)
    audio_latents = int(round(frames / fps * pipe["audio"]["latents_per_second"])) if request.audio else 0
    channels = pipe["audio"]["channels"]
    text, audio, video = int(request.text_tokens), audio_latents * channels, latent_frames * rows_per_frame
    steps = int(request.num_inference_steps or pipe["num_inference_steps"])
    if steps < MIN_STEPS:  # the key the value came from: the request's own or the pipeline's default
        key = "video.num_inference_steps" if request.num_inference_steps else "pipeline.num_inference_steps"
        raise ConfigError(f"{key}={steps}", STEPS_RULE, fix={key: str(MIN_STEPS)})
    steps_src = "video.num_inference_steps" if request.num_inference_steps else "num_inference_steps default"
    cond = _conditioning(request, frames, fps, g, m["patch_size"], rows_per_frame, pipe)
    cv, ca = cond["condition_video_rows"], cond["condition_audio_rows"]
    out = {
        "height": height, "width": width, "frames_requested": asked, "frames": frames, "seconds": frames / fps,
        "fps": fps, "latent_frames": latent_frames, "latent_height": lh, "latent_width": lw,
        "rows_per_frame": rows_per_frame,
        "audio_latents": audio_latents, "text_rows": text, "audio_rows": audio, "video_rows": video,
        "seq_len": text + cv + ca + audio + video, "batch": int(request.batch),
        "num_inference_steps": steps, "transformer_forwards": steps - 1,
        "basis": {
            "height": canvas, "width": canvas,
            "frames": f"{frames_key}: {asked} frames aligned up to {clip}n+{chunk} (align_num_frames), "
                      f"{frames / fps:.3f} s within {pipe['min_seconds']:g}-{pipe['max_seconds']:g} s",
            "latent_frames": f"video_latent_num_frames: ({frames} - {chunk}) // {clip} * {chunk} + {tail}",
            "rows_per_frame": f"(latent {lh} // patch {ph}) x (latent {lw} // patch {pw}); latent = pixels // "
                              f"{g['spatial']}",
            "text_rows": "prompt tokens, no template or special tokens (MiniMaxH3TextEncoderStep)",
            "audio_rows": (f"audio_latent_num_frames: round({frames} / {fps:g} * "
                           f"{pipe['audio']['latents_per_second']}) = {audio_latents} latents x {channels} channels"
                           if request.audio else "audio off: no audio rows (transformer-only shape)"),
            "video_rows": f"{latent_frames} latent frames x {rows_per_frame} rows (build_packed_sequence)",
            "seq_len": "text + audio + video rows: one packed sequence, no padding, no register tokens",
            "transformer_forwards": f"MiniMaxH3Scheduler.set_timesteps({steps}): {steps} sigma points, the terminal 0 "
                                    f"included, drive {steps - 1} forwards ({steps_src} {steps}"
                                    + (": INPUT_PARAM_TEMPLATES)" if not request.num_inference_steps else ")"),
        },
    }
    if request.task != DEFAULT_TASK:  # t2va's breakdown keeps its keys: a plan file without a task reads the same
        out.update({"task": request.task, "partition": PARTITION[request.task], "condition_video_rows": cv,
                    "condition_audio_rows": ca, **({"keyframes": list(request.keyframes)} if request.keyframes else {}),
                    **({"references": cond["blocks"]} if cond["blocks"] else {})})
        out["basis"].update(cond["basis"])
        out["basis"]["seq_len"] = ("text + condition video + condition audio + audio + video rows: one packed "
                                   "sequence, no padding, no register tokens")
    return out


def _conditioning(request: VideoRequest, frames: int, fps: float, g: Mapping[str, int], patch, rows_per_frame: int,
                  pipe: Mapping[str, Any]) -> dict[str, Any]:
    """fl2va keyframe rows or ref2va reference blocks (planning/workflows.py), with their basis."""
    if request.task == "fl2va":
        n = len(request.keyframes)
        return {"condition_video_rows": n * rows_per_frame, "condition_audio_rows": 0, "blocks": [],
                "basis": {"condition_video_rows": f"{n} keyframe(s) ({', '.join(request.keyframes)}) x "
                                                  f"{rows_per_frame} rows: one latent frame on the target canvas each "
                                                  f"(build_packed_sequence keyframe_anchors)"}}
    if request.task == "ref2va":
        r = workflows.references(request.references, frames=frames, fps=fps, spatial=g["spatial"], patch=patch,
                                 clip=g["clip_length"], chunk=g["tokens_chunk_size"], pipe=pipe)
        blocks = "; ".join(workflows.describe(b) for b in r["blocks"])
        return {**r, "basis": {"condition_video_rows": f"reference blocks in request order "
                                                       f"(build_ref2va_packed_sequence): {blocks}",
                               "condition_audio_rows": "reference soundtracks and audio references, clean (t = 1.0): "
                                                       f"ceil(samples / {pipe['audio_vae']['hop_length']}) latents x "
                                                       f"{pipe['audio']['channels']} channels"}}
    return {"condition_video_rows": 0, "condition_audio_rows": 0, "blocks": [], "basis": {}}


def request_from(video: Mapping[str, Any], batch: int = 1) -> VideoRequest:
    """The `video` section (plain dict) as a VideoRequest."""
    kw = {k: video.get(k) for k in FIELDS if k != "audio"}
    kw["task"] = kw.get("task") or DEFAULT_TASK  # a plan file written before the workflows has no task
    for k in ("keyframes", "keyframe_size", "references"):
        kw[k] = None if kw[k] is None else (tuple(kw[k]) if isinstance(kw[k], (list, tuple)) else kw[k])
    if video.get("audio") is not None:
        kw["audio"] = bool(video["audio"])
    return VideoRequest(**kw, batch=batch)


def one_pipeline(sections: Mapping[str, Any]) -> bool:
    """The VAE's latents are the transformer's input: the two make the pipeline the request describes (a tiny model
    beside the released VAE plans transformer-only shapes, whose rows the request does not bound)."""
    model, vae = diffusers_kwargs(sections["model"]), diffusers_kwargs(sections["vae"])
    return model.get("in_channels") == vae.get("latent_channels")


def sequence(sections: Mapping[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(seq_len, breakdown, basis) for the planner. An explicit parallel.seq_len wins (the breakdown says
    so and shows what the video request would give); otherwise S comes from `video`. Sections are
    plain dicts: video (optional), model, vae, parallel, pipeline (optional: conf/pipeline/h3.yaml)."""
    par, video = sections.get("parallel") or {}, sections.get("video")
    explicit = par.get("seq_len")
    derived = refused = None
    if video is not None:
        try:
            derived = tokens(request_from(video, par.get("batch") or 1), sections["model"], sections["vae"],
                             sections.get("pipeline"))
        except ConfigError as e:
            if explicit is None:
                raise
            # an explicit length needs no request: a model or VAE the request arithmetic does not fit is fine
            refused = str(e)
    name = request_label(video)
    if explicit is not None:
        _positive("parallel.seq_len", explicit)
        breakdown = {"source": "parallel.seq_len", "seq_len": int(explicit)}
        why = f"parallel.seq_len={explicit} set explicitly: it wins over the video request"
        if refused:
            breakdown["video_request_refused"] = refused
            why += f" (which does not apply: {refused})"
        world = world_size(par)  # fewer rows than ranks: validate's line says so
        if derived is not None and one_pipeline(sections) and world <= explicit < derived["text_rows"]:
            raise ConfigError(f"parallel.seq_len={explicit}",
                              f"fewer rows than the {derived['text_rows']} text rows of the "
                              f"request ({name}: video.text_tokens={derived['text_rows']}); no call packs that; set a "
                              "smaller video.text_tokens with it")
        if derived is not None:
            breakdown["video_request_seq_len"] = derived["seq_len"]
            why += f" ({name} would give {derived['seq_len']:,})"
        return int(explicit), breakdown, {"seq_len": why}
    if derived is None:
        raise ConfigError("parallel.seq_len", "not set, and no video request to derive it from (set video=<preset> or "
                                              "parallel.seq_len)")
    basis = dict(derived["basis"])
    breakdown = {k: v for k, v in derived.items() if k != "basis"}
    breakdown["source"] = name
    basis["seq_len"] = (f"{name}: {derived['text_rows']:,} text + {derived['audio_rows']:,} audio + "
                        f"{derived['video_rows']:,} video rows; " + basis["seq_len"])
    return derived["seq_len"], breakdown, basis


__all__ = ["VideoRequest", "VideoConfig", "PipelineConfig", "tokens", "sequence", "request_from", "vae_geometry",
           "video_overrides", "request_label",
           "align_frames", "pipeline_defaults", "diffusers_kwargs"]
