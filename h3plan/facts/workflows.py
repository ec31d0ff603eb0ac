"""diffusers' three MiniMax-H3 workflows (`video.task`): the checkpoint partition each runs against and the rows
each packs. Torch-free; planning/workflows.py sizes the condition rows, install/workflows.py tables a partition's
keys, actions/pipeline_build.py builds a request of each.

diffusers 0.42.1 `modular_pipelines/minimax_h3/` (`MiniMaxH3Blocks._workflow_map`, `MiniMaxH3AutoDenoiseStep`):
- t2va: `[text | target audio | target video]` against `transformer/`;
- fl2va: `[text | keyframe rows | target audio | target video]` against `transformer/`; keyframe rows are
  conditioning video rows;
- ref2va: `[text | reference blocks | target audio | target video]` against `transformer_ref/`; every request has
  image or video references (conditioning video rows; audio-only references are refused), and a soundtrack or an
  audio reference adds reference audio rows.
"""

from __future__ import annotations

TASKS = ("t2va", "fl2va", "ref2va")
DEFAULT_TASK = "t2va"  # a request without a task (video.task unset, a plan file without one)
PARTITION = {"t2va": "transformer", "fl2va": "transformer", "ref2va": "transformer_ref"}  # the checkpoint subfolder
PARTITIONS = ("transformer", "transformer_ref")
CONDITIONS: dict[str, dict[str, bool | None]] = {
    "t2va": {"condition_video": False, "condition_audio": False},
    "fl2va": {"condition_video": True, "condition_audio": False},
    "ref2va": {"condition_video": True, "condition_audio": None},
}
"""The condition rows a task packs between the text and the target audio: conditioning video rows (fl2va keyframes,
ref2va image and video references) and reference audio rows (ref2va soundtracks and audio references); True always,
False never, None as the request says."""


def partition(task: str | None) -> str:
    """The checkpoint partition a task runs against (None, or a task planning/workflows.check_task refuses: the
    default task's)."""
    return PARTITION.get(task or DEFAULT_TASK, PARTITION[DEFAULT_TASK])


def tasks_of(name: str) -> tuple[str, ...]:
    """The tasks partition `name` serves."""
    return tuple(t for t in TASKS if PARTITION[t] == name)


def request_conditions(task: str, audio_references: bool = False) -> dict[str, bool]:
    """The condition flags of one request of `task` (h3plan.prepare's keywords); audio_references: a ref2va
    request with a soundtrack or an audio reference."""
    return {k: audio_references if v is None else v for k, v in CONDITIONS[task].items()}


def partition_conditions(name: str) -> dict[str, bool]:
    """The condition flags every task on partition `name` shares, whatever its request."""
    out = {}
    for k in CONDITIONS[DEFAULT_TASK]:
        seen = {CONDITIONS[t][k] for t in tasks_of(name)}
        if len(seen) == 1 and None not in seen:
            out[k] = bool(seen.pop())
    return out


__all__ = ["TASKS", "DEFAULT_TASK", "PARTITION", "PARTITIONS", "CONDITIONS", "partition", "tasks_of",
           "request_conditions", "partition_conditions"]
