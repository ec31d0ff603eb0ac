"""The Qwen3-VL conditioner's sizes (h3plan/planning/text_encoder.py) against transformers' own model, and the
text_encoder lever's placement decision table (h3plan/levers/text_encoder.py; CPU, no downloads: a tiny seeded
Qwen3VLConfig on the meta device)."""

import json

import pytest

from h3plan.levers import MEMORY_REGISTRY
from h3plan.planning import text_encoder as TE

LEVER = MEMORY_REGISTRY["text_encoder"]

GiB = 2**30

TEXT = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]})
VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=4,
              spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0, 1])


def _config(**text):
    return {"text_config": {**TEXT, **text}, "vision_config": dict(VISION), "tie_word_embeddings": False}


@pytest.mark.parametrize("text", [{}, {"attention_bias": True}, {"num_key_value_heads": 4, "num_hidden_layers": 2}])
def test_parameters_are_transformers_own(text):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    cfg = transformers.Qwen3VLConfig(text_config={**TEXT, **text}, vision_config=VISION, tie_word_embeddings=False)
    with torch.device("meta"):
        model = transformers.Qwen3VLForConditionalGeneration(cfg)
    want = sum(p.numel() for p in model.parameters())
    assert TE.sizes(json.loads(cfg.to_json_string()))["params"] == want
    assert TE.sizes(_config(**text))["params"] == want


def test_read_a_pipeline_folder(tmp_path):
    (tmp_path / "text_encoder").mkdir()
    (tmp_path / "text_encoder" / "config.json").write_text(json.dumps(_config()))
    assert TE.read(tmp_path)["text_config"]["hidden_size"] == 64
    from h3plan.errors import UsageError

    with pytest.raises(UsageError, match="no text_encoder/config.json"):
        TE.read(tmp_path / "text_encoder" / "nothing")


def test_activation_peak_keeps_every_hidden_state():
    s = TE.sizes(_config(), tokens=10)
    assert s["activation_bytes"] == 2 * 10 * ((3 + 1) * 64 + 64 + 3 * 96)


# The decision table: (free at the denoise peak, free while encoding) in GiB of the tiny encoder's own bytes.
def _place(free_denoise, free_encode, forced=None, config=_config()):
    sizes = TE.sizes(config, 10) if config is not None else None
    d = LEVER.decide(LEVER.Room(sizes, free_denoise=free_denoise, free_encode=free_encode, gemm_tflops=770,
                                host_gbps=25, requested=forced or "auto"))
    assert d.lossless and d.forced == (forced is not None)
    return d.setting, list(d.reasons), dict(d.params)


def test_placement_decision_table():
    s = TE.sizes(_config(), tokens=10)
    need, layer = s["weight_bytes"] + s["activation_bytes"], s["layer_bytes"] + s["activation_bytes"]
    assert _place(need, need)[0] == "resident"
    assert _place(need - 1, need)[0] == "offload_after"
    assert _place(0, need - 1)[0] == "host" and _place(0, layer)[0] == "host"
    setting, reasons, _ = _place(0, layer - 1)  # nothing fits: host, and the plan's memory check refuses it
    assert setting == "host" and reasons[0].startswith("nothing fits: even layer by layer")
    assert _place(0, 0, config=None)[0] == "none"
    setting, reasons, nums = _place(need - 1, need)
    assert "moved to the host after encoding" in reasons[0] and nums["call_s"] == nums["encode_s"] + nums["move_s"]
    assert _place(need, need)[2]["call_s"] == _place(need, need)[2]["encode_s"]  # resident: no move in the call


def test_forced_placement_that_does_not_fit_is_refused():
    s = TE.sizes(_config(), tokens=10)
    need = s["weight_bytes"] + s["activation_bytes"]
    with pytest.raises(ValueError, match="text_encoder=resident does not fit"):
        _place(need - 1, need, forced="resident")
    assert _place(need - 1, need, forced="host")[0] == "host"
    with pytest.raises(ValueError, match="no conditioner config"):
        _place(0, 0, forced="resident", config=None)


# ---- in the plan: model.path's text_encoder/config.json, placed by the memory estimate ----------------------------

# A conditioner of the width MiniMax-H3 reads (text hidden 5120 = the transformer's text_dim; more than 50 layers:
# hidden_states[50]) in Qwen3-VL's layout; a test input, not the released checkpoint's config.
WIDE = {"text_config": dict(vocab_size=151936, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                            num_attention_heads=64, num_key_value_heads=8, head_dim=128),
        "vision_config": dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=5120,
                              patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                              deepstack_visual_indexes=[8, 16, 24]),
        "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import yaml

    from h3plan.planning import CONF

    folder = tmp_path_factory.mktemp("h3_with_text_encoder")
    dc = yaml.safe_load(open(f"{CONF}/model/h3.yaml"))["diffusers_config"]
    for sub, cfg in (("transformer", {"_class_name": "MiniMaxH3Transformer3DModel", **dc}),
                     ("transformer_ref", {"_class_name": "MiniMaxH3Transformer3DModel", **dc}), ("text_encoder", WIDE)):
        (folder / sub).mkdir()
        (folder / sub / "config.json").write_text(json.dumps(cfg))
    return str(folder)


