"""Plan files read back: planned again from their own config, so what is derivable (losslessness, params, the
derived numbers) is the planner's and the rest is refused in one line (PlanFileError); Plan.save matches
Plan.load (JSON for .json in any case, else YAML); Plan.get refuses a name that is no section."""

import copy
import json
import warnings

import pytest

from h3plan import H3PlanError, Plan, PlanFileError
from h3plan.errors import H3PlanWarning
from h3plan.levers import LEVER_SETTINGS


@pytest.fixture(scope="module")
def fp8(plan):
    return plan("hardware=sm90", "recipe=fp8", "parallel=u1")


def _edit(p, fn):
    d = copy.deepcopy(p.to_dict())
    fn(d)
    return d


def _decision(d, lever):
    return next(x for x in d["decisions"] if x["lever"] == lever)


def _drop(d, n):
    d["decisions"] = d["decisions"][:n]


REFUSED = [
    ("lossy marked lossless", lambda d: _decision(d, "attention").update(lossless=True),
     "decision attention=cudnn_fp8 says lossless: true, but attention=cudnn_fp8 is lossy (h3plan/levers/attention.py "
     "SPEC)"),
    ("duplicated decision", lambda d: d["decisions"].append(copy.deepcopy(d["decisions"][3])), "appears twice"),
    ("unknown params", lambda d: _decision(d, "attention")["params"].update(bogus=1),
     "decision attention: unknown params bogus"),
    ("edited params", lambda d: _decision(d, "ring").update(params={"ring": 4}),
     "decision ring: unknown params ring; the planner gives none"),
    ("5 of the decisions", lambda d: _drop(d, 5), "a plan needs a decision for every lever; missing: fp8_scales, "
                                                  "qk_norm_rope, modulation,"),
    ("seq_len -1", lambda d: d["config"]["parallel"].update(seq_len=-1),
     "parallel.seq_len=-1: must be a positive integer"),
    ("seq_len off its request", lambda d: d["config"]["parallel"].update(seq_len=1000),
     "parallel.seq_len=1000, but its video request gives 37,820 tokens"),
    ("hardware sm999", lambda d: d["config"]["hardware"].update(name="sm999"),
     "hardware.name=sm999: disagrees with hardware.compute_capability=9.0"),
    ("no hardware section", lambda d: d["config"].pop("hardware"), "plan 'config' lacks the section(s) hardware"),
    ("a setting the config refuses", lambda d: _decision(d, "fa4_2cta").update(setting="on"),
     "its config and decisions do not plan: levers.fa4_2cta=on cannot apply: attention is cudnn_fp8: fa4_2cta=on needs "
     "fa4"),
    ("a setting the other decisions refuse", lambda d: _decision(d, "swiglu").update(setting="off"),
     "levers.fp8_act_quant=row cannot apply: swiglu is off"),
    # hand edits: refused in one line that names the edited field
    ("edited recipe name", lambda d: d["config"]["recipe"].update(name="bf16"),
     "config.recipe.name=bf16 does not match its recipe section: checkpoint 'fp8' (recipe bf16: 'bf16'), policy "
     "'budget'"),
    ("no schema_version", lambda d: d.pop("schema_version"), "plan lacks schema_version (this h3plan reads 1;"),
    ("unknown decision key", lambda d: _decision(d, "attention").update(bogus=1),
     "decision attention: unknown key 'bogus'; keys: lever, setting, lossless, reasons, forced, params, "
     "hardware_verified"),
    ("unknown plan key", lambda d: d.update(extra=1), "plan has unknown key 'extra'; keys: schema_version, config,"),
    ("edited attention", lambda d: _decision(d, "attention").update(setting="fa4", lossless=True),
     "decision attention=fa4 (its config plans cudnn_fp8): its config and decisions do not plan: "
     "levers.fp8_scales=dynamic"),
]


