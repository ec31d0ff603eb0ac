"""h3plan.planning.request against diffusers' own MiniMax-H3 pipeline code (CPU, no downloads).

The oracle is diffusers 0.42.1's `MiniMaxH3PrepareLayoutStep` run as a pipeline (its canvas, frame
alignment, duration check, latent and audio counts and `build_packed_sequence`), with the VAE and
transformer built from our YAML configs on the meta device as its components, so the pipeline's
properties (canvas_multiple, frames per chunk, latents per chunk, patch size) come from diffusers too.
"""

import glob
import os

import pytest
import yaml

from h3plan.errors import ConfigError
from h3plan.planning.request import VideoConfig, PipelineConfig, VideoRequest, pipeline_defaults, sequence, tokens

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

CONF = os.path.join(os.path.dirname(__file__), "..", "..", "conf")
MODEL = yaml.safe_load(open(os.path.join(CONF, "model", "h3.yaml")))
VAE = yaml.safe_load(open(os.path.join(CONF, "vae", "h3.yaml")))
# fl2va / ref2va: test_request_workflows.py
PRESETS = [p for p in sorted(glob.glob(os.path.join(CONF, "video", "*.yaml")))
           if yaml.safe_load(open(p)).get("task", "t2va") == "t2va"]

# A geometry unlike the released one: 5-frame clips, temporal x2 (3 latents per chunk, 1 dropped),
# spatial x4, so the canvas multiple is 8 and frames align to 5n+3.
TINY_VAE = dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=[8, 16], layers_per_block=1,
                spatial_downsample_factors=[2, 2], temporal_downsample_factors=[1, 2], norm_num_groups=4, norm_eps=1e-6,
                spatial_padding_mode="reflect", decoder_num_layers=1, decoder_num_attention_heads=2,
                decoder_attention_head_dim=24, decoder_num_register_tokens=2, decoder_ffn_mult=2,
                decoder_rope_theta=100.0,
                decoder_rope_dim_ratio=0.75, decoder_norm_eps=1e-5, clip_length=5, token_drop=1)
TINY_MODEL = dict(num_attention_heads=2, attention_head_dim=24, hidden_size=32, num_layers=1, num_refiner_layers=1,
                  ffn_dim=64, in_channels=4, audio_in_channels=8, patch_size=[1, 2, 2], text_dim=16, freq_dim=16,
                  time_embed_hidden_dim=32, time_embed_dim=16, rope_freq_dim=4)


def _import_layout():
    """diffusers' minimax_h3 modular modules. Without `transformers` installed, diffusers.loaders does not
    export the LoRA mixin that modular_pipeline.py imports (and the arithmetic never uses): take it from
    its own module."""
    import diffusers.loaders as loaders

    try:
        loaders.MiniMaxH3LoraLoaderMixin  # noqa: B018
    except (AttributeError, ImportError, RuntimeError):
        from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

        loaders.MiniMaxH3LoraLoaderMixin = MiniMaxH3LoraLoaderMixin
    from diffusers.modular_pipelines.minimax_h3 import before_denoise

    return before_denoise


@pytest.fixture(scope="module")
def layout():
    """layout(model_dc, vae_dc, text, height, width, num_frames) -> diffusers' resolved request and rows."""
    from diffusers import AutoencoderKLMiniMaxH3, MiniMaxH3Transformer3DModel

    bd = _import_layout()
    pipes = {}

    def run(model_dc, vae_dc, text, height=None, width=None, num_frames=None, audio=True):
        key = (id(model_dc), id(vae_dc))
        if key not in pipes:
            pipe = bd.MiniMaxH3PrepareLayoutStep().init_pipeline()
            with torch.device("meta"):
                pipe.vae = AutoencoderKLMiniMaxH3(**vae_dc)
                pipe.transformer = MiniMaxH3Transformer3DModel(**{**model_dc,
                                                                  "patch_size": tuple(model_dc["patch_size"])})
            pipes[key] = pipe
        pipe = pipes[key]
        kw = {k: v for k, v in (("height", height), ("width", width), ("num_frames", num_frames)) if v is not None}
        names = ["height", "width", "num_frames", "num_latent_frames", "latent_height", "latent_width",
                 "num_audio_latents",
                 "position_ids", "video_indices", "audio_indices", "text_indices"]
        out = pipe(text_token_tags=torch.ones(text, dtype=torch.long), output=names, **kw)
        if not audio:  # diffusers' t2va always has audio: lay out the same request without it, with its own builder
            rows = bd.MiniMaxH3PrepareLayoutStep.build_packed_sequence(
                torch.ones(text, dtype=torch.long), out["num_latent_frames"], out["latent_height"], out["latent_width"],
                0,
                pipe.patch_size, pipe.audio_channels, pipe.audio_tag, pipe.video_tag)
            out["position_ids"], out["video_indices"], out["audio_indices"] = rows[0], rows[2], rows[3]
        return out

    return run


