"""fl2va and ref2va requests (h3plan/planning/workflows.py, request.py) against diffusers' own steps (CPU, no
downloads).

The oracle is diffusers 0.42.1's chain run on tiny tensors: for ref2va `MiniMaxH3Ref2VASetupStep` (normalises the
media), `MiniMaxH3Ref2VAReferenceEncoderStep` (a real tiny video VAE and audio VAE encode them) and
`MiniMaxH3Ref2VAPrepareLayoutStep` (the packed layout); for fl2va `MiniMaxH3ResizeStep` (the canvas) and
`MiniMaxH3PrepareLayoutStep` with its keyframe anchors. The pipeline's canvas configs are shrunk (short edge 32, image
references at 48) and handed to h3plan as the same pipeline facts, so both sides do the same arithmetic on a CPU.
The AdaLN table's keys are diffusers' `MiniMaxH3SetTimestepsStep` over the same layouts.
"""

import copy
import os
import sys

import pytest
import yaml

from h3plan.errors import ConfigError
from h3plan.planning.request import VideoConfig, VideoRequest, pipeline_defaults, tokens
from h3plan.facts.timesteps import table_timesteps

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("diffusers")
sys.path.insert(0, os.path.dirname(__file__))
from test_request_tokens import CONF, MODEL, TINY_MODEL, TINY_VAE, VAE, _import_layout  # noqa: E402

SHORT, AREA, IMAGE_EDGE = 32, 32 * 56, 48  # the shrunk canvas and image-reference edge, on both sides
FRAMES = 123  # 5n+3 frames of the tiny VAE (clip 5, 3 latents per chunk), 5.125 s at 24 fps


def _pipe_facts():
    p = copy.deepcopy(pipeline_defaults())
    p["canvas"].update(short_edge=SHORT, max_pixels=AREA)
    p["references"]["image_short_edge"] = IMAGE_EDGE
    return p


@pytest.fixture(scope="module")
def steps():
    """diffusers' blocks as pipelines over a tiny video VAE and audio VAE (same hop: 800 samples at 32 kHz)."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel
    from diffusers.image_processor import VaeImageProcessor
    from diffusers.modular_pipelines.minimax_h3 import before_encoder, encoders

    bd = _import_layout()
    torch.manual_seed(0)
    vae = AutoencoderKLMiniMaxH3(**TINY_VAE, latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    audio_vae = AutoencoderKLMiniMaxH3Audio(encoder_dim=4, latent_dim=8, latent_channels=4, num_attention_heads=1,
                                           decoder_dim=128, latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    with torch.device("meta"):
        transformer = MiniMaxH3Transformer3DModel(**{**TINY_MODEL, "patch_size": tuple(TINY_MODEL["patch_size"])})

    def make(block, partition):
        p = block.init_pipeline()
        p.vae, p.audio_vae, p.image_processor = vae, audio_vae, VaeImageProcessor()
        setattr(p, partition, transformer)
        p.register_to_config(canvas_short_edge=SHORT, canvas_max_pixels=AREA, reference_image_short_edge=IMAGE_EDGE)
        return p

    return {"setup": make(before_encoder.MiniMaxH3Ref2VASetupStep(), "transformer_ref"),
            "encode": make(encoders.MiniMaxH3Ref2VAReferenceEncoderStep(), "transformer_ref"),
            "ref_layout": make(bd.MiniMaxH3Ref2VAPrepareLayoutStep(), "transformer_ref"),
            "resize": make(before_encoder.MiniMaxH3ResizeStep(), "transformer"),
            "layout": make(bd.MiniMaxH3PrepareLayoutStep(), "transformer"),
            "timesteps": bd.MiniMaxH3SetTimestepsStep}


def _media(ref):
    """A diffusers reference object for one of h3plan's reference entries (zeros: only the geometry matters)."""
    from diffusers.modular_pipelines.minimax_h3 import references as R

    if ref["kind"] == "image":
        return R.MiniMaxH3ImageReference(image=np.zeros((ref["height"], ref["width"], 3), np.uint8))
    if ref["kind"] == "video":
        audio = None if ref.get("audio_seconds") is None else torch.zeros(1, int(round(ref["audio_seconds"] * 32000)))
        return R.MiniMaxH3VideoReference(frames=np.zeros((ref["frames"], ref["height"], ref["width"], 3), np.uint8),
                                         fps=float(ref.get("fps", 24.0)), audio=audio)
    return R.MiniMaxH3AudioReference(audio=torch.zeros(2, int(round(ref["seconds"] * 32000))), sample_rate=32000)


