"""The hardware facts (conf/hardware/*.yaml) for code that runs on a device: the one source of every
capability rule.

The planner reads the facts through the composed config; the attention backends, deciding per call
whether they can run on the tensor's device, read the same YAML here, picked by the device's compute
capability. A device with no YAML (say SM80) gets None, and the backends say so in their reason.
Torch-free (PyYAML only).
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Mapping

from h3plan.facts import CONF as CONF_DIR

CONF = os.path.join(CONF_DIR, "hardware")


def names() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(CONF) if f.endswith(".yaml"))


@functools.lru_cache(maxsize=None)
def load(name: str) -> Mapping[str, Any]:
    """conf/hardware/<name>.yaml as a plain dict (the packaged file, without command-line overrides)."""
    import yaml

    path = os.path.join(CONF, f"{name}.yaml")
    if not os.path.isfile(path):
        raise KeyError(f"no hardware facts {name!r}; known: {', '.join(names())}")
    with open(path) as f:
        return yaml.safe_load(f)


def capability(facts: Mapping[str, Any]) -> tuple[int, int]:
    major, _, minor = str(facts["compute_capability"]).partition(".")
    return int(major), int(minor or 0)


@functools.lru_cache(maxsize=None)
def for_capability(cc: tuple[int, int]) -> Mapping[str, Any] | None:
    """The packaged facts whose compute_capability is `cc` (a (major, minor) pair), or None."""
    for n in names():
        f = load(n)
        if capability(f) == tuple(cc):
            return f
    return None


GEMMS = {"fp8": "FP8 GEMM needs", "nvfp4": "NVFP4 GEMMs need"}  # hardware.gemm.<kind> -> how its reason begins


def lowest(path: str) -> tuple[int, int] | None:
    """The lowest compute capability among the packaged hardware whose fact `path` ("gemm.fp8") is true."""
    def value(f):
        for key in path.split("."):
            f = (f or {}).get(key)
        return f

    found = [capability(load(n)) for n in names() if value(load(n))]
    return min(found) if found else None


@functools.lru_cache(maxsize=None)
def gemm_rule(kind: str) -> tuple[tuple[int, int] | None, str]:
    """(the lowest compute capability whose packaged facts have hardware.gemm.<kind>, the reason a device below it
    gets): the rule in the form a per-call guard uses. The runtime reads it once, at import, and compares each call's
    device against the constant: no file is read inside a forward (torch.compile traces the guard; a directory
    listing there breaks fullgraph=True), the same answer as gemm_reason for every packaged GPU."""
    return lowest(f"gemm.{kind}"), gemm_reason(kind, None) or ""


def gemm_reason(kind: str, cc: tuple[int, int] | None) -> str | None:
    """Why a device of compute capability `cc` (None: not a CUDA device) runs no `kind` GEMM ("fp8" | "nvfp4") by
    the hardware facts (hardware.gemm.<kind>), or None. The reason names the lowest packaged hardware that has it
    ("NVFP4 GEMMs need SM100+"), the same for every device; a device without facts (conf/hardware) has none."""
    facts = for_capability(tuple(cc)) if cc is not None else None
    if facts is not None and facts["gemm"][kind]:
        return None
    lo = lowest(f"gemm.{kind}")
    return f"{GEMMS[kind]} SM{lo[0]}{lo[1]}+" if lo else f"{GEMMS[kind]} hardware.gemm.{kind}=true on some GPU"


def version_tuple(v: str | int) -> tuple[int, ...]:
    """"9.19.0" -> (9, 19, 0); cudnnGetVersion()'s 91900 -> (9, 19, 0)."""
    if isinstance(v, int):
        return (v // 10000, v // 100 % 100, v % 100)
    return tuple(int(x) for x in re.findall(r"\d+", str(v))[:3])


def cudnn_fp8_version_problem(facts: Mapping[str, Any], version: str | int) -> str | None:
    """Why cuDNN `version` cannot run FP8 SDPA by the facts (fp8_min_version, fp8_excluded_versions), or None."""
    c = facts["cudnn"]
    v = version_tuple(version)
    if v < version_tuple(c["fp8_min_version"]):
        return (f"cuDNN {'.'.join(map(str, v))} is older than {c['fp8_min_version']}, the first with FP8 SDPA "
                f"({c['source']})")
    if any(v == version_tuple(x) for x in c.get("fp8_excluded_versions") or ()):
        return f"cuDNN {'.'.join(map(str, v))} is excluded for FP8 SDPA ({c['source']})"
    return None


def cudnn_fp8_bf16_output(facts: Mapping[str, Any], version: str | int | None) -> bool:
    """cuDNN FP8 attention may write BF16 output (else FP8, which h3plan dequantises): the facts list bf16 among
    fp8_output_dtypes and `version` (None: the facts' own cudnn.version) reaches bf16_output_min_version."""
    c = facts["cudnn"]
    need = c.get("bf16_output_min_version")
    v = c.get("version") if version is None else version
    return "bf16" in (c.get("fp8_output_dtypes") or ()) and bool(need) and (
        v is None or version_tuple(v) >= version_tuple(need))


def never_ran(lever: str, setting: str, on=lambda facts: True) -> tuple[list[str], list[str]]:
    """(the packaged hardware whose facts take a path (`on(facts)`) and whose hardware.verified.settings lack
    lever=setting, the packaged hardware where lever=setting ran): the installer's "never ran" notes."""
    never, ran = [], []
    for n in names():
        f = load(n)
        if setting in ((f.get("verified") or {}).get("settings") or {}).get(lever, []):
            ran.append(n)
        elif on(f):
            never.append(n)
    return never, ran
