"""What a request hands `AutoencoderKLMiniMaxH3.encode`, torch-free: one entry per encode call of diffusers' fl2va /
ref2va steps, read from the request breakdown (h3plan/planning/request.py, planning/workflows.py).

- fl2va: each keyframe is put on the target canvas and encoded alone (`MiniMaxH3KeyframeVaeEncoderStep`): one frame at
  the canvas size per keyframe;
- ref2va: each image reference at its normalised size (one frame), each video reference at its encoded frame count and
  canvas (`MiniMaxH3Ref2VAReferenceEncoderStep`); audio references and soundtracks go to the audio VAE (not this
  encode);
- t2va: none.
The lever (levers/vae_encode_precision.py), the time line (planning/predict.py) and action=tune read this one list.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from h3plan.facts.workflows import DEFAULT_TASK


def encode_inputs(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """[{what, frames, height, width}] of the video VAE encodes the request makes (empty: it encodes nothing)."""
    task = request.get("task", DEFAULT_TASK)
    if task == "fl2va":
        return [{"what": f"{k} keyframe", "frames": 1, "height": request["height"], "width": request["width"]}
                for k in request.get("keyframes") or ()]
    if task == "ref2va":
        return [{"what": f"{b['kind']} reference {i}", "frames": b.get("frames", 1), "height": b["height"],
                 "width": b["width"]}
                for i, b in enumerate(request.get("references") or ()) if b["kind"] in ("image", "video")]
    return []


def describe(inputs: Sequence[Mapping[str, Any]]) -> str:
    """The encodes in words: "2 encodes: first keyframe 1x1344x768, last keyframe 1x1344x768"."""
    return f"{len(inputs)} encode(s): " + ", ".join(f"{x['what']} {x['frames']}x{x['height']}x{x['width']}"
                                                    for x in inputs)


def seconds(points: Sequence[Mapping[str, Any]], inputs: Sequence[Mapping[str, Any]], precision: str,
            hw: str, tiles: str = "default") -> tuple[float | None, str]:
    """(seconds, basis) of the request's encodes at `precision` and tile geometry `tiles` (named as vae_tiles names
    them: default is the VAE's own) from hardware.measured.encode (each point: precision, tiles, input [frames, height,
    width], seconds, source), each encode scaled by pixel volume (frames x height x width) from the point nearest it in
    frame area (height x width: a frame's cost per pixel grows with its size, 1.9x from a 768x1344 keyframe to a
    2048x2048 reference on the H200, while frames add linearly); (None, why) where that precision and geometry have no
    point."""
    pts = [p for p in points or () if p["precision"] == precision and p.get("tiles", "default") == tiles]
    if not inputs:
        return 0.0, "the request encodes nothing"
    if not pts:
        at = "" if tiles == "default" else f" at the {tiles} geometry"
        return None, f"no encode at vae_encode_precision={precision}{at} measured or estimated on {hw}"
    total, used = 0.0, []
    for x in inputs:
        vol = x["frames"] * x["height"] * x["width"]
        p = min(pts, key=lambda p: abs(math.log(p["input"][1] * p["input"][2] / (x["height"] * x["width"]))))
        total += p["seconds"] * vol / math.prod(p["input"])
        used.append(p)
    seen = list({id(p): p for p in used}.values())  # each point once, in the inputs' order
    return total, (f"{describe(inputs)}; each scaled by frames x height x width from the point nearest its frame area "
                   f"(vae_encode_precision={precision}, {tiles} tiles on {hw}): "
                   + "; ".join(f"{p['seconds']:g} s at {'x'.join(map(str, p['input']))} ({p['source']})" for p in seen))


__all__ = ["encode_inputs", "describe", "seconds"]