@pytest.mark.parametrize("video", ["t2v_768x1344_5s", "ref2va_768x1344_5s"])
def test_80gb_card_plans_the_text_encoder_on_the_host(checkpoint, video):
    """Beside the 48.8 GiB the transformer and VAEs hold, 62 GiB of conditioner fits neither resident nor for the
    encode: auto leaves it on the host, one layer streamed at a time, and the plan fits 80 GB."""
    from h3plan import resolve_config

    plan = resolve_config(video=video, **{"model.path": checkpoint, "hardware.device.memory_gb": 80})
    te = plan.derived_value("text_encoder")
    s = TE.sizes(WIDE, plan.derived_value("sequence")["text_rows"])
    assert te["setting"] == "host" and te["weights_gib"] == pytest.approx(s["weight_bytes"] / GiB, abs=1e-3)
    b = plan.derived_value("memory_breakdown_gib")
    assert b["text_encoder"] == 0
    assert b["text_encoder_encode"] == pytest.approx((s["layer_bytes"] + s["activation_bytes"]) / GiB, abs=0.01)
    assert plan.derived_value("memory_peak_gib_per_gpu") <= 80e9 / GiB * 0.92


def test_141gb_card_keeps_it_resident_and_counts_it(checkpoint):
    from h3plan import resolve_config

    plan = resolve_config(**{"model.path": checkpoint})
    te, b = plan.derived_value("text_encoder"), plan.derived_value("memory_breakdown_gib")
    assert te["setting"] == "resident"
    assert b["text_encoder"] == pytest.approx(TE.sizes(WIDE)["weight_bytes"] / GiB, abs=0.01)
    assert "text_encoder" in plan.derived_value("memory_peak_items")


def test_forced_placement_that_does_not_fit_is_one_line_with_the_fit(checkpoint):
    from h3plan import resolve_config
    from h3plan.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        resolve_config(**{"model.path": checkpoint, "hardware.device.memory_gb": 80, "memory.text_encoder": "resident"})
    msg = str(e.value)
    assert msg.startswith("memory.text_encoder=resident: ")
    assert msg.endswith("nearest that fits: memory.text_encoder=host")
    assert "\n" not in msg


def test_without_a_conditioner_nothing_changes():
    from h3plan import resolve_config

    plan = resolve_config()
    assert plan.derived_value("text_encoder") is None
    assert plan.derived_value("memory_breakdown_gib")["text_encoder"] == 0


def test_model_offload_encodes_alone_and_moves_it_after(checkpoint):
    """memory.offload=model holds one model at a time: the encode has the device to itself, so on 80 GB the
    conditioner encodes on the device and is moved to the host after (its move in the call's time)."""
    from h3plan import resolve_config

    plan = resolve_config(**{"model.path": checkpoint, "hardware.device.memory_gb": 80, "memory.offload": "model"})
    te = plan.derived_value("text_encoder")
    assert te["setting"] == "offload_after" and te["call_s"] == pytest.approx(te["encode_s"] + te["move_s"], abs=2e-3)
    assert plan.derived_value("memory_peak_phase") == "encode"
    assert plan.derived_value("memory_peak_items") == ["text_encoder_encode"]


# ---- the packaged conditioner: model.text_encoder_default (conf/model/*.yaml, docs/sources.md#qwen3-vl-text-encoder)

def _packaged(model):
    import yaml

    from h3plan.planning import CONF

    return yaml.safe_load(open(f"{CONF}/model/{model}.yaml"))


@pytest.mark.parametrize("model", ["h3", "h3_tiny"])
def test_packaged_conditioner_feeds_the_transformer(model):
    """Its text width is the transformer's text_dim (hidden_states[50] goes in unprojected), it has more than 50
    decoder layers (diffusers keeps hidden_states[50]) and its vision tower merges out to that width."""
    cfg = _packaged(model)
    te = cfg["text_encoder_default"]
    assert te["text_config"]["hidden_size"] == cfg["diffusers_config"]["text_dim"]
    assert te["text_config"]["num_hidden_layers"] > 50
    assert te["vision_config"]["out_hidden_size"] == te["text_config"]["hidden_size"]


def test_packaged_conditioner_is_qwen3_vl_32b():
    """33.4 billion parameters, 62.1 GiB in bf16: the size the released folder's text encoder has (sources.md)."""
    s = TE.sizes(_packaged("h3")["text_encoder_default"])
    assert s["params"] == 33_357_390_064 and round(s["weight_bytes"] / GiB, 1) == 62.1


