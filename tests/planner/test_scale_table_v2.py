"""Version-2 static FP8 scale tables (torch-free): round trip, one-line refusals naming the file (malformed,
missing keys, non-finite or non-positive amax, stale version, another model, a failed held-out check, values
edited after calibration), version-1 compatibility, and the planner reading them (fp8_scales=static, FP8
linears with static input scales; a table of another model refused at plan time)."""

import json

import pytest

from h3plan.facts.blocks import BLOCK_LINEARS
from h3plan.facts.scale_table import (FORMAT, VERSION, ScaleTableError, config_hash, has_linears, linear_amax, load,
                                      load_table, row_for, values_hash)

TINY = {"num_attention_heads": 4, "attention_head_dim": 32, "hidden_size": 96, "num_layers": 2, "num_refiner_layers": 1,
        "ffn_dim": 160, "in_channels": 4, "audio_in_channels": 8, "patch_size": [1, 2, 2], "text_dim": 48,
        "freq_dim": 32,
        "time_embed_hidden_dim": 64, "time_embed_dim": 40, "rope_freq_dim": 4, "rope_theta": 10000.0, "norm_eps": 1e-5,
        "qk_norm_eps": 1e-5, "final_norm_eps": 1e-5}  # conf/model/h3_tiny.yaml


def table(blocks=2, config=TINY, passed=True):
    att = {f"transformer_blocks.{i}.attn": {"q": 3.0 + i, "k": 4.0, "v": 2.5} for i in range(blocks)}
    lin = {f"transformer_blocks.{i}.{p}": (1.5 if p.startswith("attn.to_") and p != "attn.to_out.0" else 0.75 + i)
           for i in range(blocks) for p in BLOCK_LINEARS}
    check = {"passed": passed, "summary": "static scales psnr 52.0 dB vs dynamic 52.1 dB, budget 34 dB"}
    prov = {"model": "h3_tiny", "config_hash": config_hash(config), "num_layers": blocks, "request": {"seq_len": 48},
            "inputs": {"kind": "seeded", "seeds": [0], "steps": [0, 48]}, "heldout": {"kind": "seeded", "seeds": [1000],
                                                                                       "check": check},
            "date": "2026-01-01T00:00:00Z", "margin": 1.0, "statistic": "amax", "h3plan_version": "0.2.0",
            "values_sha256": values_hash(att, lin)}
    return {"format": FORMAT, "version": VERSION, "provenance": prov, "attention": att, "linears": lin}