def _ref2va(steps, refs, text):
    s = steps["setup"](references=[_media(r) for r in refs], num_frames=FRAMES,
                       output=["normalized_references", "height", "width", "num_frames"])
    e = steps["encode"](normalized_references=s["normalized_references"],
                        output=["condition_latents", "audio_condition_latents"])
    names = ["position_ids", "num_condition_video_rows", "num_condition_audio_rows", "video_indices", "audio_indices",
             "text_indices"]
    out = steps["ref_layout"](text_token_tags=torch.ones(text, dtype=torch.long),
                              normalized_references=s["normalized_references"],
                              condition_latents=e["condition_latents"],
                              audio_condition_latents=e["audio_condition_latents"],
                              height=s["height"], width=s["width"], num_frames=s["num_frames"], output=names)
    return out


REF_SETS = [
    [{"kind": "image", "height": 40, "width": 100}],
    [{"kind": "image", "height": 40, "width": 100}, {"kind": "video", "frames": 40, "fps": 30, "height": 30,
                                                     "width": 50,
                                                     "audio_seconds": 3}, {"kind": "audio", "seconds": 1.5625}],
    [{"kind": "video", "frames": 200, "fps": 24, "height": 64, "width": 48, "audio_seconds": None},
     {"kind": "image", "height": 90, "width": 30}, {"kind": "image", "height": 33, "width": 33}],
    # soundtrack truncated
    [{"kind": "video", "frames": 50, "fps": 12, "height": 20, "width": 70, "audio_seconds": 9.0},
     {"kind": "audio", "seconds": 0.01}],
]


@pytest.mark.parametrize("refs", REF_SETS, ids=lambda r: "+".join(x["kind"] for x in r))
def test_ref2va_rows_are_diffusers_layout(steps, refs):
    got = tokens(VideoRequest(task="ref2va", references=refs, frames=FRAMES, text_tokens=9), TINY_MODEL, TINY_VAE,
                 _pipe_facts())
    want = _ref2va(steps, refs, 9)
    assert got["seq_len"] == want["position_ids"].shape[0]
    assert got["condition_video_rows"] == want["num_condition_video_rows"]
    assert got["condition_audio_rows"] == want["num_condition_audio_rows"]
    assert got["video_rows"] + got["condition_video_rows"] == want["video_indices"].numel()
    assert got["audio_rows"] + got["condition_audio_rows"] == want["audio_indices"].numel()
    assert got["partition"] == "transformer_ref" and [b["kind"] for b in got["references"]] == [r["kind"] for r in refs]
    kinds = {"audio": True, "condition_video": got["condition_video_rows"] > 0,
             "condition_audio": got["condition_audio_rows"] > 0}
    _check_keys(steps, got, want, kinds)


@pytest.mark.parametrize("anchors,size", [(["first"], None), (["last"], None), (["first", "last"], None),
                                          (["first"], [90, 40]), (["first", "last"], [33, 100])])
