"""The package's Python entry points: torch-free import, resolve_config, lazy installer names."""

import subprocess
import sys

import h3plan


def test_import_is_light():
    code = "import sys, h3plan; h3plan.Plan; assert 'torch' not in sys.modules and 'hydra' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_resolve_config_matches_cli_defaults():
    plan = h3plan.resolve_config(hardware="sm107", recipe="nvfp4", parallel="u8")
    assert plan.decision("attention").setting == "cudnn_fp8"
    assert plan.get("parallel")["ulysses"] == 8
    plan2 = h3plan.resolve_config(hardware="sm90", recipe="bf16", parallel="u1", **{"levers.attention": "sdpa"})
    assert plan2.decision("attention").setting == "sdpa" and plan2.decision("attention").forced


def test_unknown_name_is_an_attribute_error():
    try:
        h3plan.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("expected AttributeError")


def test_lazy_installer_names():
    assert callable(h3plan.install) and callable(h3plan.uninstall) and callable(h3plan.counters)
