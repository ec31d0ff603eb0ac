"""The decode measured on a device (`hardware.measured.decode`), torch-free: the point at a decode precision and tile
geometry nearest a latent in volume, and its time scaled to that latent. The plan's time line (planning/predict.py)
and the parallel decode (levers/vae_parallel.py) both start from this one figure, so a plan states one decode time.

A point is the rest of diffusers' pipe(...) after its last forward (the video decode, nearly all of it; the audio
decode and the postprocess): {precision, tiles, latent [B, C, frames, height, width], seconds, source}.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence


def nearest(points: Sequence[Mapping[str, Any]] | None, precision: str, tiles: str,
            latent: tuple[int, int, int]) -> Mapping[str, Any] | None:
    """The point at `precision` and `tiles` nearest `latent` (frames, height, width) in log volume; None: none."""
    pts = [p for p in points or () if p["precision"] == precision and p["tiles"] == tiles]
    if not pts:
        return None
    vol = math.prod(latent)
    return min(pts, key=lambda p: abs(math.log(math.prod(p["latent"][2:]) / vol)))


def seconds(point: Mapping[str, Any], latent: tuple[int, int, int]) -> float:
    """The point's time scaled to `latent` by latent frames x height x width."""
    return point["seconds"] * math.prod(latent) / math.prod(point["latent"][2:])
