"""Every source a plan cites opens from a checkout: each file path named in the hardware, recipe, parallel,
model and VAE configs and in every lever's reasons exists, and each docs/sources.md#anchor is a heading
there. Seeds and the design brief that live outside the repository are cited through docs/sources.md."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+[\w.-]+\.(?:json|md|py|log|yaml|csv|png)(?:#[\w-]+)?)")
ANCHORS = {m.group(1) for m in re.finditer(r"^## ([\w-]+)\s*$", (ROOT / "docs/sources.md").read_text(), re.M)}


def _strings(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _strings(v)
    elif isinstance(x, str):
        yield x


def _cited_texts(plans):
    for p in plans:
        for section in ("hardware", "recipe", "parallel", "model", "vae"):
            yield from _strings(p.get(section))
        for d in p.decisions:
            yield from d.reasons
        yield from p.notes


@pytest.fixture(scope="module")
def texts(preset_plans):
    return set(_cited_texts(preset_plans.values()))


@pytest.mark.slow  # the texts of every preset's plan (~10 s to plan them)
def test_every_cited_path_opens(texts):
    missing = set()
    for t in texts:
        for ref in PATH.findall(t):
            path, _, anchor = ref.partition("#")
            if not (ROOT / path).is_file():
                missing.add(path)
            elif anchor and path == "docs/sources.md" and anchor not in ANCHORS:
                missing.add(ref)
    assert not missing, sorted(missing)


@pytest.mark.slow
def test_nothing_cites_files_outside_the_repository(texts):
    outside = {t for t in texts if re.search(r"DESIGN\.md|\.txt\b|(?<![\w/])anchors/", t)}
    assert not outside, sorted(outside)[:5]
