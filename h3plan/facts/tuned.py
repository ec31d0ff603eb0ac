"""A tuned hardware file's provenance (`hardware.tuned`, written by `action=tune`) read on the plan side. Torch-free.

The versions that decide a measurement (torch, Triton, FA4, cuDNN, the NVIDIA driver) are read here without
importing torch: the packages' metadata (importlib.metadata) and the driver's /proc file. The tune records them
with these same functions, so a file compares like with like. A file made with another version of any of them
than the running one is stale: the plan says so, and strict=true refuses it. A version this machine lacks (no
torch where the plan is resolved, as on a laptop) is not compared, and the plan says that too.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

# what the version is of -> the distributions that carry it (the first one installed wins)
PACKAGES = {"torch": ("torch",), "triton": ("triton", "pytorch-triton"), "fa4": ("flash-attn-4",),
            "cudnn": ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn")}
COMPARED = tuple(PACKAGES) + ("driver",)
DRIVER_FILE = "/proc/driver/nvidia/version"


def driver_version(path: str = DRIVER_FILE) -> str | None:
    """The NVIDIA kernel module's version (`NVRM version: ... Kernel Module  570.86.15 ...`); None without one."""
    try:
        with open(path) as f:
            m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", f.read())
    except OSError:
        return None
    return m.group(1) if m else None


def running_versions() -> dict[str, str | None]:
    """torch, triton, fa4, cudnn (package versions) and the driver on this machine; None where absent."""
    from importlib import metadata  # here: email, zipfile and csv come with it, a tenth of a cold plan's imports

    out: dict[str, str | None] = {}
    for key, dists in PACKAGES.items():
        out[key] = None
        for d in dists:
            try:
                out[key] = metadata.version(d)
                break
            except metadata.PackageNotFoundError:
                continue
    out["driver"] = driver_version()
    return out


def stale(tuned: Mapping[str, Any], running: Mapping[str, str | None] | None = None) -> tuple[list[str], list[str]]:
    """(differences, not compared): one text per version the file and this machine disagree on, and the versions
    that cannot be compared (missing in the file or here)."""
    running = running_versions() if running is None else running
    made = tuned.get("versions") or {}
    diff, unknown = [], []
    for key in COMPARED:
        there, here = made.get(key), running.get(key)
        if there is None or here is None:
            unknown.append(key)
        elif str(there) != str(here):
            diff.append(f"{key} {there} at tune time, {here} here")
    return diff, unknown


def checks(tuned: Mapping[str, Any] | None) -> dict[tuple[str, str], Mapping[str, Any]]:
    """(lever, setting) -> its kernel check on the tuned device."""
    return {(c["lever"], c["setting"]): c for c in (tuned or {}).get("checks") or ()}


def measured_on(tuned: Mapping[str, Any]) -> str:
    return f"measured on {tuned['device']}, {tuned['date']}"