def _check(ours, theirs):
    got = {k: ours[k] for k in ("height", "width", "frames", "latent_frames", "latent_height", "latent_width",
                                "seq_len", "video_rows", "audio_rows", "text_rows")}
    want = {"height": theirs["height"], "width": theirs["width"], "frames": theirs["num_frames"],
            "latent_frames": theirs["num_latent_frames"], "latent_height": theirs["latent_height"],
            "latent_width": theirs["latent_width"], "seq_len": theirs["position_ids"].shape[0],
            "video_rows": theirs["video_indices"].numel(), "audio_rows": theirs["audio_indices"].numel(),
            "text_rows": theirs["text_indices"].numel()}
    assert got == want


# (height, width, frames, seconds, audio, text): released config, against diffusers' pipeline
RELEASED = [
    (None, None, None, None, True, 110),     # diffusers' defaults: 768x1344, 124 frames -> 37,820
    (768, 1344, 345, None, True, 110),       # the longest clip -> 104,076
    (544, 960, None, 5, True, 110),          # the TRT-LLM seed's canvas, 5 s -> 124 frames
    (768, 1344, None, 10, True, 110),        # 240 frames align up to 243
    (480, 832, 200, None, True, 7),          # 200 -> 209 frames, another canvas
    (1024, 576, 130, None, True, 300),       # portrait, 130 -> 141 frames
    (768, 1344, 124, None, False, 110),      # no audio rows
    (384, 672, 243, None, True, 46),         # exactly 19,000 tokens
]


@pytest.mark.parametrize("height,width,frames,seconds,audio,text", RELEASED)
def test_released_config_matches_diffusers(layout, height, width, frames, seconds, audio, text):
    req = VideoRequest(height=height, width=width, frames=frames, seconds=seconds, audio=audio, text_tokens=text)
    ours = tokens(req, MODEL, VAE)
    num_frames = frames if frames is not None else (None if seconds is None else round(seconds * 24))
    _check(ours, layout(MODEL["diffusers_config"], VAE["diffusers_config"], text, height, width, num_frames, audio))
    assert ours["seq_len"] == ours["text_rows"] + ours["audio_rows"] + ours["video_rows"]


@pytest.mark.parametrize("height,width,frames,text", [(64, 96, 130, 7), (40, 200, 121, 3), (8, 8, 300, 1),
                                                      (None, None, None, 5)])
def test_other_geometry_matches_diffusers(layout, height, width, frames, text):
    ours = tokens(VideoRequest(height=height, width=width, frames=frames, text_tokens=text), TINY_MODEL, TINY_VAE)
    _check(ours, layout(TINY_MODEL, TINY_VAE, text, height, width, frames))


def test_measured_shapes_and_defaults():
    """The H200 anchors' 37,820 and 104,076-token clips are diffusers requests with a 110-token prompt; the
    seed's "19k" canvas gives 19,394; 50 steps (49 forwards) and 768x1344x124 are the pipeline defaults."""
    s = lambda **kw: tokens(VideoRequest(text_tokens=110, **kw), MODEL, VAE)["seq_len"]  # noqa: E731
    assert (s(), s(height=768, width=1344, seconds=14), s(height=544, width=960, seconds=5)) == (37820, 104076, 19394)
    t = tokens(VideoRequest(text_tokens=110), MODEL, VAE)
    assert (t["height"], t["width"], t["frames"], t["num_inference_steps"], t["transformer_forwards"]) == (
        768, 1344, 124, 50, 49)