def test_fl2va_rows_are_diffusers_layout(steps, anchors, size):
    from PIL import Image

    req = VideoRequest(task="fl2va", keyframes=anchors, keyframe_size=size, frames=FRAMES, text_tokens=11,
                       **({} if size else {"height": 24, "width": 64}))
    got = tokens(req, TINY_MODEL, TINY_VAE, _pipe_facts())
    h, w = size or (24, 64)
    frames = {"image": Image.new("RGB", (w, h)) if "first" in anchors else None,
              "last_image": Image.new("RGB", (w, h)) if "last" in anchors else None}
    r = steps["resize"](**frames, **({} if size else {"height": 24, "width": 64}),
                        output=["height", "width", "keyframe_anchors"])
    names = ["position_ids", "num_condition_video_rows", "video_indices", "audio_indices", "text_indices", "num_frames"]
    want = steps["layout"](text_token_tags=torch.ones(11, dtype=torch.long), height=r["height"], width=r["width"],
                           num_frames=FRAMES, keyframe_anchors=r["keyframe_anchors"], output=names)
    assert (got["height"], got["width"]) == (r["height"], r["width"]) and tuple(anchors) == r["keyframe_anchors"]
    assert got["seq_len"] == want["position_ids"].shape[0]
    assert got["condition_video_rows"] == want["num_condition_video_rows"] and got["condition_audio_rows"] == 0
    _check_keys(steps, got, {**want, "num_condition_audio_rows": 0}, {"audio": True, "condition_video": True,
                                                                       "condition_audio": False})


def test_t2va_keys_have_no_condition_rows(steps):
    got = tokens(VideoRequest(frames=FRAMES, text_tokens=5, height=24, width=64), TINY_MODEL, TINY_VAE, _pipe_facts())
    want = steps["layout"](text_token_tags=torch.ones(5, dtype=torch.long), height=24, width=64, num_frames=FRAMES,
                           output=["video_indices", "audio_indices", "text_indices", "num_condition_video_rows"])
    assert "task" not in got and want["num_condition_video_rows"] == 0
    _check_keys(steps, got, {**want, "num_condition_audio_rows": 0}, {"audio": True, "condition_video": False,
                                                                       "condition_audio": False})


def _check_keys(steps, got, want, kinds, n=7):
    """table_timesteps of the request: the distinct vectors diffusers' MiniMaxH3SetTimestepsStep passes over the
    layout's own rows, as many and as wide (the planning values recompute the schedule in Python floats, so they may
    differ from diffusers' float32 in the last ulp; the installer keys on diffusers' own)."""
    from diffusers import MiniMaxH3Scheduler

    pipe = pipeline_defaults()
    sv, sa = MiniMaxH3Scheduler(shift=12.0), MiniMaxH3Scheduler(shift=3.0)
    sv.set_timesteps(n)
    sa.set_timesteps(n)
    build = steps["timesteps"].build_row_timesteps
    seen = {}
    for t, ta in zip(sv.timesteps, sa.timesteps):
        ts, _ = build(want["video_indices"], want["audio_indices"], want["num_condition_video_rows"],
                      want["num_condition_audio_rows"], want["text_indices"].numel(), float(t), float(ta),
                      max(float(t), pipe["keyframe_noise_aug"]), 1.0)
        seen.setdefault(tuple(ts.tolist()), None)
    planned, want_keys = table_timesteps(got, pipe, [n]), list(seen)
    assert [len(v) for v in planned] == [len(v) for v in want_keys]  # the table's rows: the same vectors and widths
    # planning floats: within float32 ulps of diffusers'
    assert planned == [pytest.approx(v, abs=2e-7) for v in want_keys]
    assert max(map(len, planned)) == 1 + kinds["audio"] + kinds["condition_video"] + kinds["condition_audio"]


