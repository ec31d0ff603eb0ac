"""Planning numbers for spreading one VAE decode over the ranks of the Ulysses group (torch-free).

diffusers' AutoencoderKLMiniMaxH3 (0.42.1) decodes a latent [B, C, frames, h, w] as `chunks` temporal
chunks (`_decode`: `clip_length`, `token_drop`) times `rows x cols` spatial tiles per chunk (`_decode_clip`,
`_split_tiles`; both laid out by tiling.py): one ViT-decoder call per (chunk, tile) work item, then
stitching. The vae_parallel lever (`off | tiles`; h3plan/install/vae/parallel.py) gives each rank a contiguous
share of the items (`shares`), all-gathers the decoded tiles and stitches on every rank, bitwise equal to one GPU.

This module counts the items, the bytes a rank gathers and a first-order time: per-item decode time
from a measured whole decode (the anchor) divided by its item count, scaled by decoder tokens per item
where the geometry differs; a rank's time is its largest share times that, plus the gather at a given
per-rank rate. The stitch runs on every rank as it does on one GPU and sits inside the per-item time
(under 1% of the released decode: it reads and writes the video a few times at HBM speed), so the
estimate is optimistic by about that; `auto` asks for MIN_SPEEDUP to cover it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from h3plan.errors import PlanningError

from .tiling import RELEASED, Geometry, chunk_layout, tile_span

MIN_SPEEDUP = 1.05
HEADER_BYTES = 16  # a rank's status words at the head of its gather slot (install/vae/parallel.py)
ALIGN = 16         # every decoded item starts at a multiple of this in the slot (any dtype can view it)


@dataclass(frozen=True)
class Work:
    """Decoder calls of one decode (one batch slice): chunks x rows x cols items, each decoding to
    `item_shape` = (channels, frames, height, width) pixels."""

    chunks: int
    rows: int
    cols: int
    item_shape: tuple[int, int, int, int]

    @property
    def items(self) -> int:
        return self.chunks * self.rows * self.cols

    def item_bytes(self, elem_bytes: int) -> int:
        return math.prod(self.item_shape) * elem_bytes


def work(latent: tuple[int, int, int], g: Geometry = RELEASED) -> Work:
    """Work items for a latent of (frames, height, width) latent voxels."""
    frames, h, w = latent
    if min(frames, h, w) < 1:
        raise PlanningError(f"latent (frames, height, width) = {tuple(latent)}: every size must be positive")
    _, chunks = chunk_layout(frames, g)
    t = g.clip_latent_frames if chunks else 0
    H, W = h * g.spatial_ratio, w * g.spatial_ratio
    if not g.tiling:
        return Work(len(chunks), 1, 1, (g.out_channels, t * g.temporal_ratio, H, W))
    (rows, th), (cols, tw) = tile_span(H, g.tile_height, g.overlap_height), tile_span(W, g.tile_width, g.overlap_width)
    return Work(len(chunks), rows, cols, (g.out_channels, t * g.temporal_ratio, th, tw))


def shares(items: int, degree: int) -> list[tuple[int, int]]:
    """Rank r decodes items [lo, hi) of diffusers' call order: contiguous, counts differ by at most one
    (the first `items % degree` ranks take one more)."""
    if degree < 1 or items < 0:
        raise PlanningError(f"shares: degree {degree} and items {items} must be >= 1 and >= 0")
    q, rem = divmod(items, degree)
    out, lo = [], 0
    for r in range(degree):
        hi = lo + q + (r < rem)
        out.append((lo, hi))
        lo = hi
    return out


def _span(lo: float, hi: float, fmt: str = ".2f") -> str:
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}-{hi:{fmt}}"


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


@dataclass(frozen=True)
class Anchor:
    """A measured whole decode: latent (frames, height, width), seconds [min, max], its geometry."""

    latent: tuple[int, int, int]
    seconds: tuple[float, float]
    geometry: Geometry
    source: str


# The released latent [1, 24, 62, 48, 84] -> video [1, 3, 209, 768, 1344] at 256/64 tiles: 12 chunks x 28 tiles.
H200_EAGER = Anchor((62, 48, 84), (11.1, 12.4), RELEASED,
                    "diffusers eager decode, FP16 autocast, one H200 (conf/hardware/sm90.yaml measured.vae_decode)")
H200_PLAN = Anchor((62, 48, 84), (6.723, 6.723), RELEASED,
                   "h3plan's VAE plan (vae_ops fused + vae_graphs), one H200 (docs/sources.md#h200-anchors: 12,335 -> "
                   "6,723 ms)")
# all_to_all_single per-rank rates over NVLink at degrees 2 and 4 (conf/hardware/sm90.yaml measured.ulysses.a2a)
H200_GATHER_GBPS = 200.1


@dataclass(frozen=True)
class Estimate:
    degree: int
    items: int
    max_items_per_rank: int
    item_bytes: int
    gathered_bytes_per_rank: int  # decoded tiles a rank receives (the other ranks' padded slots)
    buffer_bytes_per_rank: int    # the gather buffer every rank holds: degree x the largest share
    item_s: tuple[float, float]
    one_gpu_s: tuple[float, float]
    degree_s: tuple[float, float]
    gather_s: float
    basis: tuple[str, ...]

    @property
    def speedup(self) -> tuple[float, float]:
        return (self.one_gpu_s[0] / self.degree_s[0], self.one_gpu_s[1] / self.degree_s[1])


def _tokens(w: Work, g: Geometry) -> int:
    c, f, h, wd = w.item_shape
    return (f // g.temporal_ratio) * (h // g.spatial_ratio) * (wd // g.spatial_ratio)


def estimate(latent: tuple[int, int, int], degree: int, g: Geometry = RELEASED, *, anchor: Anchor = H200_PLAN,
             gather_gbps: float = H200_GATHER_GBPS, elem_bytes: int = 2) -> Estimate:
    """First-order decode time at `degree` ranks vs one (see the module docstring). elem_bytes: the decoded
    tiles' dtype (2: FP16 autocast, what the anchors time; 4: float32)."""
    if degree < 1:
        raise PlanningError(f"vae_parallel: degree {degree} must be >= 1")
    if gather_gbps <= 0:
        raise PlanningError(f"vae_parallel: gather rate {gather_gbps} GB/s must be positive")
    w, aw = work(latent, g), work(anchor.latent, anchor.geometry)
    scale = _tokens(w, g) / _tokens(aw, anchor.geometry)
    item_s = tuple(s / aw.items * scale for s in anchor.seconds)
    sh = shares(w.items, degree)
    most = max(hi - lo for lo, hi in sh)
    nbytes = w.item_bytes(elem_bytes)
    slot = HEADER_BYTES + most * aligned(nbytes)
    received = (degree - 1) * slot if degree > 1 else 0
    gather_s = received / (gather_gbps * 1e9)
    basis = [f"{w.items} decoder calls = {w.chunks} temporal chunks x {w.rows} x {w.cols} tiles of "
             f"{'x'.join(map(str, w.item_shape))} px; largest share {most} at degree {degree}",
             f"per call {_span(*(x * 1e3 for x in item_s), '.1f')} ms: {anchor.source}, "
             f"{aw.items} calls" + ("" if scale == 1 else f", scaled by decoder tokens per call x{scale:.3f}"),
             f"gather: {received / 1e9:.2f} GB into each rank at {gather_gbps:g} GB/s"]
    return Estimate(degree, w.items, most, nbytes, received, degree * slot, item_s,
                    tuple(w.items * s for s in item_s), tuple(most * s + gather_s for s in item_s), gather_s,
                    tuple(basis))


