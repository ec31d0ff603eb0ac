"""Which action runs need a GPU, and their refusals on a machine without one, decided from the config before any
action imports torch (seconds of imports, tens under load, for a one-line refusal).

`no_gpu_here()` answers without torch: no CUDA GPU can be here when CUDA_VISIBLE_DEVICES hides every device ("" or
-1), or when there is neither an NVIDIA driver (/proc/driver/nvidia), a GPU device node (/dev/nvidia*, WSL's /dev/dxg,
ROCm's /dev/kfd) nor nvidia-smi on PATH. Anything else may be a GPU: the action imports torch and decides itself.
`refusal(action, cfg, plan)` is the line an action would refuse with on such a machine, where the config alone
decides it (a real-width model, action=tune); None where the config runs on a CPU (the small forms) or something else
decides. The actions refuse with the same functions after torch says there is no GPU. Torch-free.
"""

from __future__ import annotations

import glob
import os
import shutil
from typing import Any

from h3plan.facts import scale_table
from h3plan.levers import SPECS

CPU_MAX_HIDDEN = 1024  # wider is real width: GPU only
VERIFY_SMOKE = "python -m h3plan action=verify model=h3_tiny"
CALIBRATE_SMOKE = "python -m h3plan action=calibrate recipe=fp8 model=h3_tiny"  # the form that runs on a CPU
BENCH_SMOKE = ("python -m h3plan action=bench model=h3_tiny 'bench.seq_lens=[64]' 'bench.blocks=[1]' bench.iters=1 "
               "bench.warmup=0")
# tests/bench/test_pipeline_bench_smoke.py runs it: the tiny pipeline on a 32x32 canvas, one round, dynamo without
# Inductor's C++ compiles
PIPELINE_SMOKE = ("python -m h3plan action=bench bench.target=pipeline model=h3_tiny vae=h3_tiny_pipe video.height=32 "
                  "video.width=32 bench.pipeline.rounds=1 bench.pipeline.warmup=0 bench.pipeline.compile_backend=eager")
# A lever judged by its own budget (its Spec's recipe_section), calibrated on the CPU: the tiny pipeline on a 32x32
# canvas, a few steps, with diffusers' own ops (Triton's interpreter runs the fused kernels for minutes a call); seconds
# each (tests/install/test_calibrate_*.py run the same settings). Per recipe section: its budget and schedule.
_TINY_EAGER = ("model=h3_tiny vae=h3_tiny_pipe video.height=32 video.width=32 levers.vae_graphs=off "
               "levers.vae_ops=eager levers.qk_norm_rope=eager levers.modulation=eager levers.gated_residual=off "
               "levers.swiglu=off 'calibrate.seeds=[0]'")
_OWN_BUDGET_TINY = {
    "cache": "levers.attention=sdpa video.num_inference_steps=6 'recipe.cache={psnr_db_min:28,ssim_min:0.93,warmup:1,"
             "final:1}'",
    "sparse": "video.num_inference_steps=4 'hardware.fa4.block_sparse=[32,32]' 'recipe.sparse={ssim_min:0.5,"
              "dense_forwards:1}'",
}
OWN_BUDGET_SMOKE = {name: f"python -m h3plan action=calibrate calibrate.target={name} {_TINY_EAGER} "
                          f"{_OWN_BUDGET_TINY[spec.recipe_section]}"
                    for name, spec in SPECS.items() if spec.recipe_section}
TUNE_REFUSAL = ("action=tune measures a GPU and this machine has none (torch.cuda.is_available() is False): plans here "
                "use the packaged facts (python -m h3plan hardware=sm90 ...)")
DEVICE_NODES = ("/proc/driver/nvidia", "/dev/nvidia[0-9]*", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def no_gpu_here() -> bool:
    """True where no CUDA GPU can be here, known without importing torch (module docstring)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return True
    if any(glob.glob(p) for p in DEVICE_NODES):
        return False
    return shutil.which("nvidia-smi") is None


def verify_too_wide() -> str:
    return f"verify on the CPU needs a small model: pass model=h3_tiny (real width needs a GPU): {VERIFY_SMOKE}"


def calibrate_too_wide(target: str = scale_table.NAME) -> str:
    if target in OWN_BUDGET_SMOKE:
        return (f"calibrate on the CPU needs a small model (real width needs a GPU); the form that runs here in "
                f"seconds: {OWN_BUDGET_SMOKE[target]}")
    return f"calibrate on the CPU needs a small model: pass model=h3_tiny (real width needs a GPU): {CALIBRATE_SMOKE}"


def bench_too_wide(hidden: int) -> str:
    return (f"action=bench on the CPU needs a small model (hidden {hidden:,} would run for hours): the smoke form is "
            f"{BENCH_SMOKE}; real width needs a GPU")


def pipeline_too_wide(hidden: int, vae_width: int) -> str:
    return (f"bench.target=pipeline at real width (hidden {hidden}, VAE decoder width {vae_width}) needs a CUDA GPU; "
            f"on the CPU run the tiny smoke form: {PIPELINE_SMOKE}")


def vae_width(vae_config) -> int:
    """The VAE decoder's width (heads x head dim), what bench.target=pipeline holds to CPU_MAX_HIDDEN."""
    return int(vae_config["decoder_num_attention_heads"]) * int(vae_config["decoder_attention_head_dim"])


def _get(node, key: str, default: Any = None) -> Any:
    value = node.get(key, default) if hasattr(node, "get") else getattr(node, key, default)
    value = default if value is None else value
    return getattr(value, "value", value)  # an enum member (a structured config's) as its value


def refusal(action: str, cfg, plan) -> str | None:
    """The one line `action` (cfg.action's name) refuses with on a machine without a GPU, where the config decides it;
    else None."""
    hidden = int(plan.get("model")["diffusers_config"]["hidden_size"])
    if action == "tune":
        return TUNE_REFUSAL
    if action == "verify":
        device = str(_get(_get(cfg, "verify", {}), "device", "auto"))
        return verify_too_wide() if device in ("auto", "cpu") and hidden > CPU_MAX_HIDDEN else None
    if action == "calibrate":
        c = _get(cfg, "calibrate", {})
        target, device = str(_get(c, "target", scale_table.NAME)), str(_get(c, "device", "auto"))
        recipe = plan.get("recipe")
        section = SPECS[target].recipe_section if target in SPECS else None
        budget = recipe.get(section or "budget") or {}
        keys = ("psnr_db_min", "ssim_min") if section else ("psnr_db_min",)
        if all(budget.get(k) is None for k in keys) or device not in ("auto", "cpu"):  # the action's own line first
            return None
        return calibrate_too_wide(target) if hidden > CPU_MAX_HIDDEN else None
    if action == "bench" and int(plan.get("parallel").get("ulysses", 1)) == 1:
        if str(_get(_get(cfg, "bench", {}), "target", "block")) == "pipeline":
            width = vae_width(plan.get("vae")["diffusers_config"])
            return pipeline_too_wide(hidden, width) if max(hidden, width) > CPU_MAX_HIDDEN else None
        return bench_too_wide(hidden) if hidden > CPU_MAX_HIDDEN else None
    return None


__all__ = ["CPU_MAX_HIDDEN", "no_gpu_here", "refusal"]
