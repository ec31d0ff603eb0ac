"""The call users make, on the tiny MiniMaxH3ModularPipeline (CPU, Triton interpreter): `h3plan.install(pipe, plan)`
then diffusers' own `pipe(...)`, `pipe.blocks` sub-blocks and a direct `vae.decode(...)`, for each dtype a user may
load the VAE in, with and without an autocast of their own.

Contract: rtol=0, atol=0 against the same call without the plan, the plan's VAE precision reproduced by the cast
`from_pretrained(torch_dtype=...)` makes, and the same attention backend (sdpa, diffusers' own call). The counters
prove the planned path ran with no per-call fallback: every VAE op the installer kept is `.fused` on every block call.
CPU-only reference orders (RMSNorm's CUDA reduction, numpy's exp) as in test_install_vae.py.
"""

import pytest
import torch

pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")

import h3plan  # noqa: E402
from h3plan.install import counters, install, reset_counters, uninstall  # noqa: E402
from test_install_vae import cast, interpreter_order  # noqa: E402,F401 (autouse: CPU reference orders)
from test_install_pipeline import _cfg  # noqa: E402

pytestmark = pytest.mark.slow
LOAD = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _pipe(load):
    from h3plan.actions.pipeline_build import build_pipeline

    return build_pipeline(_cfg("conf/model/h3_tiny.yaml"), _cfg("conf/vae/h3_tiny_pipe.yaml"), vae_name="h3_tiny_pipe",
                          layers=1, vae_dtype=LOAD[load])


def _plan(vae):
    over = {"recipe.vae": vae} if vae != "fp32" else {}
    # the transformer's own kernels are the installer tests' business: off here, so the interpreter runs the VAE's
    return h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe", **over,
                                 **{"levers.attention": "sdpa", "levers.vae_ops": "fused", "levers.vae_graphs": "off",
                                    "levers.qk_norm_rope": "eager", "levers.modulation": "eager",
                                    "levers.gated_residual": "off", "levers.swiglu": "off"})


def _call(pipe, autocast):
    from h3plan.actions.pipeline_build import prompt_inputs

    with torch.autocast("cpu", dtype=autocast or torch.float16, enabled=autocast is not None):
        return pipe(**prompt_inputs(pipe, 4, seed=0), height=32, width=32, num_frames=124, num_inference_steps=2,
                    output_type="pt", output="videos", generator=torch.Generator("cpu").manual_seed(0))


def _vae_counts():
    return {k: v for k, v in counters().items() if k.startswith("vae_")}


@pytest.mark.parametrize("load,precision,autocast", [("fp32", "fp32", None), ("fp32", "fp16", None),
                                                     ("fp32", "fp32", torch.float16),
                                                     ("fp16", "fp16", None), ("bf16", "fp16", torch.float16)],
                         ids=["fp32-default", "fp32-cast-fp16", "fp32-user-autocast", "fp16-loaded",
                              "bf16-loaded-autocast"])
def test_pipe_call_takes_the_planned_path_bit_for_bit(load, precision, autocast):
    pipe = _pipe(load)
    ref_pipe = _pipe(load)
    if load == "fp32" and precision != "fp32":
        cast(ref_pipe.vae, LOAD[precision])  # what the plan's vae_precision does at install
    plan = _plan(precision)
    ref = _call(ref_pipe, autocast)
    report = install(pipe, plan)
    blocks = len(pipe.vae.decoder.transformer_blocks)
    reset_counters()
    out = _call(pipe, autocast)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    got = _vae_counts()
    installed = [op for op in ("qk_norm_rope", "swiglu", "scaled_residual")
                 if f"vae_ops.{op}" not in dict(report["vae"].skipped)]
    assert installed and not any(k.endswith(".fallback") for k in got), got  # no per-call fallback
    calls = got["vae_ops.scaled_residual.fused"] // (2 * blocks)  # decoder calls of the decode
    assert calls >= 1 and got == {f"vae_ops.{op}.fused": calls * blocks * (2 if op == "scaled_residual" else 1)
                                  for op in installed}
    fp32 = pipe.vae.dtype == torch.float32  # float32 linears: no fp32 QK-norm kernel (torch reduces in another order)
    assert installed == (["swiglu", "scaled_residual"] if fp32 else ["qk_norm_rope", "swiglu", "scaled_residual"])
    # a sub-block of pipe.blocks and a direct vae.decode take the same path
    from h3plan.actions.pipeline_build import run_block

    z = torch.randn(1, pipe.vae.config.latent_channels, 7, 2, 2, generator=torch.Generator().manual_seed(3))
    for fn in (lambda p: run_block(p, "decode.video", latents=z, output_type="pt").get("videos"),
               lambda p: p.vae.decode(z.to(p.vae.dtype), return_dict=False)[0]):
        reset_counters()
        with torch.no_grad():
            a, b = fn(pipe), fn(ref_pipe)
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert _vae_counts() and not any(k.endswith(".fallback") for k in _vae_counts())
    uninstall(pipe)
    assert pipe.vae.dtype == LOAD[load]
