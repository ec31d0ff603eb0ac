"""What a new user hit, from the Python API: every mistake is an h3plan error with one line (the CLI's own
message), never a raw Hydra / YAML / KeyError / AttributeError."""

import json

import pytest
from install_helpers import tiny_model

import h3plan
from h3plan.errors import ConfigError, H3PlanError, InstallError, PlanFileError, PlanningError, UsageError


@pytest.mark.parametrize("kwargs, cls, message", [
    (dict(hardwre="sm90"), ConfigError, "hardwre: unknown key (did you mean hardware?); allowed: "),
    (dict(hardware="sm91"), ConfigError, "hardware=sm91: no such option; available: sm100, sm103, sm107, sm90"),
    ({"recipe": "bf16", "levers.attention": "cudnn_fp8"}, PlanningError,
     "levers.attention=cudnn_fp8 cannot apply: recipe bf16 has policy lossless and attention=cudnn_fp8 is lossy"),
    ({"verify.blocks": 0}, UsageError, "resolve_config(verify.blocks=...): verify is the command line's, not the "
                                       "plan's"),
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
    with pytest.raises(PlanFileError, match=r"gemm_quant=int3 is not one of its settings: bf16, fp8, nvfp4, "
                                            r"dequant_bf16"):
        h3plan.Plan.load(str(edited))


def test_public_names_resolve():
    assert issubclass(h3plan.PlanningError, H3PlanError)
    h3plan.reset_counters()
    c = h3plan.counters()
    assert isinstance(c, dict) and c.reasons == h3plan.fallback_reasons()
    assert str(c) == "(no guarded calls)"


def test_a_plan_for_other_widths_is_refused():
    model = tiny_model()  # 4 heads x 32, hidden 96
    with pytest.raises(InstallError, match=r"resolved for model=h3, which does not match this "
                                           r"MiniMaxH3Transformer3DModel: num_attention_heads 56 \(model: 4\)"):
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


def _line(call, cls=H3PlanError) -> str:
    with pytest.raises(cls) as e:
        call()
    assert "\n" not in str(e.value)
    return str(e.value)


def test_bad_arguments_are_one_line():
    """A stray keyword, None for the model, a step count diffusers refuses or a string, prepare
    on a model with no plan: each one InstallError / UsageError line, never TypeError, AttributeError or ValueError."""
    model = tiny_model()
    plan = h3plan.resolve_config(model="h3_tiny")
    assert _line(lambda: h3plan.install(model, plan, bogus=1), h3plan.UsageError).startswith(
        "install got an unexpected keyword bogus=; it takes plan, recipe=,")
    for name, call in (("uninstall", lambda: h3plan.uninstall(None)),
                       ("installed_plan", lambda: h3plan.installed_plan(None))):
        assert _line(call, InstallError).startswith(f"{name} expects a diffusers MiniMaxH3Transformer3DModel,")
        assert _line(call, InstallError).endswith("got NoneType")
    assert _line(lambda: h3plan.prepare(None, 30),
                 InstallError).startswith("prepare expects a MiniMaxH3Transformer3DModel")
    assert _line(lambda: h3plan.prepare(model, 30), InstallError).startswith(
        "prepare: no h3plan plan is installed in this MiniMaxH3Transformer3DModel")
    assert _line(lambda: h3plan.install(model, plan, num_inference_steps=[0]), InstallError).startswith(
        "install: num_inference_steps=[0] must be an integer or a list of them; each must be >= 2: diffusers'")
    assert h3plan.installed_plan(model) is None  # refused before anything was swapped
    h3plan.install(model, plan)
    try:
        assert _line(lambda: h3plan.prepare(model, num_inference_steps="30"), InstallError).startswith(
            "prepare: num_inference_steps='30' must be an integer or a list of them")
        assert h3plan.prepare(model, num_inference_steps=[30]) >= 0
    finally:
        assert h3plan.uninstall(model)


def test_layer_counts_more_than_planned_are_refused_fewer_said():
    """A plan for 2 blocks into a 3-block model: InstallError naming num_layers (its tables and memory count 2); a
    1-block model (as verify and bench build them) installs, and the report says it has fewer."""
    from install_helpers import TINY

    from h3plan.actions.inputs import build_model

    plan = h3plan.resolve_config(model="h3_tiny")
    more = build_model({**TINY, "num_layers": 3})
    assert _line(lambda: h3plan.install(more, plan), InstallError).startswith(
        "the plan was resolved for 2 layers (model.diffusers_config.num_layers=2), this MiniMaxH3Transformer3DModel "
        "has 3")
    report = h3plan.install(more, plan, stand_in=True)  # verify and bench: a few blocks of the plan's width, any count
    assert not any("fewer layers" in n for n in report.notes) and h3plan.uninstall(more)
    fewer = build_model({**TINY, "num_layers": 1})
    report = h3plan.install(fewer, plan)
    try:
        assert any(n.startswith("fewer layers than the plan's: num_layers 1 (plan: 2)")
                   for n in report.notes), report.notes
    finally:
        assert h3plan.uninstall(fewer)


def test_a_plan_that_cannot_run_where_the_model_is_says_so_at_install(monkeypatch, caplog):
    """On a machine with no CUDA device, outside Triton's interpreter, every kernel call of an sm90 plan falls back:
    install says so in one line (a warning on the h3plan.install logger, and a report note); in the interpreter (these
    tests) the kernels run and it says nothing."""
    import logging

    from h3plan.runtime.kernels import _common

    model, plan = tiny_model(), h3plan.resolve_config(model="h3_tiny")
    with caplog.at_level(logging.WARNING, logger="h3plan.install"):
        report = h3plan.install(model, plan)
    assert not report.warnings and not caplog.records and h3plan.uninstall(model)
    monkeypatch.setattr(_common, "INTERPRET", False)
    with caplog.at_level(logging.WARNING, logger="h3plan.install"):
        report = h3plan.install(model, plan)
    try:
        (record,) = caplog.records
        line = record.getMessage()
        assert line.startswith("h3plan.install: the plan is for sm90 GPUs and this machine has no CUDA device: on the "
                               "CPU every call of its kernels falls back to diffusers' own code") and "\n" not in line
        assert report.warnings == [line.partition(": ")[2]] and report.warnings[0] in report.notes
    finally:
        assert h3plan.uninstall(model)


def test_a_second_install_says_it_replaced_the_first(caplog):
    import logging

    model = tiny_model()
    bf16, fp8 = h3plan.resolve_config(model="h3_tiny"), h3plan.resolve_config(model="h3_tiny", recipe="fp8")
    h3plan.install(model, bf16)
    with caplog.at_level(logging.WARNING, logger="h3plan.install"):
        assert h3plan.install(model, bf16).warnings == [] and not caplog.records  # the same plan: nothing to do
        report = h3plan.install(model, fp8)
    try:
        (record,) = caplog.records
        assert record.getMessage() == ("h3plan.install: replaced the plan installed before (sm90/bf16/u1) with this "
                                       "one (sm90/fp8/u1); the first was uninstalled, bit for bit")
        assert h3plan.installed_plan(model) == fp8 and report.warnings[0] in report.notes
    finally:
        assert h3plan.uninstall(model)


def test_uninstall_and_installed_plan_refuse_what_is_no_model_alike():
    """None and an nn.Linear get the same InstallError line (neither holds a plan h3plan could have installed); a model
    with nothing installed answers False / None."""
    import torch

    for obj, got in ((None, "NoneType"), (torch.nn.Linear(3, 3), "Linear")):
        for name, call in (("uninstall", h3plan.uninstall), ("installed_plan", h3plan.installed_plan)):
            assert _line(lambda: call(obj), InstallError) == (
                f"{name} expects a diffusers MiniMaxH3Transformer3DModel, AutoencoderKLMiniMaxH3 or "
                f"MiniMaxH3ModularPipeline, got {got}")
    model = tiny_model()
    assert h3plan.uninstall(model) is False and h3plan.installed_plan(model) is None


def test_counters_keep_counting_across_uninstall_as_documented():
    """uninstall leaves h3plan.counters() as they are (its docstring says so); reset_counters() zeroes them."""
    from install_helpers import forward, tiny_inputs

    assert "h3plan.reset_counters() zeroes them" in " ".join(h3plan.uninstall.__doc__.split())
    model, plan = tiny_model(), h3plan.resolve_config(model="h3_tiny", **{"levers.attention": "sdpa"})
    h3plan.reset_counters()
    h3plan.install(model, plan)
    forward(model, tiny_inputs())
    counted = dict(h3plan.counters())
    assert counted and h3plan.uninstall(model)
    assert dict(h3plan.counters()) == counted
    h3plan.reset_counters()
    assert dict(h3plan.counters()) == {}