@pytest.mark.parametrize("kw,key", [
    ({"task": "i2v"}, "video.task=i2v"),
    ({"task": "fl2va"}, "video.keyframes=null"),
    ({"task": "fl2va", "keyframes": ["last", "first"]}, "video.keyframes=[last,first]"),
    ({"task": "fl2va", "keyframes": ["middle"]}, "video.keyframes=[middle]"),
    ({"keyframes": ["first"]}, "video.keyframes"),
    ({"references": [{"kind": "image", "height": 8, "width": 8}]}, "video.references"),
    ({"task": "ref2va"}, "video.references"),
    ({"task": "ref2va", "references": [{"kind": "audio", "seconds": 2}]}, "video.references"),
    ({"task": "ref2va", "references": [{"kind": "image", "height": 8, "width": 8}] * 10}, "video.references"),
    ({"task": "ref2va", "references": [{"kind": "video", "frames": 30, "height": 8, "width": 8}] * 4},
     "video.references"),
    ({"task": "ref2va", "references": [{"kind": "image", "height": 10, "width": 50}]}, "video.references[0]"),
    ({"task": "ref2va", "references": [{"kind": "image", "height": 10}]}, "video.references[0].width=null"),
    ({"task": "ref2va", "references": [{"kind": "image", "height": 10, "width": 10, "fps": 2}]},
     "video.references[0].fps"),
    ({"task": "ref2va", "references": [{"kind": "sound", "seconds": 2}]}, "video.references[0]"),
    ({"task": "ref2va", "references": [{"kind": "video", "frames": 12, "height": 8, "width": 8}]},
     "video.references[0].frames=12"),
    ({"task": "ref2va", "references": [{"kind": "image", "height": 8, "width": 8}], "num_inference_steps": 1},
     "video.num_inference_steps=1"),
])
def test_refusals_are_one_line_naming_the_key(kw, key):
    with pytest.raises(ConfigError) as e:
        tokens(VideoRequest(**{"text_tokens": 10, **kw}), MODEL, VAE)
    assert str(e.value).startswith(key + ":") and "\n" not in str(e.value)


def test_fl2va_canvas_needs_the_keyframe_aspect():
    with pytest.raises(ConfigError, match=r"^video.keyframe_size: .*video.keyframe_size=\[height,width\]"):
        tokens(VideoRequest(task="fl2va", keyframes=["first"], text_tokens=10), MODEL, VAE)
    with pytest.raises(ConfigError, match=r"^video.keyframe_size=\[100,900\]: aspect"):
        tokens(VideoRequest(task="fl2va", keyframes=["first"], keyframe_size=[100, 900], text_tokens=10), MODEL, VAE)


def test_video_reference_resampled_and_truncated_at_the_released_geometry():
    """A 30 fps 1080p clip of 300 frames: 240 frames at 24 fps, truncated to the 124 generated (already 17n+5: the
    encode keeps them, 37 latent frames) on its own 16:9 canvas 768x1344; its 10 s soundtrack truncated to 124/24 s.
    A 100-frame clip at 24 fps is snapped down to 90 frames (27 latent frames)."""
    ref = {"kind": "video", "frames": 300, "fps": 30, "height": 1080, "width": 1920, "audio_seconds": 10}
    got = tokens(VideoRequest(task="ref2va", references=[ref], text_tokens=10), MODEL, VAE)
    b = got["references"][0]
    assert (b["frames"], b["latent_frames"], b["height"], b["width"]) == (124, 37, 768, 1344)
    assert b["video_rows"] == 37 * 24 * 42 and b["audio_samples"] == int(124 / 24 * 32000) and b["audio_latents"] == 207
    assert got["seq_len"] == 10 + b["video_rows"] + 2 * 207 + 414 + 37296
    short = tokens(VideoRequest(task="ref2va", references=[{**ref, "frames": 100, "fps": 24}], text_tokens=10),
                   MODEL, VAE)
    assert (short["references"][0]["frames"], short["references"][0]["latent_frames"]) == (90, 27)


PRESETS = {"ref2va_768x1344_5s": ("ref2va", 49), "fl2va_turbo_768x1344": ("fl2va", 4)}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_workflow_presets(name):
    from omegaconf import OmegaConf

    from h3plan.planning.request import request_from

    raw = yaml.safe_load(open(os.path.join(CONF, "video", f"{name}.yaml")))
    video = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(VideoConfig), raw))
    got = tokens(request_from(video), MODEL, VAE)
    task, forwards = PRESETS[name]
    assert got["task"] == task and got["transformer_forwards"] == forwards and raw["name"] == name


