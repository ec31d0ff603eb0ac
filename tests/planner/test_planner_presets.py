"""Every packaged hardware x recipe x parallel preset, nothing forced: a valid plan, or a one-line refusal whose
reason names a choice the user made (hardware, recipe, parallel) -- never one lever refusing another lever's
auto pick, and never a suggestion of a setting that does not exist."""

import os
import re

import pytest

from h3plan.planning.config import CONFIG_PATH
from h3plan.errors import H3PlanError
from h3plan.levers import LEVER_SETTINGS


def _options(group):
    return sorted(f[:-5] for f in os.listdir(os.path.join(CONFIG_PATH, group)) if f.endswith(".yaml"))


HARDWARE, RECIPES, PARALLEL = _options("hardware"), _options("recipe"), _options("parallel")
# `<lever>=<setting>:` without `levers.` in front: a reason that blames another lever's decision
CONFLICT = re.compile(r"(?<![.\w])(" + "|".join(LEVER_SETTINGS) + r")=\w+:")


def test_every_preset_is_covered():
    assert {"sm90", "sm100", "sm103", "sm107"} <= set(HARDWARE) and "r2u4" in PARALLEL and len(RECIPES) >= 3


@pytest.mark.parametrize("hw", HARDWARE)
def test_presets_plan_or_refuse_naming_a_user_choice(preset, hw):
    valid = 0
    for recipe in RECIPES:
        for par in PARALLEL:
            try:
                p = preset(hw, recipe, par)
            except H3PlanError as e:
                msg = str(e)
                where = f"{hw} {recipe} {par}: {msg}"
                assert "\n" not in msg and not msg.startswith("internal"), where
                assert not CONFLICT.search(msg), where
                for lever, setting in re.findall(r"levers\.(\w+)=(\w+)", msg):
                    assert setting in ("auto",) + LEVER_SETTINGS[lever], where  # every suggestion is a real setting
                named = (f"recipe {recipe}" in msg or "recipe." in msg or "parallel." in msg or hw in msg
                         or "hardware." in msg)
                assert named, where
                continue
            valid += 1
            assert [d.lever for d in p.decisions] == list(LEVER_SETTINGS)
            assert not any(d.forced for d in p.decisions)
            assert p.lossless or recipe != "bf16"  # a lossless recipe never gets a lossy auto pick
    assert valid, f"{hw}: no preset combination plans"