def test_default_steps_are_diffusers():
    from diffusers import MiniMaxH3Scheduler

    bd = _import_layout()
    default = {p.name: p.default for p in bd.MiniMaxH3SetTimestepsStep().inputs}["num_inference_steps"]
    sched = MiniMaxH3Scheduler()
    sched.set_timesteps(default)
    t = tokens(VideoRequest(text_tokens=1), MODEL, VAE)
    assert (t["num_inference_steps"], t["transformer_forwards"]) == (default, len(sched.timesteps))
    pipe = bd.MiniMaxH3PrepareLayoutStep()
    defaults = {p.name: p.default for p in pipe.inputs}
    cfg = {c.name: c.default for c in pipe.expected_configs}
    ours = pipeline_defaults()
    assert (ours["default_num_frames"], ours["canvas"]["short_edge"], ours["canvas"]["max_pixels"]) == \
        (defaults["num_frames"], cfg["canvas_short_edge"], cfg["canvas_max_pixels"])


def test_audio_off_is_a_transformer_shape():
    """No audio rows: the transformer takes an empty audio_indices (tiny model, one forward)."""
    from diffusers import MiniMaxH3Transformer3DModel

    torch.manual_seed(0)
    m = MiniMaxH3Transformer3DModel(**{**TINY_MODEL, "patch_size": (1, 2, 2)}).eval()
    t = tokens(VideoRequest(height=16, width=16, frames=121, audio=False, text_tokens=3), TINY_MODEL, TINY_VAE)
    st, sv = t["text_rows"], t["video_rows"]
    assert t["audio_rows"] == 0 and t["seq_len"] == st + sv
    with torch.no_grad():
        out = m(hidden_states=torch.randn(1, sv, 16), audio_hidden_states=torch.randn(1, 0, 8),
                encoder_hidden_states=torch.randn(1, st, 16), timestep=torch.tensor([0.5]),
                timestep_indices=torch.zeros(t["seq_len"], dtype=torch.long),
                token_tags=torch.tensor([1] * st + [0] * sv),
                position_ids=torch.randn(t["seq_len"], 3), video_indices=torch.arange(st, st + sv),
                audio_indices=torch.arange(0), text_indices=torch.arange(st))
    assert out.sample.shape == (1, sv, 16) and out.audio_sample.shape == (1, 0, 8)


# Requests diffusers' pipeline refuses (ValueError), and the key our ConfigError names.
REFUSED = [
    (dict(height=770, width=1344), "video.height=770"),
    (dict(height=768, width=1000), "video.width=1000"),
    (dict(height=768), "video.width"),
    (dict(frames=100), "video.frames=100"),     # 107 frames = 4.46 s < 5 s
    (dict(frames=350), "video.frames=350"),     # 362 frames = 15.08 s > 15 s
    (dict(seconds=15), "video.seconds=15"),
    (dict(seconds=4), "video.seconds=4"),
]


@pytest.mark.parametrize("kw,key", REFUSED)
def test_refused_like_diffusers(layout, kw, key):
    num_frames = kw.get("frames", None if "seconds" not in kw else round(kw["seconds"] * 24))
    with pytest.raises(ValueError):
        layout(MODEL["diffusers_config"], VAE["diffusers_config"], 4, kw.get("height"), kw.get("width"), num_frames)
    with pytest.raises(ConfigError) as e:
        tokens(VideoRequest(text_tokens=4, **kw), MODEL, VAE)
    assert str(e.value).startswith(key + ":") and "\n" not in str(e.value)