def test_the_seed_107_frames_are_refused_with_the_length_that_works():
    """The vllm-omni seed's Turbo FL2VA ran 107 frames: 4.46 s, under diffusers' 5 s; the refusal names 124."""
    from h3plan import resolve_config

    with pytest.raises(ConfigError, match=r"^video.frames=107: .*from 124 to") as e:
        resolve_config(video="fl2va_turbo_768x1344", **{"video.frames": 107})
    assert e.value.fix == {"video.frames": "124"}
    assert resolve_config(video="fl2va_turbo_768x1344", **e.value.fix).derived_value("sequence")["frames"] == 124


@pytest.mark.parametrize("kw", [{"video.keyframes": ["first"]},
                                {"video.task": "fl2va", "video.keyframes": ["last", "first"]},
                                {"video.task": "ref2va"}, {"video.seconds": 20}])
def test_a_refusal_names_the_override_that_works(kw):
    from h3plan import resolve_config

    with pytest.raises(ConfigError) as e:
        resolve_config(**kw)
    assert e.value.fix
    fixed = {**kw, **e.value.fix}
    assert resolve_config(**{k: (v if not isinstance(v, str) or not v.startswith("[") else v.strip("[]").split(","))
                             for k, v in fixed.items()}).derived_value("sequence")["seq_len"] > 0


@pytest.mark.parametrize("video,steps,cv,ca", [("fl2va_turbo_768x1344", 5, True, False),
                                               ("ref2va_768x1344_5s", 50, True, False),
                                               ("t2v_768x1344_5s", 50, False, False)])
def test_table_keys_and_memory_follow_the_request(video, steps, cv, ca):
    """The adaln_table decision tables the request's own steps and kinds of row; the memory estimate counts the
    same rows (one table_timesteps for both)."""
    from h3plan import resolve_config

    plan = resolve_config(video=video)
    d = plan.decision("adaln_table")
    seq = plan.derived_value("sequence")
    keys = table_timesteps(seq, plan.get("pipeline"))
    assert d.setting == "on" and list(d.param("steps")) == [steps]
    assert (d.param("condition_video"), d.param("condition_audio")) == (cv, ca)
    assert d.param("rows") == sum(map(len, keys)) and d.param("vectors") == len(keys)
    assert plan.derived_value("memory_breakdown_gib")["adaln_tables"] == pytest.approx(d.param("table_gib"), abs=0.01)


def test_ref2va_with_audio_references_tables_the_clean_audio_value():
    from h3plan import resolve_config

    plan = resolve_config(video="ref2va_768x1344_5s", **{"video.references": [{"kind": "image",
                                                                               "height": 512, "width": 512},
                                                                              {"kind": "audio", "seconds": 4}]})
    d = plan.decision("adaln_table")
    assert d.param("condition_video") and d.param("condition_audio")
    assert plan.derived_value("sequence")["condition_audio_rows"] == 2 * 160


def _write(folder, sub, dc):
    import json

    (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / sub / "config.json").write_text(json.dumps({"_class_name": "MiniMaxH3Transformer3DModel", **dc}))


def test_ref2va_plans_from_transformer_ref_widths(tmp_path):
    """model.path=DIR: t2va / fl2va plan from transformer/config.json, ref2va from transformer_ref/config.json."""
    from h3plan import resolve_config

    base = MODEL["diffusers_config"]
    _write(tmp_path, "transformer", base)
    _write(tmp_path, "transformer_ref", {**base, "num_layers": 40, "ffn_dim": 12288})
    t2va = resolve_config(**{"model.path": str(tmp_path)})
    ref = resolve_config(video="ref2va_768x1344_5s", **{"model.path": str(tmp_path)})
    assert t2va.get("model")["diffusers_config"]["num_layers"] == 50
    dc = ref.get("model")["diffusers_config"]
    assert (dc["num_layers"], dc["ffn_dim"]) == (40, 12288) and "transformer_ref" in ref.get("model")["source"]