@pytest.mark.parametrize("name, edit, message", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_in_one_line(fp8, tmp_path, name, edit, message):
    d = _edit(fp8, edit)
    with pytest.raises(PlanFileError) as e:
        Plan.from_dict(d)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    with pytest.raises(PlanFileError, match=r"^plan file .*plan.json: "):
        Plan.load(str(path))


def test_derived_numbers_and_notes_are_recomputed(fp8):
    d = _edit(fp8, lambda d: (d["derived"].update(memory_peak_gib_per_gpu=1.0, seq_len=5),
                              d.update(notes=["lossless!"])))
    with pytest.warns(H3PlanWarning):
        p = Plan.from_dict(d)
    assert p == fp8 and p.derived_value("memory_peak_gib_per_gpu") == fp8.derived_value("memory_peak_gib_per_gpu")
    assert not p.lossless and p.notes == fp8.notes


def test_replaced_hand_edits_are_said_at_load(fp8, tmp_path):
    """A saved plan's derived values, reasons and notes come from its config: an edit of them is replaced, and the load
    says which, in one line naming the file; an unedited file (or one that leaves them out) loads silently."""
    path = tmp_path / "plan.yaml"
    fp8.save(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Plan.load(str(path)) == fp8
        bare = _edit(fp8, lambda d: (d.pop("derived"), d.pop("notes"), [x.pop("reasons") for x in d["decisions"]]))
        Plan.from_dict(bare)
    d = _edit(fp8, lambda d: (d["derived"].update(forward_s_est=1.0),
                              _decision(d, "attention").update(reasons=["mine"])))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    with pytest.warns(H3PlanWarning) as w:
        p = Plan.load(str(path))
    (line,) = [str(x.message) for x in w]
    assert line.startswith(f"plan file {path}: derived.forward_s_est, the reasons of attention differ from what its "
                           "config plans, replaced") and "\n" not in line
    assert p == fp8 and p.derived_value("forward_s_est") != 1.0


def test_a_hand_chosen_setting_is_planned_as_forced(plan, fp8):
    """A setting the config did not pick, but allows, loads as if forced on the command line."""
    d = _edit(fp8, lambda d: _decision(d, "gated_residual").update(setting="off"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its reasons and numbers are planned for the chosen setting, as documented
        p = Plan.from_dict(d)
    want = plan("hardware=sm90", "recipe=fp8", "parallel=u1", "levers.gated_residual=off")
    assert p == want and p.decision("gated_residual").forced and p.get("levers")["gated_residual"] == "off"


def test_round_trips_every_packaged_hardware(preset, tmp_path):
    for hw in ("sm90", "sm100", "sm103", "sm107"):
        p = preset(hw, "fp8", "u4")
        assert Plan.from_dict(p.to_dict()) == p and [d.lever for d in p.decisions] == list(LEVER_SETTINGS)


@pytest.mark.parametrize("name, fmt", [("p.yaml", "yaml"), ("p.yml", "yaml"), ("p.json", "json"), ("p.JSON", "json"),
                                       ("plan", "yaml")])
def test_save_matches_load(fp8, tmp_path, name, fmt):
    path = tmp_path / name
    fp8.save(str(path))
    text = path.read_text()
    assert (text.lstrip().startswith("{")
            and json.loads(text)["schema_version"] == 1) if fmt == "json" else text.startswith("schema_version: 1")
    assert Plan.load(str(path)) == fp8 and Plan.load(path) == fp8


def test_save_to_an_unwritable_path(fp8, tmp_path):
    with pytest.raises(PlanFileError, match=r"plan file .*/nope/p.yaml: cannot write it \(No such file or directory\)"):
        fp8.save(str(tmp_path / "nope" / "p.yaml"))


def test_get_refuses_a_name_that_is_no_section(fp8):
    assert fp8.get("hardware")["name"] == "sm90"
    with pytest.raises(KeyError) as e:
        fp8.get("hardwre")
    assert isinstance(e.value, H3PlanError)
    assert str(e.value) == ("Plan.get('hardwre'): no such config section (did you mean 'hardware'?); sections: "
                            "hardware, recipe, parallel, model, vae, video, pipeline, memory, levers")


def test_an_edited_attention_is_named_not_a_later_lever(plan):
    """bf16 on sm90 with attention edited to sdpa: fa4_2cta's params then differ, and the line leads with the edit."""
    d = _edit(plan("hardware=sm90", "recipe=bf16", "parallel=u1"),
              lambda d: _decision(d, "attention").update(setting="sdpa"))
    with pytest.raises(PlanFileError) as e:
        Plan.from_dict(d)
    assert str(e.value).startswith("decision attention=sdpa (its config plans fa4): decision fa4_2cta: "
                                   "params.attention")


def test_an_edited_recipe_name_is_refused_from_a_bf16_plan(plan):
    """A bf16 plan whose recipe.name says fp8 would have every reason say 'recipe fp8 is lossless'."""
    d = _edit(plan("hardware=sm90", "recipe=bf16", "parallel=u1"), lambda d: d["config"]["recipe"].update(name="fp8"))
    with pytest.raises(PlanFileError, match=r"^config.recipe.name=fp8 does not match its recipe section: checkpoint "
                                            r"'bf16'"):
        Plan.from_dict(d)


def test_each_dict_merges_onto_a_fresh_schema(fp8):
    """schema.to_plain merges a dict onto the schema node it builds once a process: one dict's values never reach
    the next (a plan file read back after another, edited one)."""
    from h3plan.planning import schema

    config = fp8.to_dict()["config"]
    edited = _edit(fp8, lambda d: (d["config"]["parallel"].update(seq_len=4096),
                                   d["config"]["levers"].update(swiglu="off")))
    assert config["parallel"]["seq_len"] != 4096 and config["levers"]["swiglu"] != "off"
    plain = schema.to_plain(edited["config"])
    assert (plain["parallel"]["seq_len"], plain["levers"]["swiglu"]) == (4096, "off")
    assert (schema._schema_node().parallel.seq_len, schema._schema_node().levers.swiglu) == (None, "auto")
    again = schema.to_plain(config)
    assert (again["parallel"], again["levers"]) == (config["parallel"], config["levers"])