@pytest.mark.parametrize("kw,key", [
    (dict(height=0, width=1344), "video.height=0"),
    (dict(height=-32, width=1344), "video.height=-32"),
    (dict(fps=0), "video.fps=0"),
    (dict(fps=-24), "video.fps=-24"),
    (dict(fps=30), "video.fps=30"),
    (dict(seconds=0), "video.seconds=0"),
    (dict(frames=0), "video.frames=0"),
    (dict(frames=12.5), "video.frames=12.5"),
    (dict(seconds=5, frames=209), "video.frames=209"),
    (dict(text_tokens=None), "video.text_tokens"),
    (dict(text_tokens=0), "video.text_tokens=0"),
    (dict(batch=0), "video.batch=0"),
])
def test_bad_requests_name_the_key(kw, key):
    with pytest.raises(ConfigError) as e:
        tokens(VideoRequest(**{"text_tokens": 10, **kw}), MODEL, VAE)
    assert str(e.value).startswith(key + ":") and "\n" not in str(e.value)


def test_seconds_and_frames_that_align_alike_are_consistent():
    a = tokens(VideoRequest(seconds=5, frames=124, text_tokens=1), MODEL, VAE)
    b = tokens(VideoRequest(seconds=5, frames=120, text_tokens=1), MODEL, VAE)
    assert a["frames"] == b["frames"] == 124


def test_vae_whose_encode_disagrees_with_diffusers_helper_is_refused():
    with pytest.raises(ConfigError, match="token_drop"):
        tokens(VideoRequest(text_tokens=1), MODEL, {**VAE["diffusers_config"], "token_drop": 2})


@pytest.mark.parametrize("path", PRESETS, ids=os.path.basename)
def test_presets(layout, path):
    from omegaconf import OmegaConf

    raw = yaml.safe_load(open(path))
    assert raw["source"] and raw["name"] == os.path.basename(path)[:-5]
    assert set(raw) == {"name", "height", "width", "seconds", "frames", "fps", "audio", "text_tokens", "source"}
    node = OmegaConf.merge(OmegaConf.structured(VideoConfig), raw)  # fits the Hydra node, no unknown keys
    video = OmegaConf.to_container(node)
    seq, breakdown, basis = sequence({"video": video, "model": MODEL, "vae": VAE, "parallel": {"seq_len": None}})
    frames = video["frames"] or round(video["seconds"] * 24)
    _check(breakdown, layout(MODEL["diffusers_config"], VAE["diffusers_config"], video["text_tokens"], video["height"],
                             video["width"], frames, video["audio"]))
    assert seq == breakdown["seq_len"] and basis["seq_len"].startswith(f"video={raw['name']}")


def test_pipeline_yaml_fits_its_node():
    from omegaconf import OmegaConf

    OmegaConf.merge(OmegaConf.structured(PipelineConfig), pipeline_defaults())


def test_sequence_explicit_seq_len_wins():
    video = yaml.safe_load(open(os.path.join(CONF, "video", "t2v_768x1344_5s.yaml")))
    s, breakdown, basis = sequence({"video": video, "model": MODEL, "vae": VAE, "parallel": {"seq_len": 19000}})
    assert s == 19000 and breakdown == {"source": "parallel.seq_len", "seq_len": 19000, "video_request_seq_len": 37820}
    assert "wins" in basis["seq_len"] and "37,820" in basis["seq_len"]
    assert sequence({"model": MODEL, "vae": VAE, "parallel": {"seq_len": 5}})[0] == 5
    with pytest.raises(ConfigError, match="^parallel.seq_len"):
        sequence({"model": MODEL, "vae": VAE, "parallel": {"seq_len": None}})
    with pytest.raises(ConfigError, match=r"^parallel.seq_len=0"):
        sequence({"model": MODEL, "vae": VAE, "parallel": {"seq_len": 0}})


def test_torch_free_import():
    import subprocess
    import sys

    code = ("import sys, h3plan.planning.request, h3plan.planning.memory; "
            "print(sorted(m for m in ('torch', 'diffusers', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.join(CONF, ".."), env={**os.environ, "PYTHONPATH": os.path.join(CONF, "..")})
    assert out.stdout.strip() == "[]"
