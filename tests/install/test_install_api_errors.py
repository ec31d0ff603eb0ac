"""What a new user hit, from the Python API: every mistake is an h3plan error with one line (the CLI's own
message), never a raw Hydra / YAML / KeyError / AttributeError."""

import json

import pytest
from install_helpers import tiny_model

import h3plan
from h3plan.errors import ConfigError, H3PlanError, InstallError, PlanFileError, PlanningError


@pytest.mark.parametrize("kwargs, cls, message", [
    (dict(hardwre="sm90"), ConfigError, "hardwre: unknown key (did you mean hardware?); allowed: "),
    (dict(hardware="sm91"), ConfigError, "hardware=sm91: no such option; available: sm100, sm103, sm107, sm90"),
    ({"recipe": "bf16", "levers.attention": "cudnn_fp8"}, PlanningError,
     "levers.attention=cudnn_fp8 cannot apply: recipe bf16 has policy lossless and attention=cudnn_fp8 is lossy"),
    ({"verify.blocks": 0}, ConfigError, "verify.blocks=0: must be >= 1"),
])
def test_resolve_config_raises_one_line_h3plan_errors(kwargs, cls, message):
    with pytest.raises(cls) as e:
        h3plan.resolve_config(**kwargs)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_plan_load_names_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("decisions: [1\n")
    with pytest.raises(PlanFileError, match=r"plan file .*bad.yaml: malformed YAML at line 2"):
        h3plan.Plan.load(str(bad))
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(PlanFileError, match=r"empty.json: a plan needs a non-empty 'decisions' list"):
        h3plan.Plan.load(str(empty))
    with pytest.raises(PlanFileError, match=r"missing.yaml: No such file"):
        h3plan.Plan.load(str(tmp_path / "missing.yaml"))
    p = h3plan.resolve_config()
    d = p.to_dict()
    d["decisions"][0]["setting"] = "int3"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(d))
    with pytest.raises(PlanFileError, match=r"gemm_quant=int3 is not one of its settings: bf16, fp8, nvfp4, dequant_bf16"):
        h3plan.Plan.load(str(edited))


def test_public_names_resolve():
    assert issubclass(h3plan.PlanningError, H3PlanError)
    h3plan.reset_counters()
    c = h3plan.counters()
    assert isinstance(c, dict) and c.reasons == h3plan.fallback_reasons()
    assert str(c) == "(no guarded calls)"


def test_a_plan_for_other_widths_is_refused():
    model = tiny_model()  # 4 heads x 32, hidden 96
    with pytest.raises(InstallError, match=r"resolved for model=h3, which does not match this MiniMaxH3Transformer3DModel: "
                                           r"num_attention_heads 56 \(model: 4\)"):
        h3plan.install(model, h3plan.resolve_config())
    h3plan.install(model, h3plan.resolve_config(model="h3_tiny"))
    assert h3plan.uninstall(model)


def test_install_takes_a_plan_file_path(tmp_path):
    """install(model, "plan.yaml") loads the file (Plan.load: planned again from its config) and installs it; a
    path that is no plan file is a PlanFileError naming it."""
    model = tiny_model()
    plan = h3plan.resolve_config(model="h3_tiny")
    path = tmp_path / "plan.yaml"
    plan.save(str(path))
    h3plan.install(model, str(path))
    assert h3plan.installed_plan(model) == plan
    assert h3plan.uninstall(model)
    h3plan.install(model, path)  # a pathlib.Path too
    assert h3plan.uninstall(model)
    with pytest.raises(PlanFileError, match=r"^plan file .*none.yaml: No such file"):
        h3plan.install(model, str(tmp_path / "none.yaml"))
