"""h3plan.facts.vae.tiling against diffusers' AutoencoderKLMiniMaxH3 itself: its tile split (`_split_tiles`), the
released tiling and chunking attributes, and the (chunk, tile) latent slices a real tiled decode hands the
decoder, recorded on the tiny VAE of conf/vae/h3_tiny.yaml (spatial x4, temporal x2, 3-frame clips, drop 1)
and on one with the released temporal geometry (17-frame clips, x4, drop 3). Contract: equality."""

import dataclasses
import os
import subprocess
import sys

import pytest
import yaml

from h3plan.facts.vae import tiling

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.filterwarnings("ignore:.*weight_norm:FutureWarning")

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
RELEASED_DC = yaml.safe_load(open(os.path.join(ROOT, "conf", "vae", "h3.yaml")))["diffusers_config"]
TINY_DC = yaml.safe_load(open(os.path.join(ROOT, "conf", "vae", "h3_tiny.yaml")))["vae"]["diffusers_config"]
# the released temporal chunking at tiny widths (what the pipeline's 17n+5 frame arithmetic assumes)
CLIP17_DC = dict(TINY_DC, spatial_downsample_factors=[2, 2], temporal_downsample_factors=[2, 2], clip_length=17,
                 token_drop=3)


def _vae(dc, device=None):
    kwargs = {**dc, "latents_mean": (0.0,) * dc["latent_channels"], "latents_std": (1.0,) * dc["latent_channels"]}
    torch.manual_seed(0)
    if device == "meta":
        with torch.device("meta"):
            return diffusers.AutoencoderKLMiniMaxH3(**kwargs)
    return diffusers.AutoencoderKLMiniMaxH3(**kwargs).eval()


@pytest.fixture(scope="module")
def released():
    return _vae(RELEASED_DC, "meta")


@pytest.fixture(scope="module")
def tiny():
    return _vae(TINY_DC)


@pytest.fixture(scope="module")
def clip17():
    return _vae(CLIP17_DC, "meta")


def test_geometry_is_the_vae_modules_own(released, tiny, clip17):
    """Compression, chunking and the released tiles as diffusers' __init__ derives and sets them."""
    for vae, dc in ((released, RELEASED_DC), (tiny, TINY_DC), (clip17, CLIP17_DC)):
        g = tiling.Geometry.from_config(dc)
        assert (g.spatial_ratio, g.temporal_ratio) == (vae.spatial_compression_ratio, vae.temporal_compression_ratio)
        assert (g.tokens_chunk_size, g.token_overlap, g.frame_pre_padding) == (
            vae.tokens_chunk_size, vae.token_overlap, vae.frame_pre_padding)
        assert (g.tile_height, g.tile_width, g.overlap_height, g.overlap_width) == (
            vae.tile_sample_min_height, vae.tile_sample_min_width, vae.tile_sample_min_overlap_height,
            vae.tile_sample_min_overlap_width)
        assert g.tiling == vae.use_tiling
    assert tiling.Geometry.from_config(RELEASED_DC) == tiling.RELEASED


@pytest.mark.parametrize("ratio_of", ["released", "tiny"])
def test_split_tiles_is_diffusers_split_tiles(released, tiny, ratio_of):
    vae = {"released": released, "tiny": tiny}[ratio_of]
    r = vae.spatial_compression_ratio
    for tile, ov in ((256, 64), (288, 32), (272, 32), (16 * r, 4 * r), (4 * r, 2 * r), (4 * r, r), (3 * r, 2 * r)):
        for length in range(r, 1500, r):
            want = tuple(vae._split_tiles(length, tile, ov))
            assert tiling.split_tiles(length, tile, ov, r) == want, (length, tile, ov, r)
            assert tiling.tile_span(length, tile, ov) == (len(want[0]), want[1][0]), (length, tile, ov)


def _recorded_calls(vae, z):
    """The latent slices diffusers' decode hands `post_quant_conv` (one per decoder call), in order."""
    calls = []
    hook = vae.post_quant_conv.register_forward_pre_hook(lambda m, a: calls.append(a[0].clone()))
    try:
        with torch.no_grad():
            out = vae.decode(z).sample
    finally:
        hook.remove()
    return calls, out


