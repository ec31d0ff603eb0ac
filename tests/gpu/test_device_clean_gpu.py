"""H200: the device left clean. install(pipe, plan, device="cuda") of a pipeline resting on the host, one pipe(...)
call, uninstall(pipe): torch.cuda.memory_allocated() is back at its value before install (issue 30, item 18).

What the plan made on the device and must free: the AdaLN tables, the VAE's CUDA graphs and their pool, cuBLAS's
workspaces of the streams the graphs warmed up and captured on, and the weight that torch's weight_norm derives on the
device during the call (diffusers' audio VAE keeps it as a plain attribute). cuBLAS's workspace for the caller's own
stream is torch's (made at the process's first GEMM, plan or not): the baseline is taken after one GEMM.

    . /tmp/h3site/env.sh && python -m pytest tests/gpu/test_device_clean_gpu.py -m gpu -q -rA -s
"""

import gc

import pytest

pytestmark = pytest.mark.gpu
MiB = 2**20


@pytest.mark.parametrize("vae", ["fp32", "fp16"])
def test_uninstall_leaves_the_device_as_it_found_it(vae):
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    import torch
    from omegaconf import OmegaConf

    import h3plan
    from h3plan.actions.pipeline_build import build_pipeline, prompt_inputs
    from h3plan.planning.config import compose

    c = compose([])
    pipe = build_pipeline(OmegaConf.to_container(c.model.diffusers_config), OmegaConf.to_container(c.vae.diffusers_config),
                          layers=2, device="cpu")
    extra = {"recipe.vae": vae} if vae != "fp32" else {}
    plan = h3plan.resolve_config(hardware="sm90", recipe="bf16", parallel="u1", **extra,
                                 **{"video.height": 256, "video.width": 448, "video.seconds": 5})
    assert plan.decision("vae_graphs").setting == "on" and plan.decision("adaln_table").setting == "on"
    torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda")  # the caller's cuBLAS workspace (torch's)
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    h3plan.install(pipe, plan, device="cuda")
    prompt = prompt_inputs(pipe, 110)
    with torch.no_grad():
        out = pipe(**prompt, height=256, width=448, num_frames=124, num_inference_steps=3, output_type="pt",
                   output="videos")
    torch.cuda.synchronize()
    used = torch.cuda.memory_allocated() - base
    assert h3plan.counters().get("vae_graphs.fused", 0) > 0  # the graphs (and their streams) really ran
    del out, prompt
    h3plan.uninstall(pipe)
    gc.collect()
    torch.cuda.synchronize()
    left = torch.cuda.memory_allocated() - base
    live = sorted(((t.untyped_storage().nbytes(), tuple(t.shape), t.dtype) for t in gc.get_objects()
                   if isinstance(t, torch.Tensor) and t.is_cuda), reverse=True)[:8]
    print(f"vae={vae}: {used / MiB:.0f} MiB while installed, {left / MiB:.2f} MiB left after uninstall", flush=True)
    assert left < 1 * MiB, (left / MiB, live)
    assert all(t.device.type == "cpu" for t in pipe.transformer.state_dict().values())
