"""The package's Python entry points: torch-free import, resolve_config, lazy installer names."""

import subprocess
import sys

import pytest

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


def test_every_lever_export_is_a_public_name_of_its_install_module():
    """A lever's Spec `exports` are h3plan's names (in `__all__`), each its install module's function."""
    from h3plan.levers import EXPORTS

    assert EXPORTS and set(EXPORTS) <= set(h3plan.__all__)
    for fn, lever in EXPORTS.items():
        assert getattr(h3plan, fn) is getattr(__import__(f"h3plan.install.{lever}", fromlist=[fn]), fn)


def test_resolve_config_refuses_what_is_no_group_option():
    """A number or a list for a config group is an H3PlanError naming the fix, not Hydra's bare ValueError, and a
    list never quietly plans its last option."""
    import pytest

    with pytest.raises(h3plan.ConfigError) as e:
        h3plan.resolve_config(hardware=90)
    assert str(e.value) == ("hardware=90: a config group takes an option name as a string (hardware='sm90'); "
                            "available: sm100, sm103, sm107, sm90")
    with pytest.raises(h3plan.ConfigError) as e:
        h3plan.resolve_config(hardware=["sm90", "sm100"])
    assert str(e.value).startswith("hardware=['sm90', 'sm100']: one plan per call")
    assert "-m hardware=sm90,sm100" in str(e.value)


def test_resolve_config_values_keep_their_python_types():
    p = h3plan.resolve_config(**{"video.seconds": 10.0, "video.audio": False, "memory.check": True,
                                 "hardware.products": ["H100", "H200"], "parallel.seq_len": None})
    seq = p.derived_value("sequence")
    assert seq["frames"] == 243 and seq["audio_rows"] == 0
    assert seq["source"].endswith("video.seconds=10 video.audio=false")
    assert p.get("hardware")["products"] == ["H100", "H200"]


def _one_line(call, cls=h3plan.H3PlanError):
    import pytest

    with pytest.raises(cls) as e:
        call()
    assert "\n" not in str(e.value)
    return str(e.value)


def test_resolve_refuses_what_is_no_config_in_one_line():
    """resolve takes the composed config; a group choice, None or a command-line string is a UsageError that points at
    resolve_config, not a KeyError / TypeError from inside the planner."""
    assert _one_line(lambda: h3plan.resolve({"hardware": "sm90"}), h3plan.UsageError).startswith(
        "h3plan.resolve: hardware='sm90' is a group choice, not a config section; h3plan.resolve_config(")
    for bad, kind in ((None, "NoneType"), ("hardware=sm90", "str")):
        assert f"the composed config (a DictConfig, or a dict of its sections), got {kind}" in _one_line(
            lambda: h3plan.resolve(bad), h3plan.UsageError)
    assert _one_line(lambda: h3plan.resolve({}), h3plan.ConfigError).startswith("model: missing section")
    assert "takes group choices by name" in _one_line(lambda: h3plan.resolve_config("sm90"), h3plan.UsageError)


def test_plan_methods_refuse_bad_arguments_in_one_line(tmp_path, monkeypatch):
    plan = h3plan.resolve_config()
    assert _one_line(lambda: h3plan.Plan.from_json("{"),
                     h3plan.PlanFileError).startswith("not JSON (Expecting property name")
    assert _one_line(lambda: h3plan.Plan.from_yaml("a: [1"),
                     h3plan.PlanFileError).startswith("malformed YAML at line 1")
    assert "takes the JSON text, got NoneType" in _one_line(lambda: h3plan.Plan.from_json(None), h3plan.PlanFileError)
    e = _one_line(lambda: plan.decision("atention"), KeyError)
    assert e.startswith("Plan.decision('atention'): no such lever (did you mean 'attention'?); levers: gemm_quant,")
    monkeypatch.chdir(tmp_path)
    for bad, kind in ((None, "NoneType"), (123, "int")):
        assert _one_line(lambda: plan.save(bad), h3plan.PlanFileError) == \
            f"Plan.save takes a file path (str or os.PathLike), got {kind}"
    assert list(tmp_path.iterdir()) == []  # no file named None or 123
    plan.save(tmp_path / "p.json")  # a pathlib.Path is a path
    assert h3plan.Plan.load(tmp_path / "p.json") == plan


def test_install_names_without_torch_are_one_line():
    """With torch (and so diffusers) not importable, install / uninstall / prepare raise one UsageError line, not the
    import's ModuleNotFoundError; planning still works."""
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "diffusers", "triton"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
import h3plan
plan = h3plan.resolve_config(model="h3_tiny")
model = type("Model", (), {})()
for name, call in (("install", lambda: h3plan.install(model, plan)), ("uninstall", lambda: h3plan.uninstall(model)),
                   ("installed_plan", lambda: h3plan.installed_plan(model)),
                   ("prepare", lambda: h3plan.prepare(model, 30))):
    try:
        call()
    except h3plan.UsageError as e:
        print(e)
    else:
        raise SystemExit(name + " did not refuse")
assert "torch" not in sys.modules
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [x.partition(" needs torch, which is not installed here")[0] for x in lines] == [
        "h3plan.install", "h3plan.uninstall", "h3plan.installed_plan", "h3plan.prepare"], lines


@pytest.mark.parametrize("key,value,hint", [
    ("out", "plan.yaml", "plan.save(path) writes the plan"), ("format", "json", "plan.to_json() and plan.to_yaml()"),
    ("detail", "full", "plan.summary(detail=\"full\")"), ("plan", "p.yaml", "h3plan.Plan.load(path)"),
    ("action", "verify", "an action runs from the command line"), ("verify.blocks", 2, "an action runs from"),
    ("bench.best", "off", "an action runs from"), ("tune.quick", True, "an action runs from")])
def test_resolve_config_refuses_what_shapes_no_plan(key, value, hint):
    """out=, action=, format= ... do nothing to a plan: resolve_config refuses them in one line, never ignores them."""
    with pytest.raises(h3plan.UsageError) as e:
        h3plan.resolve_config(**{key: value})
    assert str(e.value).startswith(f"resolve_config({key}=...): {key.partition('.')[0]} is the command line's, not the "
                                   "plan's") and hint in str(e.value) and "\n" not in str(e.value)
    assert h3plan.resolve_config(strict=True).get("hardware")["name"] == "sm90"  # strict= decides what plans