"""The conditioning rows of diffusers' three MiniMax-H3 workflows: what `fl2va` and `ref2va` add to the packed sequence.

Scope: diffusers 0.42.1 `modular_pipelines/minimax_h3/` (paths below are under it). Torch-free; a request the pipeline
refuses raises ConfigError naming the key, with the value that works where there is one.

- `t2va`: `[text | target audio | target video]` (`MiniMaxH3PrepareLayoutStep.build_packed_sequence`, no anchors),
  against the `transformer/` partition.
- `fl2va`: the same step with `keyframe_anchors` ("first" and/or "last", `MiniMaxH3ResizeStep`: `image` then
  `last_image`): one latent frame of condition rows per keyframe, `[text | keyframe rows | target audio | target
  video]`. A keyframe is put on the target canvas and encoded by the spatial encoder alone
  (`MiniMaxH3KeyframeVaeEncoderStep`), so its rows are one frame of the target: (latent_h // patch) x
  (latent_w // patch).
  Without height/width the canvas is `resolve_canvas_size(<first keyframe's aspect>, ...)` (`MiniMaxH3ResizeStep`).
- `ref2va` (`MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence`, against `transformer_ref/`): `[text |
  reference blocks | target audio | target video]`, one block per reference in request order
  (`MiniMaxH3Ref2VAReferenceEncoderStep` makes their latents; `MiniMaxH3Ref2VASetupStep` normalises the media first):
  - image: resized to a short edge of `reference_image_short_edge` (2048), each axis `max(m, round(axis * scale / m)
    * m)` with m the canvas multiple, no area cap; 1:4 to 4:1; one latent frame of (h // 16 // patch) x (w // 16 //
    patch) rows;
  - video: resampled to 24 fps (floor(n * 24 / fps + 0.5) frames), truncated to the generated frame count, put on the
    canvas its own aspect resolves to (`resolve_canvas_size`), snapped down to 17n+5 frames for the encode
    (`max(1, (n - 5) // 17) * 17 + 5`): `video_latent_num_frames` latent frames of rows; with a soundtrack, its audio
    rows first;
  - audio (with at least one image or video reference): the waveform truncated to the generated duration, right-padded
    to the audio VAE's hop (`AutoencoderKLMiniMaxH3Audio.encode`): ceil(samples / 800) latents x 2 channels, clean.
  At most 9 images, 3 videos, 3 audio references, 12 in all (`MiniMaxH3Ref2VASetupStep.__init__`).
Text rows (`video.text_tokens`) are the rows of prompt_embeds: for fl2va / ref2va the conditioner's whole presentation
(each keyframe's or reference's label and Qwen3-VL vision block, then the prompt; `MiniMaxH3FL2VATextEncoderStep`,
`MiniMaxH3Ref2VATextEncoderStep`), whose vision-token count is the checkpoint's Qwen3-VL processor's to give.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from h3plan.errors import ConfigError
from h3plan.facts.workflows import TASKS

ANCHORS = ("first", "last")  # MiniMaxH3ResizeStep: `image` anchors the first latent frame, `last_image` the last
KINDS = ("image", "video", "audio")
REFERENCE_KEYS = {"image": ("kind", "height", "width"),
                  "video": ("kind", "frames", "fps", "height", "width", "audio_seconds"),
                  "audio": ("kind", "seconds")}


def resolve_canvas(aspect_w: float, aspect_h: float, multiple: int, canvas: Mapping[str, Any]) -> tuple[int, int]:
    """diffusers `resolve_canvas_size` (modular_pipeline.py): (height, width) for an aspect ratio; ratios outside
    canvas.min_aspect..max_aspect (1/4..4) raise ValueError, as diffusers does."""
    ratio = aspect_w / aspect_h
    if not canvas["min_aspect"] <= ratio <= canvas["max_aspect"]:
        raise ValueError(f"aspect {aspect_w:g}:{aspect_h:g} is outside 1:{1 / canvas['min_aspect']:g} to "
                         f"{canvas['max_aspect']:g}:1")
    w, h = (canvas["short_edge"] * ratio, float(canvas["short_edge"])) if ratio >= 1 else (float(canvas["short_edge"]),
                                                                                           canvas["short_edge"] / ratio)
    if w * h > canvas["max_pixels"]:
        s = (canvas["max_pixels"] / (w * h)) ** 0.5
        w, h = w * s, h * s
    return max(multiple, round(h / multiple) * multiple), max(multiple, round(w / multiple) * multiple)


def check_task(task: str, keyframes, keyframe_size, references) -> None:
    """The fields a task takes, and only those (a keyframe on t2va or a reference on fl2va would silently plan
    rows the pipeline never builds)."""
    if task not in TASKS:
        raise ConfigError(f"video.task={task}", f"must be one of {', '.join(TASKS)} (MiniMaxH3ModularPipeline's "
                                                f"workflows)")
    if task != "fl2va" and (keyframes or keyframe_size):
        key = "video.keyframes" if keyframes else "video.keyframe_size"
        raise ConfigError(key, f"keyframes condition the fl2va workflow, not {task}: set video.task=fl2va, or "
                               f"{key}=null",
                          fix={"video.task": "fl2va"})
    if task != "ref2va" and references:
        raise ConfigError("video.references", f"references condition the ref2va workflow, not {task}: set "
                                              "video.task=ref2va, or video.references=null",
                          fix={"video.task": "ref2va"})
    if task == "fl2va":
        ks = list(keyframes or ())
        if (not ks or any(k not in ANCHORS for k in ks) or len(set(ks)) != len(ks)
                or ks != sorted(ks, key=ANCHORS.index)):
            mend = [a for a in ANCHORS if a in ks] or ["first"]
            raise ConfigError(f"video.keyframes={_show(keyframes)}", "fl2va takes a first and/or a last keyframe "
                                                                   "(MiniMaxH3ResizeStep: image, last_image): [first], "
                                                                   "[last] or [first,last]",
                              fix={"video.keyframes": _show(mend)})
    if task == "ref2va" and not references:
        raise ConfigError("video.references", "ref2va needs at least one reference (MiniMaxH3Ref2VASetupStep); use "
                                              "video.task=t2va for a text-only request", fix={"video.task": "t2va"})


def _show(v) -> str:
    return "null" if v is None else "[" + ",".join(map(str, v)) + "]"


def keyframe_canvas(keyframe_size, multiple: int, canvas: Mapping[str, Any]) -> tuple[int, int, str]:
    """fl2va without height/width: MiniMaxH3ResizeStep resolves the canvas from the first keyframe's aspect."""
    if keyframe_size is None:
        raise ConfigError("video.keyframe_size", "fl2va without video.height/width takes its canvas from the first "
                                                 "keyframe's aspect (MiniMaxH3ResizeStep): set "
                                                 "video.keyframe_size=[height,width] of that keyframe, or video.height "
                                                 "and video.width")
    h, w = _size("video.keyframe_size", keyframe_size)
    try:
        height, width = resolve_canvas(w, h, multiple, canvas)
    except ValueError as e:
        raise ConfigError(f"video.keyframe_size={_show(keyframe_size)}",
                          f"{e} (resolve_canvas_size refuses it)") from None
    return height, width, (f"the first keyframe's aspect ({h}x{w}): resolve_canvas_size({w}, {h}, {multiple}, "
                           f"{canvas['short_edge']}, {canvas['max_pixels']}) (MiniMaxH3ResizeStep)")


