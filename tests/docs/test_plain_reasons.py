"""Reasons in plain words: an outside source is named by what it is (h3plan/sources.py, one place) with its
docs/sources.md anchor, never by internal shorthand ("the TRT-LLM seed", "recipe rows U1/U4")."""

import re
from pathlib import Path

import pytest

from h3plan.sources import NAMES, cite

ROOT = Path(__file__).resolve().parents[2]
ANCHORS = set(re.findall(r"^## ([\w-]+)\s*$", (ROOT / "docs/sources.md").read_text(), re.M))
SHORTHAND = re.compile(r"\bseed\b(?![\w-]*\))|\bU[1248](?:/U\d)?\b|\brecipe rows\b|\blever \d")


def test_every_named_source_has_its_section():
    assert set(NAMES) <= ANCHORS
    assert cite("trtllm-seed") == "TensorRT-LLM's MiniMax-H3 deployment on SM107 (docs/sources.md#trtllm-seed)"
    with pytest.raises(KeyError):
        cite("no-such-source")


@pytest.mark.slow  # plans every hardware x recipe x degree preset first (~12 s)
def test_no_reason_speaks_in_shorthand(preset_plans):
    bad = set()
    for plan in preset_plans.values():
        texts = [r for d in plan.decisions
                 for r in d.reasons] + list(plan.notes) + list(plan.derived_value("basis").values())
        for t in texts:
            # a docs/sources.md#...-seed anchor is a link, not shorthand; so is the row a measured point names in
            # its results file ("benchmarks/anchors/h200-fa4.json (backend fa4, shape U8@38k: TFLOPs)": the file's key)
            plain = re.sub(r"docs/sources\.md#[\w-]+", "", t)
            if SHORTHAND.search(re.sub(r"benchmarks/[\w/.-]+\.json(?: at commit \w+)? \([^()]*\)", "", plain)):
                bad.add(t)
    assert not bad, sorted(bad)[:5]
