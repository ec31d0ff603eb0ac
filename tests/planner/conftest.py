"""Compose configs in-process and resolve plans.

A full compose costs ~0.2 s through Hydra (~0.03 s through planning/direct.py, which builds Hydra's own config node by
node: tests/cli/test_direct_compose.py), so each group option is composed once and combinations are assembled from
those sections (config.yaml sets nothing inside a group, so this is what Hydra would compose); dotted overrides are
parsed by Hydra's override parser and applied with OmegaConf.update, which validates them against the schema like a
command-line override.
"""

import copy
import functools

import pytest

GROUPS = ("hardware", "recipe", "parallel", "model", "vae", "video", "pipeline")


@functools.lru_cache(maxsize=None)
def _hydra_compose(*overrides):
    """Hydra's compose(config_name="config", overrides): planning/direct.py's where it composes the overrides (less the
    hardware option it records, which Hydra's compose alone leaves unset), Hydra's own otherwise."""
    from hydra import compose, initialize_config_dir

    from h3plan.planning import config, direct, schema

    with config.libyaml():
        cfg = direct.compose(list(overrides))
    if cfg is not None:
        cfg.hardware.option = None
        return cfg
    schema.register()
    with initialize_config_dir(config_dir=config.CONFIG_PATH, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@functools.lru_cache(maxsize=128)
def _grouped(*group_overrides):
    """The packaged config with these group options (`group=option`, in order), assembled from the per-group composes;
    cached per sequence (a test module plans a few presets many times): callers deep-copy it."""
    cfg = copy.deepcopy(_hydra_compose())
    for o in group_overrides:
        key = o.split("=", 1)[0]
        cfg[key] = _hydra_compose(o)[key]  # OmegaConf deep-copies a node it sets (the cached one stays as it was)
    return cfg


def compose_config(*overrides):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    leading = next((i for i, o in enumerate(overrides) if o.split("=", 1)[0] not in GROUPS), len(overrides))
    cfg = copy.deepcopy(_grouped(*overrides[:leading]))
    parser = OverridesParser.create()
    for o in overrides[leading:]:
        key, value = o.split("=", 1)
        if key in GROUPS:
            cfg[key] = _hydra_compose(o)[key]
        else:
            OmegaConf.update(cfg, key, parser.parse_override(o).value(), merge=False)
    return cfg


@pytest.fixture(scope="session")
def compose():
    return compose_config


@pytest.fixture(scope="session")
def plan():
    from h3plan.planner import resolve

    return lambda *overrides: resolve(compose_config(*overrides))


@pytest.fixture(scope="session")
def preset(plan):
    """preset(hw, recipe, parallel): the plan of three group presets, nothing forced, resolved once a session
    (the presets table, the forced-policy grid and the plan-file round trips share them); the H3PlanError
    a combination raises is raised again."""
    from h3plan.errors import H3PlanError

    memo = {}

    def _preset(hw, recipe, par):
        if (hw, recipe, par) not in memo:
            try:
                memo[hw, recipe, par] = plan(f"hardware={hw}", f"recipe={recipe}", f"parallel={par}")
            except H3PlanError as e:
                memo[hw, recipe, par] = e
        if isinstance(memo[hw, recipe, par], H3PlanError):
            raise memo[hw, recipe, par]
        return memo[hw, recipe, par]

    return _preset