def _predicted_calls(z, g):
    """The same slices from tiling's chunk layout and tile split."""
    r = g.spatial_ratio
    pad, chunks = tiling.chunk_layout(z.shape[2], g)
    zp = torch.cat([z, z[:, :, -1:].repeat(1, 1, pad, 1, 1)], dim=2) if pad else z
    H, W = z.shape[-2] * r, z.shape[-1] * r
    ys = tiling.split_tiles(H, g.tile_height, g.overlap_height, r) if g.tiling else ([0], [H], [])
    xs = tiling.split_tiles(W, g.tile_width, g.overlap_width, r) if g.tiling else ([0], [W], [])
    return [zp[:, :, start:stop, y // r:(y + h) // r, x // r:(x + w) // r]
            for start, stop in chunks for y, h in zip(*ys[:2]) for x, w in zip(*xs[:2])]


@pytest.mark.parametrize("dc, tile, latent", [
    (TINY_DC, (16, 16, 8, 8), (2, 6, 8)),     # 24 x 32 px: 2 x 3 tiles at the minimum overlap
    (TINY_DC, (16, 16, 8, 8), (5, 9, 7)),     # 36 x 28 px: 4 x 3 tiles, the slack widens the first overlaps
    (TINY_DC, (24, 16, 4, 4), (4, 10, 3)),    # 40 px high: 2 rows overlapping 8; 12 px wide: one whole column
    (TINY_DC, (16, 20, 8, 12), (3, 5, 11)),   # per-axis tiles and overlaps: 2 rows x 4 columns
    (TINY_DC, None, (3, 5, 6)),               # tiling off: one call per chunk
    (CLIP17_DC, (16, 16, 8, 8), (7, 6, 6)),   # the released chunking: 5n+2 latent frames, drop 3; 2 x 2 tiles
    (CLIP17_DC, (20, 16, 8, 4), (13, 7, 9)),  # 13 + 3 padded by 4 latent frames; column overlaps 8 and 4
], ids=["tiny-2x3", "tiny-odd", "tiny-1col", "tiny-axes", "tiny-untiled", "clip17", "clip17-padded"])
def test_decoded_tiles_are_the_layouts_slices(dc, tile, latent):
    vae, g = _vae(dc), tiling.Geometry.from_config(dc)
    if tile is None:
        vae.disable_tiling()
        g = dataclasses.replace(g, tiling=False)
    else:
        vae.enable_tiling(*tile)
        g = dataclasses.replace(g, tile_height=tile[0], tile_width=tile[1], overlap_height=tile[2],
                                overlap_width=tile[3])
    z = torch.randn(1, dc["latent_channels"], *latent, generator=torch.Generator().manual_seed(1))
    calls, out = _recorded_calls(vae, z)
    want = _predicted_calls(z, g)
    assert len(calls) == len(want)
    for k, (got, exp) in enumerate(zip(calls, want)):
        assert torch.equal(got, exp), (k, tuple(got.shape), tuple(exp.shape))
    assert out.shape[2] == tiling.decoded_frames(latent[0], g)


def test_tile_rule_accepts_exactly_what_split_tiles_lays_latent_aligned(tiny):
    r = tiny.spatial_compression_ratio
    for h in range(-r, 8 * r + 1, 2):
        for o in range(-r, 8 * r + 1, 2):
            broken = tiling.tile_rule(h, h, o, r)
            if broken is None:
                for length in range(r, 20 * r, r):
                    starts, lengths, overlaps = tiny._split_tiles(length, h, o)
                    assert starts[-1] + lengths[-1] == length and all(s % r == 0 for s in starts + overlaps)
            else:
                assert h <= 0 or o <= 0 or h % r or o % r or o >= h, (h, o, broken)
    assert tiling.tile_rule(None, 16, None, 4) is None
    assert tiling.tile_rule(16, 16, 16, 4) == ("overlap", "must be smaller than the tile (16x16 px): diffusers lays no "
                                                          "such tiles")


def test_the_tiling_model_imports_no_torch():
    code = ("import sys, h3plan.facts.vae.tiling, h3plan.facts.vae.parallel_plan, h3plan.install.vae; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
