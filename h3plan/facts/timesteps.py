"""The timestep vectors a request's transformer calls pass: the AdaLN table's keys (torch-free).

diffusers 0.42.1 `MiniMaxH3SetTimestepsStep.build_row_timesteps` gives every row of the packed sequence a timestep and
passes the transformer the sorted distinct values (`torch.unique`). Per step, with t / t_a the video / audio
schedules' values (two `MiniMaxH3Scheduler`s at the pipeline group's `schedulers.video_shift` / `audio_shift`):
- generated video rows and text rows (a keyframe's or reference's vision block in the text included): t;
- generated audio rows: t_a (none without audio rows);
- visual condition rows (fl2va keyframes, ref2va image and video references): max(t, keyframe_noise_aug);
- reference audio rows (ref2va soundtracks and audio references, clean): 1.0.
So the distinct values depend only on which kinds of row a request holds. `table_timesteps(request, pipeline,
steps)` is the one function both sides use: the planner sizes the table with it (levers/adaln_table.py,
planning/memory.py), the installer tables the same request. Planning numbers: the schedules are recomputed in
Python floats rounded to float32; the installer's entries are diffusers' own float32 values.
"""

from __future__ import annotations

import struct
from typing import Any, Iterable, Mapping

from .pipeline import schedule_facts

CLEAN_AUDIO_TIMESTEP = 1.0  # MiniMaxH3SetTimestepsStep.__call__: condition_audio_timestep, a clean soundtrack


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def schedule(steps: int, shift: float) -> list[float]:
    """MiniMaxH3Scheduler.set_timesteps(steps).timesteps: 1 - sigma over the shifted linspace(1, 0, steps) grid,
    consecutive duplicates collapsed, the terminal sigma dropped (float64 math, each value rounded to float32;
    planning numbers: the installer takes diffusers' own float32 values)."""
    base = [1.0 - i / (steps - 1) for i in range(steps)]
    sig: list[float] = []
    for b in base:
        s = _f32(shift * b / (1 + (shift - 1) * b))
        if not sig or s != sig[-1]:
            sig.append(s)
    return [_f32(1.0 - s) for s in sig[:-1]]


def vectors(steps: Iterable[int], video_shift: float, audio_shift: float, keyframe_noise_aug: float, *,
            audio: bool = True, condition_video: bool = False,
            condition_audio: bool = False) -> list[tuple[float, ...]]:
    """The distinct `timestep` vectors of the transformer calls (MiniMaxH3SetTimestepsStep.build_row_timesteps:
    the sorted distinct values over the rows), over every step count, first seen first."""
    out: dict[tuple[float, ...], None] = {}
    for n in steps:
        for t, a in zip(schedule(n, video_shift), schedule(n, audio_shift)):
            vals = {t} | ({a} if audio else set())
            if condition_video:
                vals.add(_f32(max(t, keyframe_noise_aug)))
            if condition_audio:
                vals.add(CLEAN_AUDIO_TIMESTEP)
            out.setdefault(tuple(sorted(vals)), None)
    return list(out)


def row_kinds(request: Mapping[str, Any] | None) -> dict[str, bool]:
    """Which kinds of row a request holds: audio (generated audio rows), condition_video (keyframe or visual
    reference rows), condition_audio (reference audio rows). request: the plan's `sequence` (planning/request.py
    `tokens`); None or a request without these keys (parallel.seq_len set alone): t2va with audio."""
    r = request or {}
    return {"audio": int(r.get("audio_rows", 1)) > 0, "condition_video": int(r.get("condition_video_rows", 0)) > 0,
            "condition_audio": int(r.get("condition_audio_rows", 0)) > 0}


def request_steps(request: Mapping[str, Any] | None, pipeline: Mapping[str, Any]) -> int:
    """The request's num_inference_steps (its own, else the pipeline's default)."""
    return int((request or {}).get("num_inference_steps") or pipeline["num_inference_steps"])


def table_timesteps(request: Mapping[str, Any] | None, pipeline: Mapping[str, Any],
                    steps: Iterable[int] | None = None) -> list[tuple[float, ...]]:
    """The timestep vectors the AdaLN table must hold for a request: every distinct sorted `timestep` vector its
    transformer calls pass, over `steps` (step counts; None: the request's num_inference_steps), first seen first.
    request: the plan's `sequence` (plan.derived_value("sequence")); pipeline: the `pipeline` section
    (schedulers' shifts, keyframe_noise_aug)."""
    f = schedule_facts(pipeline)
    steps = [int(s) for s in steps] if steps is not None else [request_steps(request, pipeline)]
    return vectors(steps, f["video_shift"], f["audio_shift"], f["keyframe_noise_aug"], **row_kinds(request))


__all__ = ["schedule", "vectors", "row_kinds", "request_steps", "table_timesteps", "CLEAN_AUDIO_TIMESTEP"]
