"""The device left clean: `install(pipe, plan, device="cuda")` of a pipeline resting on the host,
diffusers' own `pipe(...)` call, then `uninstall(pipe)`: torch.cuda.memory_allocated() comes back to its value
before install. Real width cut to two transformer layers, the released VAE, a 256x448x124 request, one H200.

What may stay, by design, and is subtracted by name: the cuDNN FP8 attention's constant scalars
(h3plan/runtime/attention/cudnn.py `_CONST`: one (1, 1, 1, 1) fp32 tensor per value and device, a 512-byte block each,
shared by every installed model and read by captured graphs), and torch's own per-stream cuBLAS workspaces, which
any GEMM makes (diffusers' eager call too): both measurements are taken after torch._C._cuda_clearCublasWorkspaces().
On failure the message lists the CUDA tensors gc still finds, with what holds them.
"""

import gc
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def _settled() -> int:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    return torch.cuda.memory_allocated()


def _live_cuda() -> list[str]:
    import torch

    gc.collect()
    out = []
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor) and o.is_cuda:
            holders = [type(r).__name__ + (f"{sorted(r)[:6]}" if isinstance(r, dict) else "")
                       for r in gc.get_referrers(o)
                       if not isinstance(r, list)][:3]
            out.append(f"{tuple(o.shape)} {o.dtype} {o.numel() * o.element_size() / 2**20:.1f} MiB held by {holders}")
    return out


def _scheduler_bytes(pipe) -> int:
    """The device tensors diffusers' schedulers keep from the last call (timesteps, sigmas: made on the execution device
    by set_timesteps, replaced by the next call; a pipeline moved to the GPU by its user keeps the same), in allocator
    blocks of 512 bytes. The plan made none of them."""
    import torch

    seen, total = set(), 0
    for name in ("scheduler", "audio_scheduler"):
        for t in vars(getattr(pipe, name, None) or object()).values():
            if isinstance(t, torch.Tensor) and t.is_cuda and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total += -(-t.untyped_storage().nbytes() // 512) * 512
    return total


@pytest.mark.parametrize("recipe", ["bf16", "fp8"])
def test_uninstall_returns_the_device_memory(recipe):
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    import torch
    from omegaconf import OmegaConf

    import h3plan
    from h3plan.actions.pipeline_build import build_pipeline, prompt_inputs
    from h3plan.runtime.attention import cudnn

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    cfg = lambda name: OmegaConf.load(ROOT / name).diffusers_config  # noqa: E731
    pipe = build_pipeline(cfg("conf/model/h3.yaml"), cfg("conf/vae/h3.yaml"), layers=2)  # on the host, as loaded
    plan = h3plan.resolve_config(hardware="sm90", recipe=recipe, **{"model.diffusers_config.num_layers": 2,
                                                                    "video.height": 256, "video.width": 448})
    consts = len(cudnn._CONST)
    h3plan.reset_counters()
    before = _settled()
    report = h3plan.install(pipe, plan, device="cuda")
    out = pipe(**prompt_inputs(pipe, 110, seed=0), height=256, width=448, num_frames=124, num_inference_steps=2,
               output_type="pt", output="videos", generator=torch.Generator("cpu").manual_seed(0))
    assert h3plan.counters().get("vae_graphs.fused", 0) > 0  # the graphs were captured and replayed
    del out, report
    assert h3plan.uninstall(pipe)
    assert {t.device.type for n in ("transformer", "vae", "audio_vae")
            for t in getattr(pipe, n).state_dict().values()} == {"cpu"}
    after = _settled()
    allowed = 512 * sum(1 for value, dev in list(cudnn._CONST)[consts:] if torch.device(dev).type == "cuda")
    allowed += _scheduler_bytes(pipe)
    print(f"[gpu] device clean {recipe}: {after - before:+d} B; allocated before install {before / 2**20:.1f} MiB, "
          f"after uninstall {after / 2**20:.1f} MiB (cuDNN constants and the schedulers' own state {allowed} B); "
          f"reserved {torch.cuda.memory_reserved() / 2**20:.1f} MiB")
    assert after - before <= allowed, "\n".join([f"{(after - before) / 2**20:.1f} MiB left on the device:",
                                                  *_live_cuda()])


# Without clearing cuBLAS's workspaces before measuring: a workspace made for a stream of the plan's own (the VAE
# graphs' warm-up and capture streams) must not outlive uninstall either. The caller's own workspace is made
# before the baseline.
@pytest.mark.parametrize("vae", ["fp32", "fp16"])
def test_uninstall_leaves_the_device_as_it_found_it(vae):
    pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")
    import torch
    from omegaconf import OmegaConf

    import h3plan
    from h3plan.actions.pipeline_build import build_pipeline, prompt_inputs
    from h3plan.planning.config import compose

    c = compose([])
    pipe = build_pipeline(OmegaConf.to_container(c.model.diffusers_config),
                          OmegaConf.to_container(c.vae.diffusers_config),
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
    print(f"vae={vae}: {used / 2**20:.0f} MiB while installed, {left / 2**20:.2f} MiB left after uninstall", flush=True)
    assert left < 1 * 2**20, (left / 2**20, live)
    assert all(t.device.type == "cpu" for t in pipe.transformer.state_dict().values())