def _size(key: str, v) -> tuple[int, int]:
    ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(_int(x) and x > 0 for x in v)
    if not ok:
        raise ConfigError(f"{key}={_show(v) if isinstance(v, (list, tuple)) else v}",
                          "must be [height,width] in pixels, two positive integers")
    return int(v[0]), int(v[1])


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _reference(i: int, ref) -> dict[str, Any]:
    """One reference entry, checked: a mapping with `kind` and its kind's keys."""
    key = f"video.references[{i}]"
    if not isinstance(ref, Mapping) or ref.get("kind") not in KINDS:
        raise ConfigError(key, "must be {kind: image, height: H, width: W}, {kind: video, frames: N, fps: F, height: "
                               "H, width: W, audio_seconds: S or null} or {kind: audio, seconds: S}")
    kind = ref["kind"]
    extra = sorted(set(ref) - set(REFERENCE_KEYS[kind]))
    if extra:
        raise ConfigError(f"{key}.{extra[0]}", f"is not a key of a {kind} reference; its keys: "
                                               f"{', '.join(REFERENCE_KEYS[kind][1:])}")
    out = {"kind": kind}
    for k in REFERENCE_KEYS[kind][1:]:
        v = ref.get(k)
        if k == "fps" and v is None:
            v = 24.0  # MiniMaxH3VideoReference.__post_init__: fps defaults to MINIMAX_H3_FPS
        if k == "audio_seconds" and v is None:
            out[k] = None
            continue
        whole = k in ("height", "width", "frames")
        if v is None or not (_int(v) if whole else _number(v)) or v <= 0:
            raise ConfigError(f"{key}.{k}={v if v is not None else 'null'}",
                              f"must be a positive {'integer' if whole else 'number'}")
        out[k] = v
    return out


