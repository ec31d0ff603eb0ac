"""h3plan.plan_for / install(model, recipe=...): plans from what the user has, on the CPU.

Widths from a model, a pipeline and a checkpoint folder (the packaged option's plan where the config is one
of them, the read widths otherwise); hardware from a faked CUDA device (compute capability -> group, total
memory -> hardware.device.memory_gb); one-line errors for what cannot be read or planned.
"""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from install_helpers import ROOT, TINY, tiny_model
from omegaconf import OmegaConf

import h3plan
from h3plan.facts import hardware as hw
from h3plan.errors import InstallError, UsageError

OTHER = dict(TINY, num_attention_heads=2, attention_head_dim=48, ffn_dim=128)  # no packaged option has these widths


def _vae_cfg():
    return OmegaConf.to_container(OmegaConf.load(ROOT / "conf/vae/h3_tiny_pipe.yaml").diffusers_config)


@pytest.mark.slow  # builds and installs a model at packaged widths (~1.3 s)
def test_a_model_with_packaged_widths_gets_the_packaged_plan():
    plan = h3plan.plan_for(tiny_model(), hardware="sm90")
    # a transformer alone: the packaged plan sized for what it holds (memory.holds)
    assert plan == h3plan.resolve_config(model="h3_tiny", **{"memory.holds": "transformer"})
    # any object holding the components: a ref2va pipeline carries its transformer as transformer_ref
    assert h3plan.plan_for(SimpleNamespace(transformer=None, transformer_ref=tiny_model()), hardware="sm90") == plan
    assert h3plan.plan_for(tiny_model(), "fp8", "u2", hardware="sm100") == h3plan.resolve_config(
        model="h3_tiny", recipe="fp8", parallel="u2", hardware="sm100", **{"memory.holds": "transformer"})


@pytest.mark.slow  # installs and runs a model of other widths (~1 s)
def test_other_widths_are_read_from_the_model_and_install():
    from h3plan.actions.inputs import build_model

    model = build_model(OTHER)
    plan = h3plan.plan_for(model, hardware="sm90", **{"levers.attention": "sdpa"})
    m = plan.get("model")
    assert m["name"] == "MiniMaxH3Transformer3DModel" and m["source"] == "read from MiniMaxH3Transformer3DModel.config"
    assert m["diffusers_config"] == {**OTHER, "patch_size": list(OTHER["patch_size"])}
    assert plan.decision("attention").setting == "sdpa"
    with pytest.raises(InstallError) as e:  # a hand-picked option of other widths names the one-liner
        h3plan.install(model, h3plan.resolve_config(model="h3_tiny"))
    assert "num_attention_heads 4 (model: 2)" in str(e.value) and "h3plan.plan_for(model, recipe=..." in str(e.value)
    report = h3plan.install(model, recipe="bf16", hardware="sm90", overrides={"levers.attention": "sdpa"})
    assert h3plan.installed_plan(model) == plan and "attention" in report.swapped_levers()
    assert h3plan.uninstall(model)


@pytest.fixture(scope="module")
def pipe():
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    from h3plan.actions.pipeline_build import build_pipeline

    return build_pipeline(TINY, _vae_cfg(), vae_name="h3_tiny_pipe")


def test_plan_for_a_pipeline_reads_the_transformer_and_the_vae(pipe):
    assert h3plan.plan_for(pipe, hardware="sm90") == h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe")
    with pytest.raises(UsageError, match=r"reads vae.diffusers_config from MiniMaxH3ModularPipeline.vae.config; drop "
                                         r"vae=h3"):
        h3plan.plan_for(pipe, hardware="sm90", vae="h3")


def test_install_a_pipeline_with_a_recipe_round_trip(pipe):
    from h3plan.install.pipeline import installed_pipeline_plan

    expected = h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe", recipe="fp8")
    report = h3plan.install(pipe, recipe="fp8", hardware="sm90")
    try:
        assert list(report.reports) == ["transformer", "vae"] and "gemm_quant" in report["transformer"].swapped_levers()
        assert installed_pipeline_plan(pipe) == {"transformer": expected, "vae": expected}
        with pytest.raises(InstallError, match=r"install got a plan and recipe=: pass the plan, or recipe= for "
                                               r"h3plan.plan_for"):
            h3plan.install(pipe, expected, recipe="fp8")
    finally:
        assert h3plan.uninstall(pipe)
    assert all(p is None for p in installed_pipeline_plan(pipe).values())


def _save(tmp_path, transformer=None, vae=None):
    if transformer is not None:
        transformer.save_pretrained(tmp_path / "transformer")
    if vae is not None:
        vae.save_pretrained(tmp_path / "vae")
    return tmp_path


@pytest.mark.slow  # saves and loads a checkpoint folder (~3 s)
def test_plan_for_a_checkpoint_folder(tmp_path):
    from h3plan.actions.pipeline_build import build_vae

    folder = _save(tmp_path, tiny_model(), build_vae(_vae_cfg(), seed=1))
    plan = h3plan.plan_for(folder, hardware="sm90")
    assert plan.get("model")["path"] == str(folder)
    expected = h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe", **{"model.path": str(folder)})
    assert plan == expected
    for section in ("model", "vae", "hardware", "recipe", "parallel", "levers"):  # model.path is the one difference
        ref = h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe").get(section)
        assert plan.get(section) == (dict(ref, path=str(folder)) if section == "model" else ref), section
    # the transformer's own folder
    own = h3plan.plan_for(folder / "transformer", hardware="sm90")
    assert (own.get("model")["diffusers_config"] == plan.get("model")["diffusers_config"]
            and own.get("vae")["name"] == "h3")


