"""Facts with one home (h3plan/facts/): the workflows' partitions and condition rows, the pipeline group's scheduler
facts and the block linears, and the modules that read them instead of keeping a copy."""

import re
from pathlib import Path

import pytest
import yaml

from h3plan.facts import pipeline, workflows
from h3plan.facts.blocks import BLOCK_LINEARS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("task,partition,plain,audio_refs", [
    ("t2va", "transformer", {"condition_video": False, "condition_audio": False},
     {"condition_video": False, "condition_audio": False}),
    ("fl2va", "transformer", {"condition_video": True, "condition_audio": False},
     {"condition_video": True, "condition_audio": False}),
    ("ref2va", "transformer_ref", {"condition_video": True, "condition_audio": False},
     {"condition_video": True, "condition_audio": True}),
])
def test_a_task_runs_on_its_partition_with_its_condition_rows(task, partition, plain, audio_refs):
    assert workflows.partition(task) == partition and task in workflows.tasks_of(partition)
    assert workflows.request_conditions(task) == plain
    assert workflows.request_conditions(task, audio_references=True) == audio_refs


def test_a_partition_fixes_only_what_all_its_tasks_share():
    assert workflows.partition(None) == workflows.partition(workflows.DEFAULT_TASK) == "transformer"
    assert workflows.partition_conditions("transformer") == {"condition_audio": False}
    assert workflows.partition_conditions("transformer_ref") == {"condition_video": True}
    assert sorted(t for p in workflows.PARTITIONS for t in workflows.tasks_of(p)) == sorted(workflows.TASKS)


def test_schedule_facts_come_from_the_pipeline_group():
    packaged = yaml.safe_load((ROOT / "conf" / "pipeline" / "h3.yaml").read_text())
    want = {**packaged["schedulers"], "keyframe_noise_aug": packaged["keyframe_noise_aug"]}
    assert pipeline.schedule_facts() == want == pipeline.schedule_facts({})
    mine = {"schedulers": {"video_shift": 5.0}, "keyframe_noise_aug": 0.5}
    assert pipeline.schedule_facts(mine) == {**want, "video_shift": 5.0, "keyframe_noise_aug": 0.5}
    copy = pipeline.pipeline_defaults()
    copy["schedulers"]["video_shift"] = -1.0
    assert pipeline.schedule_facts() == want  # a caller's copy never changes the packaged facts


def test_no_module_repeats_a_scheduler_fact_or_the_block_linears():
    """The values live in conf/pipeline/h3.yaml and facts/blocks.py; a Python literal of them elsewhere is a copy."""
    shifts = re.compile(r"(?<![\d.])(12\.0|0\.999)(?![\d])")
    linears = re.compile(re.escape(", ".join(f'"{p}"' for p in BLOCK_LINEARS)))
    copies = []
    for path in sorted((ROOT / "h3plan").rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(ROOT).as_posix()
        copies += [f"{rel}: {m.group(0)}" for m in shifts.finditer(text)]
        if rel != "h3plan/facts/blocks.py":
            copies += [f"{rel}: the block linears" for _ in linears.finditer(text.replace("'", '"'))]
    assert copies == []