def _audio_latents(seconds: float, max_seconds: float, audio_vae: Mapping[str, Any]) -> tuple[int, int]:
    """(samples, latents) of a reference waveform at the audio VAE's rate: truncated to the generated duration
    (MiniMaxH3Ref2VASetupStep._normalize_audio_condition: `[:, : int(max_duration * sample_rate)]`), right-padded to
    the hop (AutoencoderKLMiniMaxH3Audio.encode)."""
    sr, hop = audio_vae["sampling_rate"], audio_vae["hop_length"]
    samples = min(int(round(seconds * sr)), int(max_seconds * sr))
    return samples, -(-samples // hop)


def references(refs: Sequence[Any], *, frames: int, fps: float, spatial: int, patch: Sequence[int], clip: int,
               chunk: int, pipe: Mapping[str, Any]) -> dict[str, Any]:
    """The ref2va reference blocks of a request generating `frames` frames: per block its kind, normalised geometry
    and rows, and the totals (condition_video_rows, condition_audio_rows). Refusals are the pipeline's."""
    lim, canvas = pipe["references"], pipe["canvas"]
    _, ph, pw = patch
    multiple = spatial * pw
    checked = [_reference(i, r) for i, r in enumerate(refs)]
    kinds = [r["kind"] for r in checked]
    for kind in KINDS:
        n, most = kinds.count(kind), lim[f"max_{kind}s"]
        if n > most:
            raise ConfigError("video.references", f"{n} {kind} references: MiniMax-H3 accepts at most {most} "
                                                  "(MiniMaxH3Ref2VASetupStep)")
    if len(kinds) > lim["max_references"]:
        raise ConfigError("video.references", f"{len(kinds)} references: MiniMax-H3 accepts at most "
                                              f"{lim['max_references']} in all")
    if set(kinds) == {"audio"}:
        raise ConfigError("video.references", "an audio reference has to be paired with at least one image or video "
                                              "reference (MiniMaxH3Ref2VASetupStep); add one, or use video.task=t2va")
    max_seconds = frames / fps
    blocks, video_rows, audio_rows = [], 0, 0
    for i, r in enumerate(checked):
        key = f"video.references[{i}]"
        b: dict[str, Any] = {"kind": r["kind"]}
        if r["kind"] == "image":
            h, w = r["height"], r["width"]
            if w > 4 * h or h > 4 * w:
                raise ConfigError(f"{key}", f"an image reference must be within 1:4 and 4:1, got {h}x{w} "
                                            f"(MiniMaxH3Ref2VASetupStep)")
            scale = lim["image_short_edge"] / min(w, h)
            b["height"] = max(multiple, round(h * scale / multiple) * multiple)
            b["width"] = max(multiple, round(w * scale / multiple) * multiple)
            b["latent_frames"] = 1
        elif r["kind"] == "video":
            n = r["frames"] if r["fps"] == fps else math.floor(r["frames"] * (fps / r["fps"]) + 0.5)
            n = min(n, frames)
            if n < clip + chunk:
                raise ConfigError(f"{key}.frames={r['frames']}",
                                  f"is {n} frames at {fps:g} fps; the reference encode snaps "
                                  f"down to {clip}n+{chunk} frames, at least {clip + chunk}: give at "
                                  f"least {math.ceil((clip + chunk) * r['fps'] / fps)} frames at "
                                  f"{r['fps']:g} fps")
            try:
                b["height"], b["width"] = resolve_canvas(r["width"], r["height"], multiple, canvas)
            except ValueError as e:
                raise ConfigError(key, f"{e} (resolve_canvas_size refuses the video's aspect)") from None
            encoded = max(1, (n - chunk) // clip) * clip + chunk
            b["frames"], b["latent_frames"] = encoded, (encoded - chunk) // clip * chunk + 2
            if r["audio_seconds"] is not None:
                b["audio_samples"], b["audio_latents"] = _audio_latents(
                    r["audio_seconds"], max_seconds, pipe["audio_vae"])
        else:
            b["audio_samples"], b["audio_latents"] = _audio_latents(r["seconds"], max_seconds, pipe["audio_vae"])
        if "latent_frames" in b:
            b["video_rows"] = b["latent_frames"] * (b["height"] // spatial // ph) * (b["width"] // spatial // pw)
            video_rows += b["video_rows"]
        if "audio_latents" in b:
            b["audio_rows"] = b["audio_latents"] * pipe["audio"]["channels"]
            audio_rows += b["audio_rows"]
        blocks.append(b)
    return {"blocks": blocks, "condition_video_rows": video_rows, "condition_audio_rows": audio_rows}


def describe(block: Mapping[str, Any]) -> str:
    """One reference block in words, for the plan's basis."""
    if block["kind"] == "image":
        return f"image {block['height']}x{block['width']}: {block['video_rows']:,} rows"
    if block["kind"] == "video":
        sound = f" + soundtrack {block['audio_rows']:,} audio rows" if "audio_rows" in block else ""
        return (f"video {block['frames']} frames {block['height']}x{block['width']} -> {block['latent_frames']} latent "
                f"frames: {block['video_rows']:,} rows{sound}")
    return f"audio {block['audio_latents']} latents: {block['audio_rows']:,} rows"


__all__ = ["ANCHORS", "resolve_canvas", "check_task", "keyframe_canvas", "references", "describe"]