def test_model_path_plans_for_the_checkpoint_widths(tmp_path):
    """model.path=DIR on the command line: the plan takes the folder's widths whatever model= says."""
    from h3plan.actions.inputs import build_model

    folder = _save(tmp_path, build_model(OTHER))
    plan = h3plan.resolve_config(**{"model.path": str(folder)})  # model=h3 by default
    m = plan.get("model")
    assert m["name"] == tmp_path.name and m["diffusers_config"]["num_attention_heads"] == 2
    assert m["source"] == f"read from {folder / 'transformer' / 'config.json'}"


def _write(folder, data):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(data if isinstance(data, str) else json.dumps(data))


def test_a_folder_is_read_without_torch(tmp_path):
    _write(tmp_path / "ckpt" / "transformer", {"_class_name": "MiniMaxH3Transformer3DModel", **TINY})
    code = ("import sys, h3plan; p = h3plan.plan_for(sys.argv[1], hardware='sm90'); "
            "assert 'torch' not in sys.modules, 'torch imported'; print(p.get('model')['name'])")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ckpt")], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "h3_tiny", r.stderr[-2000:]


@pytest.mark.parametrize("layout, message", [
    ({}, "no config.json, transformer/config.json or vae/config.json: not a diffusers checkpoint folder of MiniMax-H3"),
    ({"transformer": "{bad"}, "transformer/config.json: malformed JSON at line 1"),
    ({"": {"_class_name": "UNet2DModel"}}, "_class_name 'UNet2DModel' is not one h3plan plans for"),
    ({"transformer": {"_class_name": "AutoencoderKLMiniMaxH3"}}, "a AutoencoderKLMiniMaxH3 in the transformer/ folder"),
])
def test_unreadable_folders_are_one_line(tmp_path, layout, message):
    for sub, data in layout.items():
        _write(tmp_path / sub if sub else tmp_path, data)
    with pytest.raises(UsageError) as e:
        h3plan.plan_for(tmp_path, hardware="sm90")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_other_objects_and_missing_folders_are_one_line(tmp_path):
    with pytest.raises(UsageError, match=r"plan_for reads a MiniMaxH3Transformer3DModel, .* got builtins.object$"):
        h3plan.plan_for(object(), hardware="sm90")
    with pytest.raises(UsageError, match=r"pass the folder itself instead of model.path=/x$"):
        h3plan.plan_for(tiny_model(), hardware="sm90", **{"model.path": "/x"})
    with pytest.raises(UsageError, match=r"reads model.diffusers_config from MiniMaxH3Transformer3DModel.config; drop "
                                         r"model.diffusers_config.hidden_size=64$"):
        h3plan.plan_for(tiny_model(), hardware="sm90", **{"model.diffusers_config.hidden_size": 64})
    with pytest.raises(UsageError, match=r"missing: no such folder"):
        h3plan.plan_for(str(tmp_path / "missing"), hardware="sm90")
    vae_only = tmp_path / "vae_only"
    _write(vae_only / "vae", {"_class_name": "AutoencoderKLMiniMaxH3", **_vae_cfg()})
    with pytest.raises(UsageError, match=r"model.path=.*vae_only: .*is a VAE; point model.path at the transformer"):
        h3plan.resolve_config(**{"model.path": str(vae_only)})


# ---------------------------------------------------------------- the hardware from the device


def _fake_gpu(monkeypatch, cc, total_memory, name="NVIDIA GPU"):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(
        name=name, total_memory=total_memory))


@pytest.mark.parametrize("group", hw.names())
def test_the_compute_capability_picks_the_hardware_group(monkeypatch, group):
    cc = hw.capability(hw.load(group))
    _fake_gpu(monkeypatch, cc, 80_112_000_000, name="NVIDIA H100 80GB HBM3")
    plan = h3plan.plan_for(tiny_model())
    device = plan.get("hardware")["device"]
    assert plan.get("hardware")["name"] == group and device["memory_gb"] == 80.1
    assert device["source"].startswith("memory_gb: torch.cuda.get_device_properties(0).total_memory of NVIDIA H100")
    ref = h3plan.resolve_config(model="h3_tiny", hardware=group, **{"hardware.device.memory_gb": 80.1})
    assert plan.decisions == ref.decisions
    # the user's own number wins over the device's
    mine = h3plan.plan_for(tiny_model(), **{"hardware.device.memory_gb": 96})
    assert (mine.get("hardware")["device"]["memory_gb"] == 96
            and "torch.cuda" not in mine.get("hardware")["device"]["source"])


def test_an_unknown_gpu_or_none_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError) as e:
        h3plan.plan_for(tiny_model())
    assert str(e.value) == ("h3plan.plan_for reads the hardware from a CUDA device and this machine has none; pass "
                            "hardware=<group> to plan without one (sm100 10.0, sm103 10.3, sm107 10.7, sm90 9.0)")
    _fake_gpu(monkeypatch, (8, 0), 40 * 10**9, name="NVIDIA A100-SXM4-40GB")
    with pytest.raises(UsageError, match=r"^cuda:0 \(NVIDIA A100-SXM4-40GB\) has compute capability 8.0, which no "
                                         r"packaged hardware config describes \(sm100 10.0, .*\); pass "
                                         r"hardware=<group>"):
        h3plan.plan_for(tiny_model())
    assert h3plan.plan_for(tiny_model(), hardware="sm90").get("hardware")["name"] == "sm90"  # no device read