def test_a_named_placement_sizes_the_packaged_conditioner():
    """No model.path: memory.text_encoder=host plans the packaged widths; auto keeps prompt_embeds given."""
    from h3plan import resolve_config

    plan = resolve_config(**{"memory.text_encoder": "host"})
    te = plan.derived_value("text_encoder")
    s = TE.sizes(_packaged("h3")["text_encoder_default"], plan.derived_value("sequence")["text_rows"])
    assert te["setting"] == "host" and te["weights_gib"] == pytest.approx(s["weight_bytes"] / GiB, abs=1e-3)
    assert plan.derived_value("memory_breakdown_gib")["text_encoder_encode"] == pytest.approx(
        (s["layer_bytes"] + s["activation_bytes"]) / GiB, abs=0.01)
    assert resolve_config().derived_value("text_encoder") is None


def test_a_named_placement_that_does_not_fit_names_the_one_that_does():
    from h3plan import resolve_config
    from h3plan.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^memory.text_encoder=resident: .*nearest that fits: "
                                          r"memory.text_encoder=host$"):
        resolve_config(**{"memory.text_encoder": "resident", "hardware.device.memory_gb": 80})


@pytest.mark.parametrize("video", ["t2v_768x1344_5s", "ref2va_768x1344_5s"])
def test_host_placement_plans_on_an_80gb_card(video):
    """memory.text_encoder=host with the packaged widths fits 80 GB beside the resident pipeline, and the tables-off
    comparison estimate (23 GiB more of AdaLN linears on the device) does not re-run the forced placement into a
    refusal that escapes the plan."""
    from h3plan import resolve_config

    plan = resolve_config(video=video, **{"memory.text_encoder": "host", "hardware.device.memory_gb": 80})
    assert plan.derived_value("text_encoder")["setting"] == "host"
    assert plan.derived_value("memory_peak_gib_per_gpu") <= 80e9 / GiB * 0.92
    assert plan.derived_value("memory_peak_gib_tables_off") > plan.derived_value("memory_peak_gib_per_gpu")


# ---- one list of settings: the lever's SPEC, read by the config check, --help and the installer -------------------

def test_memory_text_encoder_takes_the_specs_settings():
    from h3plan import resolve_config
    from h3plan.errors import ConfigError

    assert tuple(LEVER.SPEC.settings) == ("none", "resident", "offload_after", "host")
    assert all(LEVER.SPEC.lossless(s) for s in LEVER.SPEC.settings)  # a placement moves weights, never a number
    with pytest.raises(ConfigError, match=r"^memory.text_encoder=bogus: allowed: auto, none, resident, offload_after, "
                       r"host$"):
        resolve_config(**{"memory.text_encoder": "bogus"})


def test_help_lists_it_beside_the_levers():
    from h3plan.cli import help_text

    lines = help_text().splitlines()
    at = next(i for i, x in enumerate(lines) if x.split()[:1] == ["memory.text_encoder"])
    assert lines[at].split()[1:] == ["auto", "|"] + " | ".join(LEVER.SPEC.settings).split()
    assert lines.index("other keys:") > at > next(i for i, x in enumerate(lines) if x.startswith("levers ("))


def test_the_plans_value_is_its_decision():
    from h3plan import resolve_config

    value = resolve_config(**{"memory.text_encoder": "host"}).derived_value("text_encoder")
    d = LEVER.from_derived(value)
    assert d.setting == "host" and list(d.reasons) == value["reasons"] and LEVER.derived(d) == value
    assert LEVER.from_derived(None) is None


def test_the_call_figure_counts_the_text_encode_it_prints():
    """One call figure: call_s_est (format=json) holds the placement's encode and moves, and the printed call line
    is that figure; a t2va plan given prompt_embeds counts none."""
    import re

    from h3plan.planner import resolve_config

    p = resolve_config(hardware="sm90", recipe="bf16", video="ref2va_768x1344_5s",
                       **{"memory.text_encoder": "offload_after"})
    te = p.derived_value("text_encoder")["call_s"]
    assert p.derived_value("text_encode_s_est") == round(te, 2) > 0
    parts = sum(p.derived_value(k) for k in ("text_encode_s_est", "denoise_s_est", "decode_s_est", "encode_s_est"))
    assert p.derived_value("call_s_est") == pytest.approx(parts, abs=0.03)
    shown = re.search(r"call ([\d,]+) s = ", p.summary()).group(1)
    assert int(shown.replace(",", "")) == round(p.derived_value("call_s_est"))
    t2va = resolve_config(hardware="sm90", recipe="bf16")
    assert t2va.derived_value("text_encode_s_est") == 0.0
    assert t2va.derived_value("call_s_est") == pytest.approx(
        t2va.derived_value("denoise_s_est") + t2va.derived_value("decode_s_est"), abs=0.02)
