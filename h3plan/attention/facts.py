"""Static (torch-free) capability rules of the attention backends, read from hardware facts.

`requirements(backend, facts)` lists what the planned hardware lacks for a backend; empty = it can run.
The rules restate DESIGN.md's capability facts (sources there): FA4's forward runs on SM90 (1-CTA,
FlashAttentionForwardSm90) and the SM100 family; its 2-CTA kernel is Blackwell tcgen05 only; cuDNN FP8
SDPA needs Hopper+ and cuDNN >= 9.1 (not 9.10.0); FP8 attention with BF16 output needs SM100+ and
cuDNN >= 9.13 (on SM90 the graph is declined, measured with cuDNN 9.19).

Facts: a mapping with the compute capability under one of `compute_capability` ("9.0", [9, 0], 9.0),
`sm` / `arch` (90, "sm90", "sm_90a"), and optionally `cudnn` / `cudnn_version` (91900 or "9.19.0").
Where the hardware YAML states a backend flag (conf/hardware/*.yaml: `fa4: {bf16, two_cta}`,
`cudnn: {bf16, fp8}`), a false flag is a missing requirement too, quoting the YAML's source line.
Keys the YAML does not carry are simply not checked.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

CUDNN_FP8_MIN = 90100
CUDNN_FP8_BROKEN = (91000,)
CUDNN_FP8_BF16_OUT_MIN = 91300


def capability(facts: Mapping[str, Any]) -> tuple[int, int] | None:
    """(major, minor) from the facts, or None when they name no capability."""
    cc = facts.get("compute_capability", facts.get("capability"))
    if cc is not None:
        if isinstance(cc, (list, tuple)):
            return int(cc[0]), int(cc[1])
        major, _, minor = str(cc).partition(".")
        return int(major), int(minor or 0)
    sm = facts.get("sm", facts.get("arch"))
    if sm is None:
        return None
    m = re.search(r"(\d+)", str(sm))
    if not m:
        raise ValueError(f"cannot read a compute capability from sm={sm!r}")
    digits = m.group(1)
    return int(digits[:-1]), int(digits[-1])


def cudnn_version(facts: Mapping[str, Any]) -> int | None:
    """cuDNN version as cudnnGetVersion() reports it (9.19.0 -> 91900), or None."""
    v = facts.get("cudnn_version", facts.get("cudnn"))
    if isinstance(v, Mapping):
        v = v.get("version")
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    parts = [int(p) for p in re.findall(r"\d+", str(v))[:3]] + [0, 0]
    return parts[0] * 10000 + parts[1] * 100 + parts[2]


def _sm(cc) -> str:
    return f"SM{cc[0]}{cc[1]}"


def _flag(facts, group: str, key: str, what: str) -> list[str]:
    sec = facts.get(group)
    if isinstance(sec, Mapping) and sec.get(key) is False:
        src = sec.get("source")
        return [f"hardware facts: {what} is not available on {facts.get('name', 'this GPU')}" + (f" ({src})" if src else "")]
    return []


def fa4_requirements(facts) -> list[str]:
    cc = capability(facts)
    if cc is not None and cc[0] not in (9, 10, 11):
        return [f"FA4 (flash_attn.cute) forward needs SM90 or the SM100 family; planned hardware is {_sm(cc)}"]
    return _flag(facts, "fa4", "bf16", "FA4 BF16 forward")


def fa4_2cta_requirements(facts) -> list[str]:
    cc = capability(facts)
    if cc is not None and cc[0] not in (10, 11):
        return [f"FA4 2-CTA is a Blackwell tcgen05 kernel (SM100+); planned hardware is {_sm(cc)} (1-CTA only)"]
    return _flag(facts, "fa4", "two_cta", "FA4 2-CTA")


def cudnn_bf16_requirements(facts) -> list[str]:
    cc = capability(facts)
    if cc is not None and cc < (8, 0):
        return [f"cuDNN fused flash SDPA needs SM80+; planned hardware is {_sm(cc)}"]
    return _flag(facts, "cudnn", "bf16", "cuDNN BF16 SDPA")


def cudnn_fp8_requirements(facts) -> list[str]:
    out = []
    cc, ver = capability(facts), cudnn_version(facts)
    if cc is not None and cc < (9, 0):
        out.append(f"cuDNN FP8 SDPA needs SM90+; planned hardware is {_sm(cc)}")
    if ver is not None and (ver < CUDNN_FP8_MIN or ver in CUDNN_FP8_BROKEN):
        out.append(f"cuDNN FP8 SDPA needs cuDNN >= 9.1 and not 9.10.0; planned cuDNN is {ver}")
    return out + _flag(facts, "cudnn", "fp8", "cuDNN FP8 SDPA")


def fp8_bf16_output(cc: tuple[int, int] | None, ver: int | None) -> bool:
    """Whether cuDNN FP8 attention may write BF16 output (else it writes FP8 and h3plan dequantises)."""
    return cc is not None and cc >= (10, 0) and ver is not None and ver >= CUDNN_FP8_BF16_OUT_MIN


REQUIREMENTS = {
    "sdpa": lambda facts: [],
    "fa4": fa4_requirements,
    "cudnn_bf16": cudnn_bf16_requirements,
    "cudnn_fp8": cudnn_fp8_requirements,
}


def requirements(backend: str, facts: Mapping[str, Any]) -> list[str]:
    if backend not in REQUIREMENTS:
        raise ValueError(f"unknown attention backend {backend!r}; known: {sorted(REQUIREMENTS)}")
    return REQUIREMENTS[backend](facts)
