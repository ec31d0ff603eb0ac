"""What an install leaves behind after uninstall, on the CPU: no tensor the plan made outlives
uninstall (gc: every tensor alive after install, a forward and uninstall was alive before, or is the forward's
output), every attribute the install added to a module is gone, and a pipeline installed with device= rests on
the host again, the tensors its call left in plain module attributes included (the audio VAE's weight_norm
`weight`). On the H200 the same is checked against torch.cuda.memory_allocated(): tests/gpu/test_device_clean_gpu.py.
"""

import gc

import pytest
import torch
from install_helpers import tiny_inputs, tiny_model

import h3plan


def _tensors() -> dict[int, torch.Tensor]:
    gc.collect()
    return {id(o): o for o in gc.get_objects() if isinstance(o, torch.Tensor)}


def _attributes(model) -> dict[str, set[str]]:
    return {name: set(m.__dict__) for name, m in model.named_modules()}


@pytest.mark.slow  # two installs and a forward of the fused kernels in the Triton interpreter, per recipe (~1 min)
@pytest.mark.parametrize("recipe", ["bf16", "fp8"])
def test_no_tensor_the_plan_made_outlives_uninstall(recipe):
    model, inputs = tiny_model(), tiny_inputs()
    plan = h3plan.resolve_config(model="h3_tiny", recipe=recipe,
                                 **{"levers.attention": "sdpa", "levers.adaln_table": "on"})
    with torch.no_grad():
        model(**inputs)  # diffusers' own lazily made tensors, before the baseline
        other = tiny_model(seed=1)  # the modules install imports make their constants (diffusers' too) once
        h3plan.install(other, plan)
        h3plan.uninstall(other)
    attrs, before = _attributes(model), _tensors()
    report = h3plan.install(model, plan, num_inference_steps=[4])
    assert "adaln_table" in report.swapped_levers() and (recipe == "bf16" or "gemm_quant" in report.swapped_levers())
    with torch.no_grad():
        out = model(**inputs)
    assert h3plan.uninstall(model)
    del report
    kept = {id(out.sample), id(out.audio_sample)}
    left = [(tuple(t.shape), t.dtype) for k, t in _tensors().items() if k not in before and k not in kept]
    assert left == [], f"tensors made by the plan alive after uninstall: {left}"
    assert _attributes(model) == attrs


def test_pipeline_installed_with_device_rests_on_the_host_after_uninstall():
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    from omegaconf import OmegaConf

    from h3plan.actions.pipeline_build import build_pipeline
    from install_helpers import ROOT, lazy_device

    lazy_device()
    cfg = lambda name: OmegaConf.load(ROOT / name).diffusers_config  # noqa: E731
    pipe = build_pipeline(cfg("conf/model/h3_tiny.yaml"), cfg("conf/vae/h3_tiny_pipe.yaml"), vae_name="h3_tiny_pipe")
    pipe.audio_vae.user_cache = torch.ones(2, device="lazy")  # the user's, on the device before install: stays there
    plan = h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe", **{"levers.attention": "sdpa"})
    h3plan.install(pipe, plan, device="lazy")
    hooked = [m for m in pipe.audio_vae.modules() if hasattr(m, "weight_g")]
    assert hooked, "diffusers' audio VAE no longer uses torch.nn.utils.weight_norm: this test needs another attribute"
    for m in hooked:  # what a forward does first: weight_norm's pre-hook recomputes `weight` on the device
        for hook in list(m._forward_pre_hooks.values()):
            hook(m, None)
    assert {m.weight.device.type for m in hooked} == {"lazy"}
    assert h3plan.uninstall(pipe)
    for name in ("transformer", "vae", "audio_vae"):
        comp = getattr(pipe, name)
        on = {(f"{n}.{k}", t.device.type) for n, m in comp.named_modules() for k, t in m.__dict__.items()
              if isinstance(t, torch.Tensor) and t.device.type != "cpu"}
        assert on == ({(".user_cache", "lazy")} if name == "audio_vae" else set()), (name, on)
        assert {t.device.type for t in comp.state_dict().values()} == {"cpu"}