def write(tmp_path, obj, name="t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return str(p)


def test_round_trip(tmp_path):
    path = write(tmp_path, table())
    t = load_table(path, model_config=TINY)
    assert t.version == VERSION and t.provenance["model"] == "h3_tiny"
    assert t.attention["transformer_blocks.1.attn"] == (4.0, 4.0, 2.5)
    assert linear_amax(t, "transformer_blocks.1.ff.net.2") == 1.75
    assert load(path) == t.attention  # what the attention installer reads
    assert row_for(load(path), "transformer_blocks.0.attn", path) == (3.0, 4.0, 2.5)
    assert has_linears(path) and not has_linears(None) and not has_linears(str(tmp_path / "none.json"))
    with pytest.raises(ScaleTableError, match="no input amax for transformer_blocks.7.ff.net.2"):
        linear_amax(t, "transformer_blocks.7.ff.net.2")


def _edit(fn):
    t = table()
    fn(t)
    return t


def _del(path):
    def f(t):
        node = t
        for k in path[:-1]:
            node = node[k]
        del node[path[-1]]
    return f


def _set(path, value):
    def f(t):
        node = t
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return f


BLOCK0 = "transformer_blocks.0.attn"
CASES = [
    ("negative attention amax", _set(["attention", BLOCK0, "k"], -2.0), "amax must be finite numbers > 0"),
    ("zero linear amax", _set(["linears", "transformer_blocks.0.ff.net.2"], 0.0), "amax must be a finite number > 0"),
    ("NaN", _set(["attention", BLOCK0, "q"], float("nan")), "amax must be finite numbers > 0"),
    ("bool", _set(["linears", "transformer_blocks.0.ff.net.2"], True), "amax must be a finite number > 0"),
    ("removed q", _del(["attention", BLOCK0, "q"]), "must be {\"q\": amax"),
    ("removed linears", _del(["linears"]), "missing key 'linears'"),
    ("removed provenance key", _del(["provenance", "config_hash"]), "provenance is missing 'config_hash'"),
    ("unknown top key", _set(["extra"], 1), "unknown key 'extra'"),
    ("not ours", _del(["format"]), "not an h3plan scale table"),
    ("stale", _set(["version"], 3), "stale: written as table version 3"),
    ("stale old", _set(["version"], 1), "stale: written as table version 1"),
    ("to_k differs", _set(["linears", "transformer_blocks.1.attn.to_k"], 9.0), "to_q/to_k/to_v read one input"),
    ("no check", _del(["provenance", "heldout", "check"]), "the held-out check never ran"),
    ("rejected", _set(["provenance", "heldout", "check", "passed"], False), "rejected by its held-out check"),
    ("edited value", _set(["linears", "transformer_blocks.0.ff.net.2"], 5.0), "values changed since calibration"),
    ("bad margin", _set(["provenance", "margin"], 0), "provenance.margin must be"),
    ("bad percentile", _set(["percentile"], {"p": 150, "attention": {}, "linears": {}}), "percentile must be"),
]


@pytest.mark.parametrize("name,edit,fault", CASES, ids=[c[0] for c in CASES])
def test_refused_in_one_line_naming_the_file(tmp_path, name, edit, fault):
    path = write(tmp_path, _edit(edit))
    with pytest.raises(ScaleTableError) as e:
        load_table(path, model_config=TINY)
    msg = str(e.value)
    assert fault in msg and path in msg and "\n" not in msg, msg


def test_another_model_is_refused(tmp_path):
    other = dict(TINY, hidden_size=128)
    path = write(tmp_path, table(config=other))
    load_table(path)  # without a model to compare, the table itself is valid
    with pytest.raises(ScaleTableError, match=r"calibrated for model 'h3_tiny' \(config hash [0-9a-f]{16}\), not this "
                                              r"model"):
        load_table(path, model_config=TINY)


def test_hand_edit_accepted_without_values_hash(tmp_path):
    t = table()
    t["linears"]["transformer_blocks.0.ff.net.2"] = 5.0
    del t["provenance"]["values_sha256"]
    assert linear_amax(load_table(write(tmp_path, t)), "transformer_blocks.0.ff.net.2") == 5.0


def test_version_one_still_reads(tmp_path):
    path = write(tmp_path, {"default": {"q": 1, "k": 2, "v": 3}})
    t = load_table(path, model_config=TINY)  # no provenance: nothing to compare
    assert t.version == 1 and t.linears == {} and load(path) == {"default": (1.0, 2.0, 3.0)}
    assert not has_linears(path)
    with pytest.raises(ScaleTableError, match="a version-1 table has no linears"):
        linear_amax(t, "transformer_blocks.0.ff.net.2")


def test_config_hash_matches_yaml_and_model_config():
    """The YAML's diffusers_config and an instantiated model's `config` (tuples, private keys, another
    num_layers for a truncated stack) hash alike; any architectural key changes it."""
    model_config = dict(TINY, patch_size=(1, 2, 2), num_layers=1, _class_name="MiniMaxH3Transformer3DModel",
                        _diffusers_version="0.42.1", rope_theta=10000)
    assert config_hash(model_config) == config_hash(TINY)
    assert config_hash(dict(TINY, num_attention_heads=8)) != config_hash(TINY)
    assert config_hash(dict(TINY, norm_eps=1e-6)) != config_hash(TINY)


# ------------------------------------------------------------------------------ the planner reads it

TINY_PLAN = ("hardware=sm90", "recipe=fp8", "model=h3_tiny", "recipe.fp8_scale_mode=static")


def test_plan_uses_the_table_statically(plan, tmp_path):
    path = write(tmp_path, table())
    p = plan(*TINY_PLAN, f"recipe.fp8_static_table={path}")
    s = p.decision("fp8_scales")
    assert s.setting == "static" and s.param("scale_table") == path
    g = p.decision("gemm_quant").to_dict()["params"]
    assert (g["input_scales"], g["scale_table"], g["scale_margin"]) == ("static", path, 1.0)


def test_plan_keeps_dynamic_linears_with_a_v1_table(plan, tmp_path):
    path = write(tmp_path, {"default": {"q": 1, "k": 2, "v": 3}})
    p = plan(*TINY_PLAN, f"recipe.fp8_static_table={path}")
    assert p.decision("fp8_scales").setting == "static"
    assert "input_scales" not in p.decision("gemm_quant").to_dict()["params"]


def test_plan_refuses_a_table_of_another_model(plan, tmp_path):
    from h3plan.errors import H3PlanError

    path = write(tmp_path, table())
    with pytest.raises(H3PlanError) as e:
        plan("hardware=sm90", "recipe=fp8", "model=h3", "recipe.fp8_scale_mode=static",
             f"recipe.fp8_static_table={path}")
    assert "recipe.fp8_static_table" in str(e.value) and "not this model" in str(e.value) and "\n" not in str(e.value)


def test_plan_refuses_a_rejected_table(plan, tmp_path):
    from h3plan.errors import H3PlanError

    path = write(tmp_path, table(passed=False))
    with pytest.raises(H3PlanError, match="rejected by its held-out check"):
        plan(*TINY_PLAN, f"recipe.fp8_static_table={path}")

