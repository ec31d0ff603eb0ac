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


def test_resolve_config_refuses_what_is_no_group_option():
    """A number or a list for a config group is an H3PlanError naming the fix, not Hydra's bare ValueError, and a
    list never quietly plans its last option."""
    import pytest

    with pytest.raises(h3plan.ConfigError) as e:
        h3plan.resolve_config(hardware=90)
    assert str(e.value) == ("hardware=90: a config group takes an option name as a string (hardware='sm90'); available: "
                            "sm100, sm103, sm107, sm90")
    with pytest.raises(h3plan.ConfigError) as e:
        h3plan.resolve_config(hardware=["sm90", "sm100"])
    assert str(e.value).startswith("hardware=['sm90', 'sm100']: one plan per call") and "-m hardware=sm90,sm100" in str(e.value)


def test_resolve_config_values_keep_their_python_types():
    p = h3plan.resolve_config(**{"video.seconds": 10.0, "video.audio": False, "memory.check": True,
                                 "bench.seq_lens": [64, 128], "parallel.seq_len": None})
    seq = p.derived_value("sequence")
    assert seq["frames"] == 243 and seq["audio_rows"] == 0 and seq["source"].endswith("video.seconds=10 video.audio=false")