def test_ref2va_without_its_partition_is_refused(tmp_path):
    from h3plan import resolve_config
    from h3plan.errors import UsageError

    _write(tmp_path, "transformer", MODEL["diffusers_config"])
    with pytest.raises(UsageError, match=r"no transformer_ref/config.json, the partition ref2va run against") as e:
        resolve_config(video="ref2va_768x1344_5s", **{"model.path": str(tmp_path)})
    assert "\n" not in str(e.value)


def test_both_partitions_are_planned_memory_or_refused_with_the_fit():
    """memory.partitions=both holds transformer/ and transformer_ref/: the other partition's weights (and tables) are
    counted; on an 80 GB card that does not fit and the refusal names memory.partitions=one first."""
    from h3plan import resolve_config
    from h3plan.errors import PlanningError

    one = resolve_config(video="ref2va_768x1344_5s")
    both = resolve_config(video="ref2va_768x1344_5s", **{"memory.partitions": "both"})
    b1, b2 = one.derived_value("memory_breakdown_gib"), both.derived_value("memory_breakdown_gib")
    assert b2["other_partition_weights"] == pytest.approx(b1["transformer_weights"] + b1["adaln_tables"], abs=0.02)
    assert both.derived_value("memory_peak_gib_per_gpu") == pytest.approx(
        one.derived_value("memory_peak_gib_per_gpu") + b2["other_partition_weights"], abs=0.02)
    with pytest.raises(PlanningError) as e:
        resolve_config(video="ref2va_768x1344_5s", **{"memory.partitions": "both", "hardware.device.memory_gb": 80})
    assert "nearest fit: memory.partitions=one" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^memory.partitions=two: allowed: one, both"):
        resolve_config(**{"memory.partitions": "two"})


def test_both_partitions_are_in_the_pipeline_moved_to_the_gpu_whole():
    """The install line's pipe.to("cuda") figure holds both partitions as loaded, as the peak counts both."""
    from h3plan import resolve_config

    one = resolve_config(video="ref2va_768x1344_5s")
    both = resolve_config(video="ref2va_768x1344_5s", **{"memory.partitions": "both"})
    transformer = resolve_config(video="ref2va_768x1344_5s", **{"memory.holds": "transformer"})
    assert both.derived_value("memory_loaded_gib") == pytest.approx(
        one.derived_value("memory_loaded_gib") + transformer.derived_value("memory_loaded_gib"), abs=0.02)


@pytest.mark.parametrize("placement", ["resident", "offload_after", "host"])
def test_a_placed_text_encoder_is_in_the_pipeline_moved_to_the_gpu_whole(placement):
    """pipe.to("cuda") moves every component, the conditioner too, whatever placement install gives it afterwards:
    the install line's figure holds its weights (the tier's fl2va on the H200 ran out of device memory in setup
    with the bf16 transformer and the conditioner both there, 12-05 04:04, benchmarks/results/pipeline-h200.log)."""
    from h3plan import resolve_config
    from h3plan.planning import text_encoder

    request = {"video": "t2v_768x1344_5s", "video.task": "fl2va", "video.keyframes": ["first", "last"]}
    bare = resolve_config(**request)
    placed = resolve_config(**request, **{"memory.text_encoder": placement})
    te = text_encoder.sizes(placed.get("model")["text_encoder_default"], 0)["weight_bytes"] / 2**30
    assert placed.derived_value("memory_loaded_gib") == pytest.approx(bare.derived_value("memory_loaded_gib") + te,
                                                                      abs=0.02)
    # the bf16 transformer and the conditioner on a 141 GB card: more than it may use, so the line says load on the host
    bf16 = resolve_config(**request, recipe="fp8", **{"recipe.checkpoint": "bf16", "memory.text_encoder": "resident"})
    assert bf16.derived_value("memory_loaded_gib") > 120.8
    from h3plan.planning.render import _memory_texts
    line = " ".join(t for t in _memory_texts(bf16, bf16.derived_value("memory_peak_gib_per_gpu"),
                                             bf16.derived_value("memory_breakdown_gib")) if t.startswith("install"))
    assert line.endswith("(does not fit: load it on the host)"), line