def blockers(setting: str, latent: tuple[int, int, int], degree: int, g: Geometry = RELEASED) -> list[str]:
    """Why `setting` cannot apply (empty: it can)."""
    if setting == "off":
        return []
    out = []
    if degree < 2:
        out.append(f"Ulysses degree {degree}: one rank, nothing to spread the tiles over")
    if not g.tiling:
        out.append("VAE tiling is off: the installed wrapper spreads tiled decodes only (diffusers' decode runs)")
    n = work(latent, g).items
    if n < 2:
        out.append(f"latent {tuple(latent)} decodes in {n} decoder call{'' if n == 1 else 's'}: nothing to spread")
    return out


def auto(latent: tuple[int, int, int], degree: int, g: Geometry = RELEASED, *, anchor: Anchor = H200_PLAN,
         gather_gbps: float = H200_GATHER_GBPS, elem_bytes: int = 2,
         min_speedup: float = MIN_SPEEDUP) -> tuple[str, list[str], dict]:
    """(setting, reasons, params): tiles where it can apply and the estimate promises >= min_speedup."""
    why = blockers("tiles", latent, degree, g)
    if why:
        return "off", why, {}
    e = estimate(latent, degree, g, anchor=anchor, gather_gbps=gather_gbps, elem_bytes=elem_bytes)
    head = (f"estimated {_span(*e.one_gpu_s)} s on one GPU -> {_span(*e.degree_s)} s at degree {degree} "
            f"({_span(*e.speedup)}x; gather {e.gather_s * 1e3:.1f} ms)")
    params = {"items": e.items, "max_items_per_rank": e.max_items_per_rank,
              "gathered_bytes_per_rank": e.gathered_bytes_per_rank, "buffer_bytes_per_rank": e.buffer_bytes_per_rank,
              "one_gpu_s": round(e.one_gpu_s[1], 3), "decode_s": round(e.degree_s[1], 3)}
    if min(e.speedup) < min_speedup:
        return "off", [f"{head}: below {min_speedup:.2f}x, not worth a gather buffer of "
                       f"{e.buffer_bytes_per_rank / 2**30:.2f} GiB per rank", *e.basis], {}
    return "tiles", [f"{head}; every rank stitches with diffusers' own code: bitwise the one-GPU decode; "
                     f"gather buffer {e.buffer_bytes_per_rank / 2**30:.2f} GiB per rank", *e.basis], params


