"""Frames kept on disk between pipeline bench runs (bench.pipeline.frames_dir): a run's rows compare against rows a
run in another process made, e.g. the lossless plan's frames from the device call before this one.

A file holds one row's frames (float32 on the host, as `pipe(..., output_type="pt")` returns them) with what they are
frames of: the request (workflow, video, forwards of the call that made them) and a fingerprint of the seeded weights
(the denoiser's and the VAE's), so frames from another build of the pipeline are never compared. Torch is handed in.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping


def fingerprint(torch, pipe, denoiser) -> str:
    """The seeded weights in a few numbers: per module, the float64 sum of every parameter's first and last 4096
    elements and the parameter count (another seed, width or build differs here)."""
    out = []
    for m in (denoiser, pipe.vae):
        total, n = 0.0, 0
        for p in m.parameters():
            flat = p.detach().reshape(-1)
            total += float(flat[:4096].double().sum() + flat[-4096:].double().sum())
            n += flat.numel()
        out.append(f"{n}:{total:.9e}")
    return "/".join(out)


def key(meta: Mapping[str, Any]) -> str:
    """A file name for a row's frames: its request, the forwards of the call, the row's label and VAE."""
    words = [meta["workflow"], meta["video"], f"{meta['forwards']}fwd", meta["label"], meta["vae"]]
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", "-".join(str(w) for w in words)) + ".pt"


def save(torch, folder: str, frames, meta: Mapping[str, Any]) -> str:
    """Write `frames` with `meta` (key()'s fields, `fingerprint`, `run`) to `folder`; the path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, key(meta))
    tmp = path + ".tmp"
    torch.save({"frames": frames, "meta": dict(meta)}, tmp)
    os.replace(tmp, path)
    return path


def load(torch, folder: str | None, meta: Mapping[str, Any]) -> tuple[Any, dict] | None:
    """(frames, their meta) of the row `meta` names (key()'s fields) in `folder`, made from the same weights
    (`meta["fingerprint"]`); None: no such file, or frames of other weights."""
    if not folder:
        return None
    path = os.path.join(folder, key(meta))
    if not os.path.isfile(path):
        return None
    doc = torch.load(path, map_location="cpu", weights_only=True)
    if doc["meta"].get("fingerprint") != meta.get("fingerprint"):
        return None
    return doc["frames"], doc["meta"]
