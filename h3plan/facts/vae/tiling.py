"""How diffusers' AutoencoderKLMiniMaxH3 (0.42.1) lays out one decode, torch-free: the one tiling model that the
memory estimate (memory.py), the parallel decode plan (parallel_plan.py) and the installer (install.py,
parallel.py) read.

`_decode` repeats the last latent frame `pad` times and decodes the padded latent in temporal chunks of
`tokens_chunk_size + token_overlap` latent frames (`chunk_layout`); `_decode_clip` cuts each chunk's frame into
spatial tiles laid out in pixels by `_split_tiles` (`split_tiles`), one decoder call per (chunk, tile), then
stitches them. `decoded_frames` is the pixel frame count `_decode` returns; `tile_rule` says which tile
geometries `_split_tiles` can lay (the config's and the installer's check).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from h3plan.errors import PlanningError

# diffusers' AutoencoderKLMiniMaxH3.__init__: tile_sample_min_height / _width 256, tile_sample_min_overlap_* 64
RELEASED_TILE = {"height": 256, "width": 256, "overlap": 64}


@dataclass(frozen=True)
class Geometry:
    """What sets the decoder calls: the VAE config's compression and chunking, and the tiling.

    Pixel tile sizes as diffusers' `enable_tiling` takes them; `tiling=False` decodes each chunk whole."""

    spatial_ratio: int = 16
    temporal_ratio: int = 4
    clip_length: int = 17
    token_drop: int = 3
    out_channels: int = 3
    tile_height: int = RELEASED_TILE["height"]
    tile_width: int = RELEASED_TILE["width"]
    overlap_height: int = RELEASED_TILE["overlap"]
    overlap_width: int = RELEASED_TILE["overlap"]
    tiling: bool = True

    @property
    def tokens_chunk_size(self) -> int:
        """Latent frames a chunk advances by (diffusers: ceil(clip_length / temporal ratio))."""
        return -(-self.clip_length // self.temporal_ratio)

    @property
    def token_overlap(self) -> int:
        """Extra latent frames each chunk's decoder call sees (diffusers: -token_drop mod tokens_chunk_size)."""
        return (-self.token_drop) % self.tokens_chunk_size

    @property
    def frame_pre_padding(self) -> int:
        """Pixel frames the encoder's clips implicitly lead with (diffusers: -clip_length mod temporal ratio)."""
        return (-self.clip_length) % self.temporal_ratio

    @property
    def clip_latent_frames(self) -> int:
        """Latent frames of one chunk's decoder call."""
        return self.tokens_chunk_size + self.token_overlap

    @classmethod
    def from_config(cls, diffusers_config: Mapping[str, Any], tile: Mapping[str, Any] | None = None) -> "Geometry":
        """From conf/vae/<name>.yaml's diffusers_config and a tile dict (height, width, overlap); None: released."""
        dc = diffusers_config
        t = tile or RELEASED_TILE
        return cls(spatial_ratio=math.prod(dc["spatial_downsample_factors"]),
                   temporal_ratio=math.prod(dc["temporal_downsample_factors"]), clip_length=dc["clip_length"],
                   token_drop=dc["token_drop"], out_channels=dc["out_channels"], tile_height=t["height"],
                   tile_width=t["width"], overlap_height=t["overlap"], overlap_width=t["overlap"])


RELEASED = Geometry()


def tile_count(length: int, tile: int, min_overlap: int) -> int:
    """Tiles diffusers' `_split_tiles` lays over `length` pixels: the fewest `tile`-wide tiles that cover it
    with every overlap >= `min_overlap` (n*tile - (n-1)*min_overlap >= length), one when the tile covers it all."""
    if tile >= length:
        return 1
    if not 0 <= min_overlap < tile:
        raise PlanningError(f"tile {tile} px with overlap {min_overlap} px: the overlap must be smaller than the tile")
    return -(-(length - min_overlap) // (tile - min_overlap))


def tile_span(length: int, tile: int, min_overlap: int) -> tuple[int, int]:
    """(tiles, pixels per tile) along one axis: the whole length as one tile when the tile covers it."""
    n = tile_count(length, tile, min_overlap)
    return n, (length if n == 1 else tile)


def split_tiles(length: int, tile: int, min_overlap: int, ratio: int) -> tuple[list[int], list[int], list[int]]:
    """diffusers' `_split_tiles`: (starts, lengths, overlaps) in pixels; the slack past `min_overlap` goes to the
    overlaps round-robin in whole `ratio` (spatial compression) steps, so every boundary stays latent-aligned."""
    n = tile_count(length, tile, min_overlap)
    if n == 1:
        return [0], [length], []
    overlaps = [min_overlap] * (n - 1)
    for i in range((tile * n - min_overlap * (n - 1) - length) // ratio):
        overlaps[i % (n - 1)] += ratio
    starts = [0]
    for o in overlaps:
        starts.append(starts[-1] + tile - o)
    return starts, [tile] * n, overlaps


def chunk_layout(frames: int, g: Geometry = RELEASED) -> tuple[int, list[tuple[int, int]]]:
    """(pad, [(start, stop), ...]): diffusers' `_decode` repeats the last latent frame `pad` times, then
    decodes latent frames [start, stop) of the padded latent per chunk, in this order."""
    n, drop = g.tokens_chunk_size, g.token_drop
    tokens = frames + drop
    pad = (-tokens) % n
    chunks = (tokens + pad) // n - int(drop > 0)
    return pad, [(i * n, i * n + g.clip_latent_frames) for i in range(chunks)]


def decoded_frames(latent_frames: int, g: Geometry = RELEASED) -> int:
    """Pixel frames `_decode` returns for `latent_frames` latent frames: each chunk's first tokens_chunk_size latent
    frames less the pre-padding, the last chunk's overlap, less the frames of the `pad` repeated latent frames."""
    n, t, pre = g.tokens_chunk_size, g.temporal_ratio, g.frame_pre_padding
    pad, chunks = chunk_layout(latent_frames, g)
    clip_px = g.clip_latent_frames * t
    frames = len(chunks) * (n * t - pre) + (max(min(clip_px, 2 * n * t) - n * t - pre, 0) if g.token_drop > 0 else 0)
    tail = g.clip_length % t
    return frames - sum(tail if tail and (latent_frames + k) % n == 0 else t for k in range(pad))


def tile_rule(height: int | None, width: int | None, overlap: int | None, ratio: int) -> tuple[str, str] | None:
    """(field, why) of the first rule a tile geometry breaks (None fields are unset), None when `_split_tiles` can
    lay it: every size a positive multiple of the spatial compression, the overlap smaller than the tile."""
    for k, v in (("height", height), ("width", width), ("overlap", overlap)):
        if v is not None and (v <= 0 or v % ratio):
            return k, f"must be a positive multiple of the spatial compression {ratio}"
    if None not in (height, width, overlap) and overlap >= min(height, width):
        return "overlap", f"must be smaller than the tile ({height}x{width} px): diffusers lays no such tiles"
    return None


__all__ = ["RELEASED_TILE", "Geometry", "RELEASED", "tile_count", "tile_span", "split_tiles", "chunk_layout",
           "decoded_frames", "tile_rule"]
