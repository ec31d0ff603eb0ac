"""diffusers' own transformer LoRA scenarios (its LoraTesterMixin, run on MiniMaxH3Transformer3DModel by
tests/models/transformers/test_models_transformer_minimax_h3.py) with a plan installed in every model, as a user would
install one: `h3plan.install(model, h3plan.plan_for(model, hardware="sm90"))` (the bf16 plan: attention processor,
block forwards, fused kernels behind their guards). Each scenario is restated here in h3plan's own words on a float32
tiny model as diffusers' tests build theirs: save / unload / load round trips (LoRA and DoRA), adapter metadata,
low_cpu_mem_usage, a fuse of non-finite weights, lora_B biases, rank and alpha patterns, the missing / unexpected /
absent key warnings, layerwise casting. tests/diffusers_lora_suite.py runs diffusers' test file itself the same way.
"""

import logging

import pytest
import torch
from install_helpers import TINY

pytest.importorskip("peft", reason="diffusers' LoRA loading needs peft (the test extra)")

import h3plan  # noqa: E402
from h3plan.actions.inputs import build_model, packed_inputs  # noqa: E402
from h3plan.install.lora import peft_layers  # noqa: E402
from peft import LoraConfig  # noqa: E402

ATTENTION = ["to_q", "to_k", "to_v", "to_out.0"]  # what the mixin's adapters target


def _model(plan=True, seed=0):
    model = build_model(TINY, dtype=torch.float32, seed=seed)
    if plan:
        report = h3plan.install(model, h3plan.plan_for(model, hardware="sm90"))
        assert {"attention", "modulation", "swiglu"} <= set(report.swapped_levers())
    return model


def _out(model):
    with torch.no_grad():
        return model(**packed_inputs(TINY, 48, seed=0)).sample


def _config(**kw):
    return LoraConfig(**{"r": 4, "lora_alpha": 4, "target_modules": ATTENTION, "init_lora_weights": False, **kw})


def _weights(tmp_path):
    from safetensors.torch import load_file

    return load_file(str(tmp_path / "pytorch_lora_weights.safetensors"))


class _Log(logging.Handler):
    def __init__(self, name):
        super().__init__(logging.WARNING)
        self.name_, self.lines = name, []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def __enter__(self):
        logging.getLogger(self.name_).addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger(self.name_).removeHandler(self)


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
def test_save_unload_load_round_trip(tmp_path, dora):
    from peft.utils import get_peft_model_state_dict

    model, stock = _model(), _model(plan=False)
    base = _out(model)
    assert torch.equal(base, _out(stock))  # float32: every kernel's guard routes to diffusers' code
    for m in (model, stock):
        torch.manual_seed(1)
        m.add_adapter(_config(use_dora=dora))
    with_lora = _out(model)
    assert not torch.allclose(with_lora, base, atol=1e-4) and torch.equal(with_lora, _out(stock))
    model.save_lora_adapter(tmp_path)
    saved = _weights(tmp_path)
    model.unload_lora()
    assert not peft_layers(model) and torch.equal(_out(model), base)
    model.load_lora_adapter(str(tmp_path), prefix=None, use_safetensors=True)
    loaded = get_peft_model_state_dict(model, adapter_name="default_0")
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    assert torch.equal(_out(model), with_lora)


def test_adapter_name_and_metadata(tmp_path):
    import json

    from safetensors.torch import save_file

    from diffusers.loaders.lora_base import LORA_ADAPTER_METADATA_KEY

    model = _model()
    config = _config()
    model.add_adapter(config)
    with pytest.raises(ValueError, match="Adapter name foo not found in the model"):
        model.save_lora_adapter(tmp_path, adapter_name="foo")
    meta = model.peft_config["default"].to_dict()
    model.save_lora_adapter(tmp_path)
    model.unload_lora()
    model.load_lora_adapter(str(tmp_path), prefix=None, use_safetensors=True)
    assert model.peft_config["default_0"].to_dict() == meta
    bad = {k: (list(v) if isinstance(v, set) else v) for k, v in config.to_dict().items()}
    bad.update(foo=1, bar=2)
    save_file(_weights(tmp_path), str(tmp_path / "pytorch_lora_weights.safetensors"),
              metadata={"format": "pt", LORA_ADAPTER_METADATA_KEY: json.dumps(bad, sort_keys=True)})
    model.unload_lora()
    with pytest.raises(TypeError, match="`LoraConfig` class could not be instantiated"):
        model.load_lora_adapter(str(tmp_path), prefix=None, use_safetensors=True)


