"""Which workflows each transformer partition of diffusers' MiniMaxH3ModularPipeline serves, and the AdaLN
table keys that gives it (install/pipeline.py installs each partition with its own tables).

diffusers 0.42.1 (`modular_blocks_minimax_h3.py`, `MiniMaxH3AutoDenoiseStep`): `t2va` and `fl2va` run against
`transformer`, `ref2va` against `transformer_ref` (facts/workflows.py). Every workflow plans its per-row timesteps
with the same `MiniMaxH3SetTimestepsStep.build_row_timesteps`, so a call's distinct timestep vector depends only on
which kinds of row it has: conditioning video rows (fl2va keyframes, ref2va image and video references) pinned at
`max(t, keyframe_noise_aug)`, reference audio rows (ref2va soundtracks) at 1.0. Hence:
- `transformer_ref`: a ref2va request always has conditioning video rows (diffusers refuses audio-only
  references), so its table keys have them whatever the plan's request; reference audio rows as the plan says.
- `transformer`: no workflow on it has reference audio rows; conditioning video rows as the plan says (fl2va).
The plan's own flags describe one request; a call of the partition's other kind of request (a t2va call with an
fl2va plan, a ref2va call with soundtracks when the plan has none) is a counted table miss served exactly, its
entry then added; `h3plan.prepare(pipe, num_inference_steps=N, condition_video=..., condition_audio=...)` tables
those keys ahead of the call.

The plan's flags come from its request (`video.task`, facts/timesteps.py `row_kinds`, through the adaln_table
lever's install option); this module only adjusts them per partition, for the calls that partition can receive.
"""

from __future__ import annotations

from typing import Any, Mapping

from h3plan.facts.workflows import PARTITIONS, partition_conditions, tasks_of

FORCED = {name: partition_conditions(name) for name in PARTITIONS}
_WHY = {"condition_audio": "no workflow on it has reference audio rows",
        "condition_video": "ref2va always has conditioning video rows (image or video references)"}


def table_conditions(name: str, spec: Mapping[str, Any] | None) -> tuple[dict[str, bool], str | None]:
    """(the condition flags partition `name` tables with, a note saying what was changed from the plan's or None).
    spec: the plan's adaln_table install option (None: no table planned, nothing to change)."""
    if spec is None or name not in FORCED:
        return {}, None
    changed = {k: v for k, v in FORCED[name].items() if bool(spec.get(k)) != v}
    if not changed:
        return {}, None
    what = ", ".join(f"{k}={v} ({_WHY[k]})" for k, v in changed.items())
    return changed, (f"adaln_table: {name} serves {'/'.join(tasks_of(name))}: its table keys take {what} over the "
                     "plan's request; the plan's memory line counted the plan's own keys")
