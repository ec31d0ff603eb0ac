"""The pipeline's timestep vectors, by which an installed plan places a transformer call in its generation:
`timestep_vectors` (the distinct float32 `timestep` vectors diffusers' MiniMaxH3Scheduler pair and the pipeline's
`MiniMaxH3SetTimestepsStep.build_row_timesteps` pass over some step counts) keys the AdaLN tables
(install/adaln_table.py); `schedule_index` (vector bytes -> (forward index, forwards) over every kind of row) places
the step cache's and sparse attention's calls (runtime/levers/step_cache.py, runtime/levers/sparse_attention.py)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch

from h3plan.errors import InstallError
from h3plan.facts.pipeline import schedule_facts
from h3plan.planning.request import MIN_STEPS, STEPS_RULE

ROWS = ((True, False, False), (True, True, False), (True, False, True), (True, True, True), (False, False, False),
        (False, True, False))  # (audio, condition_video, condition_audio): every kind of row a request has


def _row_timesteps():
    """MiniMaxH3SetTimestepsStep.build_row_timesteps (the pipeline's own function; it imports transformers)."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import MiniMaxH3SetTimestepsStep

    return MiniMaxH3SetTimestepsStep.build_row_timesteps


def timestep_vectors(steps: Iterable[int], *, video_shift: float | None = None, audio_shift: float | None = None,
                     keyframe_noise_aug: float | None = None, audio: bool = True, condition_video: bool = False,
                     condition_audio: bool = False, schedulers=None) -> list[torch.Tensor]:
    """The distinct float32 `timestep` vectors the pipeline passes over `steps` step counts, first seen first.
    schedulers: (video, audio) MiniMaxH3Scheduler instances to copy (a pipeline's own); None: new ones at the
    shifts; a shift or keyframe_noise_aug left None: the packaged pipeline group's (facts/pipeline.py). Rows: one
    text row, the video rows (a keyframe row first with condition_video), the audio rows (a reference row first with
    condition_audio; none without audio): the distinct values depend only on which kinds of row exist."""
    import copy

    from diffusers import MiniMaxH3Scheduler

    build = _row_timesteps()
    given = {"video_shift": video_shift, "audio_shift": audio_shift, "keyframe_noise_aug": keyframe_noise_aug}
    f = {**schedule_facts(), **{k: v for k, v in given.items() if v is not None}}
    aug = f["keyframe_noise_aug"]
    pair: tuple[Any, Any] = schedulers or (MiniMaxH3Scheduler(shift=f["video_shift"]),
                                           MiniMaxH3Scheduler(shift=f["audio_shift"]))
    sv, sa = pair
    cv, ca = int(condition_video), int(condition_audio) if audio else 0
    video = torch.arange(1, 2 + cv)
    audio_idx = torch.arange(2 + cv, 2 + cv + (1 + ca if audio else 0))
    out: dict[bytes, torch.Tensor] = {}
    for n in steps:
        v, a = copy.deepcopy(sv), copy.deepcopy(sa)
        v.set_timesteps(int(n))
        a.set_timesteps(int(n))
        for t, ta in zip(v.timesteps, a.timesteps):
            ts, _ = build(video, audio_idx, cv, ca, 1, float(t), float(ta), max(float(t), aug), 1.0)
            out.setdefault(ts.numpy().tobytes(), ts)
    return list(out.values())


def schedule_index(steps, pipeline: Mapping[str, Any] | None = None, schedulers=None,
                   counts: dict[int, int] | None = None) -> dict[bytes, tuple[int, int]]:
    """float32 timestep vector bytes -> (forward index, forwards) over `steps` step counts and every kind of row;
    pipeline: the plan's `pipeline` section (its shifts and keyframe_noise_aug; None: the packaged group's);
    `counts` (given) collects forwards -> step count."""
    out: dict[bytes, tuple[int, int]] = {}
    facts = schedule_facts(pipeline)
    for n in steps:
        for audio, cv, ca in ROWS:
            vs = timestep_vectors([n], **facts, audio=audio, condition_video=cv, condition_audio=ca,
                                  schedulers=schedulers)
            for i, v in enumerate(vs):
                out.setdefault(v.to(torch.float32).numpy().tobytes(), (i, len(vs)))
            if counts is not None:
                counts.setdefault(len(vs), int(n))
    return out


def step_counts(value, who: str) -> list[int]:
    """num_inference_steps as given to install / prepare (an int or a list of them) as a list; each >= 2, as
    diffusers' MiniMaxH3Scheduler.set_timesteps asks. Anything else: one InstallError line."""
    many = isinstance(value, (list, tuple))
    steps = list(value) if many else [value]
    if not steps or any(isinstance(n, bool) or not isinstance(n, int) or n < MIN_STEPS for n in steps):
        raise InstallError(f"{who}: num_inference_steps={value!r} must be an integer or a list of them; each "
                           f"{STEPS_RULE}")
    return steps


__all__ = ["ROWS", "schedule_index", "step_counts", "timestep_vectors"]
