"""The Qwen3-VL conditioner of every MiniMax-H3 workflow, sized from its config (torch-free).

Scope: diffusers 0.42.1 `MiniMaxH3TextEncoderStep` and its fl2va / ref2va siblings run
`Qwen3VLForConditionalGeneration.model` once per call (`get_qwen3vl_prompt_embeds`: `output_hidden_states=True`,
`use_cache=False`, no language-model head) and keep `hidden_states[50]`. `sizes(config)` reads the conditioner's
`config.json` (`text_config`, `vision_config`: a pipeline folder's `text_encoder/config.json`, `read(folder)`):
- parameters: transformers' Qwen3VLForConditionalGeneration module shapes (vision patch embed, position table,
  blocks, merger and deepstack mergers; text embeddings, decoder layers, final norm; lm_head unless tied), counted
  exactly (tests/planner/test_text_encoder.py recounts a tiny seeded Qwen3VLConfig's model on the meta device);
- the encode's device peak for T presentation rows (no_grad, bf16): every hidden state the call returns
  ((layers + 1) x T x hidden, output_hidden_states keeps them all) + one decoder layer's widest live set
  (its input, the MLP's gate, up and their product: T x (hidden + 3 x intermediate));
- the encode's work: 2 x (decoder parameters) FLOPs per row plus attention 4 x T^2 x heads x head_dim per layer.
Where it sits is the text_encoder lever's decision (h3plan/levers/text_encoder.py), taken in the memory estimate
(planning/memory.py) from these sizes and the free memory the estimate finds.
Not counted: the vision tower's activations (fl2va / ref2va vision blocks) and the move's overlap with compute.
Numbers only, no torch.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from h3plan.errors import UsageError


def read(folder) -> dict[str, Any]:
    """`text_encoder/config.json` of a pipeline folder (or the conditioner's own folder's config.json)."""
    folder = os.fspath(folder)
    for path in (os.path.join(folder, "text_encoder", "config.json"), os.path.join(folder, "config.json")):
        if os.path.isfile(path):
            try:
                with open(path) as f:
                    cfg = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                raise UsageError(f"{path}: cannot read it ({e})") from None
            if not isinstance(cfg, dict) or "text_config" not in cfg or "vision_config" not in cfg:
                raise UsageError(f"{path}: not a Qwen3-VL config (no text_config / vision_config)")
            return cfg
    raise UsageError(f"{folder}: no text_encoder/config.json (the pipeline's Qwen3-VL conditioner)")


def _vision_params(v: Mapping[str, Any]) -> int:
    h, i, out = v["hidden_size"], v["intermediate_size"], v["out_hidden_size"]
    merged = h * v["spatial_merge_size"] ** 2
    patch = v.get("in_channels", 3) * v["temporal_patch_size"] * v["patch_size"] ** 2 * h + h
    block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)  # 2 LayerNorms, qkv, proj, MLP
    merger = lambda norm: 2 * norm + merged * merged + merged + merged * out + out  # noqa: E731 - LayerNorm, fc1, fc2
    deepstack = len(v.get("deepstack_visual_indexes") or ())
    return patch + v["num_position_embeddings"] * h + v["depth"] * block + merger(h) + deepstack * merger(merged)


def _text_params(t: Mapping[str, Any]) -> tuple[int, int]:
    """(all text parameters, decoder-layer parameters)."""
    h, i = t["hidden_size"], t["intermediate_size"]
    hd = t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]
    q, kv = t["num_attention_heads"] * hd, t["num_key_value_heads"] * hd
    bias = bool(t.get("attention_bias", False))
    attn = h * q + 2 * h * kv + q * h + (q + 2 * kv + h if bias else 0) + 2 * hd  # q/k/v/o (+ biases), q_norm, k_norm
    layer = attn + 3 * h * i + 2 * h  # MLP gate/up/down, two RMSNorms
    return t["vocab_size"] * h + t["num_hidden_layers"] * layer + h, t["num_hidden_layers"] * layer


def sizes(config: Mapping[str, Any], tokens: int = 0, dtype_bytes: int = 2) -> dict[str, Any]:
    """Parameters, weight bytes, and for `tokens` presentation rows the encode's activation peak and FLOPs."""
    t, v = config["text_config"], config["vision_config"]
    text, layers = _text_params(t)
    tied = bool(config.get("tie_word_embeddings", t.get("tie_word_embeddings", False)))
    params = _vision_params(v) + text + (0 if tied else t["vocab_size"] * t["hidden_size"])
    h, n = t["hidden_size"], t["num_hidden_layers"]
    hd = t.get("head_dim") or h // t["num_attention_heads"]
    act = dtype_bytes * tokens * ((n + 1) * h + h + 3 * t["intermediate_size"])
    flops = 2 * layers * tokens + n * 4 * tokens * tokens * t["num_attention_heads"] * hd
    return {"params": params, "weight_bytes": dtype_bytes * params, "layer_bytes": dtype_bytes * layers // n,
            "activation_bytes": act, "flops": flops, "layers": n, "hidden": h}


__all__ = ["read", "sizes"]
