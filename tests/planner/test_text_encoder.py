"""The Qwen3-VL conditioner's sizes (h3plan/planning/text_encoder.py) against transformers' own model, and the
placement decision table (CPU, no downloads: a tiny seeded Qwen3VLConfig on the meta device)."""

import json

import pytest

from h3plan.planning import text_encoder as TE

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
    return TE.placement(config, 10, free_denoise=free_denoise, free_encode=free_encode, gemm_tflops=770, host_gbps=25,
                        forced=forced)


def test_placement_decision_table():
    s = TE.sizes(_config(), tokens=10)
    need, layer = s["weight_bytes"] + s["activation_bytes"], s["layer_bytes"] + s["activation_bytes"]
    assert _place(need, need)[0] == "resident"
    assert _place(need - 1, need)[0] == "offload_after"
    assert _place(0, need - 1)[0] == "host" and _place(0, layer)[0] == "host"
    with pytest.raises(ValueError, match="does not fit even layer by layer"):
        _place(0, layer - 1)
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
