"""The packaged `pipeline` config group (conf/pipeline/h3.yaml), read once: diffusers' MiniMaxH3ModularPipeline
facts for code that holds no composed config (a model installed on its own, a seeded pipeline, a hand-written
section). Where a caller has the `pipeline` section, its values win; these are only what it lacks.
"""

from __future__ import annotations

import copy
import functools
import os
from typing import Any, Mapping

from . import CONF

PIPELINE_YAML = os.path.join(CONF, "pipeline", "h3.yaml")


@functools.lru_cache(maxsize=None)
def _packaged() -> dict[str, Any]:
    import yaml

    with open(PIPELINE_YAML) as f:
        return yaml.safe_load(f)


def pipeline_defaults() -> dict[str, Any]:
    """conf/pipeline/h3.yaml as a plain dict (a copy: the caller may change it)."""
    return copy.deepcopy(_packaged())


def schedule_facts(pipeline: Mapping[str, Any] | None = None) -> dict[str, float]:
    """video_shift and audio_shift (the two MiniMaxH3Schedulers') and keyframe_noise_aug of a `pipeline` section;
    what it lacks (None: all three) from the packaged group."""
    base, p = _packaged(), pipeline or {}
    sch = {**base["schedulers"], **(p.get("schedulers") or {})}
    return {"video_shift": float(sch["video_shift"]), "audio_shift": float(sch["audio_shift"]),
            "keyframe_noise_aug": float(p.get("keyframe_noise_aug", base["keyframe_noise_aug"]))}


__all__ = ["PIPELINE_YAML", "pipeline_defaults", "schedule_facts"]
