"""`python -m h3plan plan=FILE`: a saved plan read, checked (Plan.load plans it again from its own config) and
printed, or handed to an action with the plan's own sections (its model, not the default); a group override beside
it, or a sweep over it, is one line."""

import sys
import types

from h3plan import Plan, cli


def _saved(tmp_path, *args):
    path = tmp_path / "plan.yaml"
    assert cli.run([*args, f"out={path}", "format=yaml"]) == 0
    return path


def test_saved_plan_prints_as_planned(capsys, tmp_path):
    path = _saved(tmp_path, "recipe=fp8", "model=h3_tiny")
    fresh = capsys.readouterr().out
    assert cli.run([f"plan={path}", "format=yaml"]) == 0
    assert capsys.readouterr().out == fresh == Plan.load(str(path)).to_yaml()
    assert cli.run([f"plan={path}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("h3plan  hardware=sm90 (H200, 141 GB)  recipe=fp8 (budget")
    assert "model=h3_tiny" in out.splitlines()[0]
    assert out.splitlines()[-1] == f"plan read from {path} and checked: its config plans these settings again"


def test_a_saved_plan_with_hand_edited_numbers_says_they_were_replaced(capsys, tmp_path):
    path = _saved(tmp_path, "model=h3_tiny")
    capsys.readouterr()
    text = path.read_text()
    assert "\n  forward_s_est: " in text
    path.write_text("\n".join("  forward_s_est: 0.001" if x.startswith("  forward_s_est: ") else x
                              for x in text.split("\n")))
    assert cli.run([f"plan={path}"]) == 0
    out, err = capsys.readouterr()
    assert err == (f"h3plan: warning: plan file {path}: derived.forward_s_est differs from what its config plans, "
                   "replaced (derived numbers, reasons and notes come from the config; edited by hand, or saved by "
                   "another h3plan version: change the config and plan again)\n")
    assert "0.001" not in out


def test_saved_plan_is_checked(capsys, tmp_path):
    path = _saved(tmp_path, "recipe=fp8")
    capsys.readouterr()
    path.write_text(path.read_text().replace("setting: fp8\n", "setting: nvfp4\n", 1))
    assert cli.run([f"plan={path}"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"h3plan: error: plan file {path}: "), err


def test_an_action_gets_the_saved_plans_sections(capsys, monkeypatch, tmp_path):
    path = _saved(tmp_path, "recipe=fp8", "model=h3_tiny")
    seen = {}

    def fake_run(cfg, plan):
        seen.update(model=cfg.model.name, recipe=cfg.recipe.name, gemm=plan.decision("gemm_quant").setting)
        return 0

    monkeypatch.setitem(sys.modules, "h3plan.actions.verify", types.SimpleNamespace(run=fake_run))
    assert cli.run([f"plan={path}", "action=verify"]) == 0
    assert seen == {"model": "h3_tiny", "recipe": "fp8", "gemm": "fp8"}


def test_a_group_override_or_a_sweep_beside_a_saved_plan_is_one_line(capsys, tmp_path):
    path = _saved(tmp_path)
    capsys.readouterr()
    assert cli.run([f"plan={path}", "recipe=fp8", "levers.attention=sdpa"]) == 2
    assert capsys.readouterr().err == (f"h3plan: error: plan={path} is a saved plan, planned already: recipe=fp8 "
                                       "levers.attention=sdpa would be ignored; plan anew without plan= (python -m "
                                       "h3plan recipe=fp8 levers.attention=sdpa out=plan.yaml)\n")
    assert cli.run(["-m", f"plan={path}", "recipe=bf16,fp8"]) == 2
    assert capsys.readouterr().err == ("h3plan: error: plan=FILE reads one saved plan: a sweep (-m) plans its own "
                                       "combinations\n")


def test_print_plan_gives_the_summary_the_cli_prints(capsys, tmp_path):
    import pytest

    import h3plan

    assert cli.run(["recipe=fp8"]) == 0
    printed = capsys.readouterr().out
    plan = h3plan.resolve_config(recipe="fp8")
    print(plan)
    assert capsys.readouterr().out == printed + "\n" and str(Plan.load(str(_saved(tmp_path, "recipe=fp8")))) == printed
    assert plan.summary("full") == cli.render_table(plan) and repr(plan).startswith("Plan(config=")
    with pytest.raises(h3plan.UsageError, match=r"Plan.summary\(detail='x'\): allowed: summary, full"):
        plan.summary("x")
