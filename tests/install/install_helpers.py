"""Shared pieces of the installer tests: the tiny model, packed inputs, plans and a contract registry.

LEVERS: the real levers' installs for the levers these tests plan with; `plan()` builds decisions without
the planner (fa4 levers get the `attention` param their install reads).
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from h3plan.actions.inputs import build_model, packed_inputs
from h3plan.levers import REGISTRY, SPECS
from h3plan.planner import make_plan
from h3plan.facts.decision import make_decision

ROOT = Path(__file__).resolve().parents[2]
TINY = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/model/h3_tiny.yaml").diffusers_config)
S = 48  # packed rows: small for the Triton interpreter


# The levers' own installs (their SPECs declare the options), restricted to the levers these tests plan with.
LEVERS = {k: REGISTRY[k].install for k in ("gemm_quant", "attention", "fa4_2cta", "fa4_tile", "fp8_scales",
                                           "qk_norm_rope", "modulation", "gated_residual", "swiglu", "fp8_act_quant",
                                           "nvfp4_producer_quant", "nvfp4_out_quant")}
LOSSY = {(k, v) for k, spec in SPECS.items() for v, lossless in spec.settings.items() if not lossless}


def plan(params=None, **settings):
    """A Plan with one decision per keyword (lever=setting), in registry order; params: {lever: {...}}."""
    order, params = list(LEVERS), {k: dict(v) for k, v in (params or {}).items()}
    for k in ("fa4_2cta", "fa4_tile"):
        if k in settings:
            params.setdefault(k, {}).setdefault("attention", settings.get("attention", "sdpa"))
    decisions = [make_decision(k, v, (k, v) not in LOSSY, [f"test: {k}={v}"], params=params.get(k)) for k, v in
                 sorted(settings.items(), key=lambda kv: order.index(kv[0]))]
    recipe = {"name": "bf16", "policy": "lossless", "budget": {"psnr_db_min": None}}
    if any((k, v) in LOSSY for k, v in settings.items()):
        recipe = {"name": "fp8", "policy": "budget", "budget": {"psnr_db_min": 34.0}}
    return make_plan({"recipe": recipe, "model": {"name": "h3_tiny"}}, {}, decisions)


LOSSLESS = dict(attention="sdpa", qk_norm_rope="fused", modulation="exact", gated_residual="on", swiglu="on")


def tiny_model(dtype=torch.bfloat16, seed=0):
    return build_model(TINY, dtype=dtype, seed=seed)


def tiny_checkpoint(folder: Path, text_encoder: bool = False) -> Path:
    """The tiny transformer saved as a pipeline folder holds it (DIR/transformer), and with `text_encoder` the tiny
    Qwen3-VL conditioner and tokenizer beside it (DIR/text_encoder, DIR/tokenizer)."""
    tiny_model(seed=3).save_pretrained(folder / "transformer")
    if text_encoder:
        from h3plan.actions.text_encoder_build import conditioner_components

        comps = conditioner_components(OmegaConf.load(ROOT / "conf/model/h3_tiny.yaml").text_encoder_default, seed=5)
        comps["text_encoder"].save_pretrained(folder / "text_encoder")
        comps["tokenizer"].save_pretrained(folder / "tokenizer")
    return folder


def tiny_inputs(seq_len=S, seed=0):
    return packed_inputs(TINY, seq_len, seed=seed)


def forward(model, inputs):
    with torch.no_grad():
        out = model(**inputs)
    return out.sample, out.audio_sample


_LAZY_READY = []


def bitwise(a, b):
    """Every output tensor of one forward equal bit for bit to the other's."""
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def lazy_device():
    """torch's `lazy` device (the TorchScript backend on the CPU), initialised once per process: a second init
    raises ("multiple backend fallbacks for the same dispatch key Lazy")."""
    if not _LAZY_READY:
        from torch._lazy import ts_backend

        ts_backend.init()
        _LAZY_READY.append(True)
    return torch.device("lazy")
