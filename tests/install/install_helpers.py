"""Shared pieces of the installer tests: the tiny model, packed inputs, plans and a contract registry.

LEVERS installs exactly as docs/architecture.md's lever protocol says (option keys per lever), so these
tests do not depend on the planner's lever modules; test_real_registry checks those against it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from h3plan.actions.inputs import build_model, packed_inputs
from h3plan.plan import make_decision, make_plan

ROOT = Path(__file__).resolve().parents[2]
TINY = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/model/h3_tiny.yaml").diffusers_config)
S = 48  # packed rows: small for the Triton interpreter


def _gemm(b, d):
    if d.setting in ("fp8", "nvfp4"):
        b.quantize_linears("gemm_quant", d.setting, d.to_dict()["params"])
    else:
        b.skip("gemm_quant", d.reasons[0])


LEVERS = {
    "gemm_quant": _gemm,
    "attention": lambda b, d: b.set_attention_option("attention", "backend", d.setting),
    "fa4_2cta": lambda b, d: b.set_attention_option("fa4_2cta", "fa4_2cta", d.setting == "on"),
    "fa4_tile": lambda b, d: b.set_attention_option("fa4_tile", "fa4_tile", d.param("tile") if d.setting == "tuned" else None),
    "fp8_scales": lambda b, d: (b.set_attention_option("fp8_scales", "fp8_scales", d.setting),
                                b.set_attention_option("fp8_scales", "scale_table", d.param("scale_table")),
                                b.set_attention_option("fp8_scales", "scale_margin", float(d.param("scale_margin", 1.0)))),
    "qk_norm_rope": lambda b, d: b.set_attention_option("qk_norm_rope", "qk_norm_rope", d.setting),
    "modulation": lambda b, d: b.set_block_option("modulation", "modulation", d.setting),
    "gated_residual": lambda b, d: b.set_block_option("gated_residual", "gated_residual", d.setting == "on"),
    "swiglu": lambda b, d: b.set_block_option("swiglu", "swiglu", d.setting == "on"),
}
LOSSY = {("gemm_quant", "fp8"), ("gemm_quant", "nvfp4"), ("modulation", "fp32"), ("qk_norm_rope", "fused_fp8"),
         ("attention", "cudnn_fp8"), ("fp8_scales", "dynamic"), ("fp8_scales", "static")}


def plan(params=None, **settings):
    """A Plan with one decision per keyword (lever=setting), in registry order; params: {lever: {...}}."""
    order, params = list(LEVERS), params or {}
    decisions = [make_decision(k, v, (k, v) not in LOSSY, [f"test: {k}={v}"], params=params.get(k)) for k, v in
                 sorted(settings.items(), key=lambda kv: order.index(kv[0]))]
    recipe = {"name": "bf16", "policy": "lossless", "budget": {"psnr_db_min": None}}
    if any((k, v) in LOSSY for k, v in settings.items()):
        recipe = {"name": "fp8", "policy": "budget", "budget": {"psnr_db_min": 34.0}}
    return make_plan({"recipe": recipe, "model": {"name": "h3_tiny"}}, {}, decisions)


LOSSLESS = dict(attention="sdpa", qk_norm_rope="fused", modulation="exact", gated_residual="on", swiglu="on")


def tiny_model(dtype=torch.bfloat16, seed=0):
    return build_model(TINY, dtype=dtype, seed=seed)


def tiny_inputs(seq_len=S, seed=0):
    return packed_inputs(TINY, seq_len, seed=seed)


def forward(model, inputs):
    with torch.no_grad():
        out = model(**inputs)
    return out.sample, out.audio_sample