def test_low_cpu_mem_usage_load(tmp_path):
    model = _model()
    model.add_adapter(_config())
    want = _out(model)
    model.save_lora_adapter(tmp_path)
    model.unload_lora()
    model.load_lora_adapter(str(tmp_path), prefix=None, use_safetensors=True, low_cpu_mem_usage=True)
    assert peft_layers(model) and all(p.device.type != "meta" for p in model.parameters())
    assert torch.equal(_out(model), want)


def test_fuse_of_non_finite_weights():
    from peft.tuners.tuners_utils import BaseTunerLayer

    model = _model()
    model.add_adapter(_config(), adapter_name="adapter-1")
    for m in model.modules():
        if isinstance(m, BaseTunerLayer) and hasattr(m, "lora_A"):
            m.lora_A["adapter-1"].weight.data += float("inf")
    with pytest.raises(ValueError):
        model.fuse_lora(safe_fusing=True)
    model.fuse_lora(safe_fusing=False)
    assert torch.isnan(_out(model)).all()


def test_lora_b_bias_changes_the_output(tmp_path):
    model = _model()
    base = _out(model)
    kw = dict(r=4, lora_alpha=4, target_modules=ATTENTION, init_lora_weights=False)
    model.add_adapter(LoraConfig(**kw, lora_bias=True), adapter_name="adapter-1")
    with_bias = _out(model)
    model.save_lora_adapter(tmp_path, adapter_name="adapter-1")
    model.delete_adapters("adapter-1")
    sd = {k: v for k, v in _weights(tmp_path).items() if not k.endswith("lora_B.bias")}
    model.load_lora_adapter(sd, prefix=None, adapter_name="adapter-1", metadata={**kw, "lora_bias": False})
    without = _out(model)
    for a, b in ((base, without), (base, with_bias), (without, with_bias)):
        assert not torch.allclose(a, b, atol=1e-3)


def test_rank_and_alpha_patterns():
    model = _model()
    base = _out(model)
    outs = []
    target = "transformer_blocks.0.attn.to_k"
    for extra in ({}, {"rank_pattern": {target: 8}}, {"alpha_pattern": {target: 8}}):
        torch.manual_seed(2)
        model.add_adapter(_config(**extra), adapter_name="adapter-1")
        for key, pattern in extra.items():
            assert getattr(model.peft_config["adapter-1"], key) == pattern
        outs.append(_out(model))
        model.delete_adapters("adapter-1")
    assert not torch.allclose(outs[0], base, atol=1e-3)
    assert not torch.allclose(outs[1], outs[0], atol=1e-3) and not torch.allclose(outs[2], outs[0], atol=1e-3)


@pytest.mark.parametrize("key", ["missing", "unexpected"])
def test_missing_and_unexpected_keys_warn(tmp_path, key):
    model = _model()
    model.add_adapter(_config())
    model.save_lora_adapter(tmp_path)
    sd = _weights(tmp_path)
    model.unload_lora()
    first = next(k for k in sd if "lora_A" in k)
    if key == "missing":
        del sd[first]
        expect = first
    else:
        sd[first + ".diffusers_cat"] = torch.tensor(1.0)
        expect = ".diffusers_cat"
    with _Log("diffusers.utils.peft_utils") as log:
        model.load_lora_adapter(sd, prefix=None)
    assert any(expect in line.replace("default_0.", "") for line in log.lines), log.lines


def test_no_lora_keys_warn_and_load_nothing():
    model = _model()
    with _Log("diffusers.loaders.peft") as log:
        model.load_lora_adapter({"lora_foo": torch.tensor(2.0), "lora_bar": torch.tensor(3.0)}, prefix="transformer")
    assert any(line.startswith("No LoRA keys associated to MiniMaxH3Transformer3DModel") for line in log.lines)
    assert not peft_layers(model)


@pytest.mark.parametrize("compute", [torch.float32, torch.bfloat16])
def test_layerwise_casting_with_a_lora(compute):
    model = build_model(TINY, dtype=compute, seed=0)
    h3plan.install(model, h3plan.plan_for(model, hardware="sm90"))
    model.add_adapter(_config())
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=compute)
    x = {k: (v.to(compute) if torch.is_floating_point(v) and k != "timestep" else v)
         for k, v in packed_inputs(TINY, 48, seed=0).items()}
    with torch.no_grad():
        out = model(**x).sample
    assert torch.isfinite(out).all()
