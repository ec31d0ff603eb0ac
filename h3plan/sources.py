"""The outside sources a plan cites, named once in plain words; docs/sources.md says what each one measured.

`cite(anchor)` is how a reason names one: "<plain name> (docs/sources.md#<anchor>)". Pure; imports nothing.
"""

from __future__ import annotations

NAMES = {
    "trtllm-seed": "TensorRT-LLM's MiniMax-H3 deployment on SM107",
    "telefuser-seed": "TeleFuser's lossless MiniMax-H3 kernels",
    "vllm-omni-modulation-seed": "vLLM-Omni's fused MiniMax-H3 modulation",
    "vllm-omni-vae-seed": "vLLM-Omni's MiniMax-H3 VAE decoder ops",
    "fastvideo-seed": "FastVideo's MiniMax-H3 kernels",
    "sglang-subblock": "SGLang's SubBlock sparse attention for MiniMax-H3",
    "fa4-block-sparse": "flash-attn-4's block-sparse forward",
}


def cite(anchor: str) -> str:
    """'<plain name> (docs/sources.md#<anchor>)'; an anchor without a name here raises KeyError."""
    return f"{NAMES[anchor]} (docs/sources.md#{anchor})"
