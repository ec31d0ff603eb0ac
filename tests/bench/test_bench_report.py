"""The bench action's pure parts: options, labels, the record schema, merging, JSON and markdown."""

from __future__ import annotations

import json

import pytest

import h3plan

from h3plan.actions import bench
from h3plan.planner import make_plan
from h3plan.facts.decision import make_decision

from bench_fake import record, records


def _cfg(**over):
    b = {"seq_lens": [19000, 37820], "blocks": [1, 4], "warmup": 3, "iters": 10, "out_dir": "x", "tag": None}
    b.update(over)
    return {"bench": b}


def test_options_accepts_the_defaults():
    o = bench.options(_cfg())
    assert (o.seq_lens, o.blocks, o.warmup, o.iters, o.tag, o.best) == ((19000, 37820), (1, 4), 3, 10, None, True)


@pytest.mark.parametrize("value, best", [("on", True), ("off", False),
                                         pytest.param("true", True, marks=pytest.mark.slow),
                                         # a CPU bench run a case (~1 s)
                                         pytest.param("false", False, marks=pytest.mark.slow)])
def test_bench_best_is_an_on_off_switch_defaulting_on(value, best):
    import h3plan
    from h3plan.planning.config import compose

    assert compose([])["bench"]["best"] is True
    cfg = compose([f"bench.best={value}"])
    assert bench.options(cfg).best is best
    h3plan.resolve(cfg)  # validates like every bench.* key


@pytest.mark.parametrize("over, key", [
    ("iters=0", "bench.iters"), ("warmup=-1", "bench.warmup"), ("seq_lens=[]", "bench.seq_lens"),
    ("blocks=[0]", "bench.blocks"), ("tag=a/b", "bench.tag"), ("best=maybe", "bench.best"),
])
def test_bad_bench_values_are_one_line_config_errors(over, key):
    """Checked with the config (h3plan.planning.schema.validate_actions), before any action runs."""
    import h3plan

    from h3plan.planning.config import compose

    with pytest.raises(h3plan.ConfigError) as e:
        h3plan.resolve(compose([f"bench.{over}"]))
    assert str(e.value).startswith(key) and "\n" not in str(e.value)


def test_plan_label_names_groups_and_forced_levers():
    decisions = [make_decision("attention", "cudnn_bf16", True, ["forced"], forced=True),
                 make_decision("modulation", "exact", True, ["auto"])]
    plan = make_plan({"hardware": {"name": "sm90"}, "recipe": {"name": "bf16"},
                      "parallel": {"name": "u1", "ulysses": 1}},
                     {}, decisions)
    assert bench.plan_label(plan) == "sm90/bf16/u1 +attention=cudnn_bf16"
    assert bench.plan_label(h3plan.resolve_config(tier="quality")) == "sm90/fp8/u1 tier=quality"


@pytest.mark.parametrize("name, tag", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                       ("NVIDIA B200", "b200"), ("cpu", "cpu"), ("Weird Card", "weird-card")])
def test_device_tag(name, tag):
    assert bench.device_tag(name) == tag


def test_same_backend_plan_keeps_only_the_attention_levers():
    ds = [make_decision("gemm_quant", "bf16", True, ["r"]), make_decision("attention", "fa4", True, ["r"]),
          make_decision("fa4_2cta", "off", True, ["r"]), make_decision("modulation", "exact", True, ["r"]),
          make_decision("swiglu", "on", True, ["r"])]
    plan = make_plan({"recipe": {"name": "bf16"}}, {}, ds)
    ref = bench.same_backend_plan(plan)
    assert [(d.lever, d.setting) for d in ref.decisions] == [("attention", "fa4"), ("fa4_2cta", "off")]
    assert ref.config == plan.config


def test_record_has_the_issue_keys_in_order():
    r = record()
    assert tuple(r)[:10] == bench.REQUIRED_KEYS
    bench.check_records([r])
    with pytest.raises(ValueError, match="lacks"):
        bench.check_records([{k: v for k, v in r.items() if k != "rel_error"}])


def test_merge_replaces_the_same_key_and_appends_others():
    doc = bench.new_doc()
    bench.merge_record(doc, record(plan_ms=40.0))
    bench.merge_record(doc, record(plan="sm90/fp8/u1", recipe="fp8", lossless=False))
    bench.merge_record(doc, record(plan_ms=30.0))  # same (plan, S, blocks, device): replaces
    assert [(r["plan"], r["plan_ms"]) for r in doc["records"]] == [("sm90/fp8/u1", 35.0), ("sm90/bf16/u1", 30.0)]


def test_write_and_load_round_trip(tmp_path):
    doc = bench.new_doc()
    for r in records():
        bench.merge_record(doc, r)
    j, md = tmp_path / "block-h200.json", tmp_path / "block-h200.md"
    bench.write_doc(doc, str(j), str(md))
    assert bench.load_doc(str(j)) == json.loads(json.dumps(doc))
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"schema_version": 99, "records": []}',
                                  '{"schema_version": 1, "records": [{"S": 1}]}'])
def test_load_refuses_a_foreign_file(tmp_path, text):
    p = tmp_path / "block-h200.json"
    p.write_text(text)
    with pytest.raises(ValueError):
        bench.load_doc(str(p))
    assert p.read_text() == text


def test_markdown_rows_targets_and_column_notes():
    doc = bench.new_doc()
    for r in records():
        bench.merge_record(doc, r)
    md = bench.render_markdown(doc)
    assert "| sm90/bf16/u1 | 19000 | 1 | 46.50 | - | 35.00 | 1.33x | - | yes | 3.10e-03 | 0 |" in md
    assert "| sm90/fp8/u1 | 19000 | 1 | 46.50 | - | 29.00 | 1.60x | - | - | 2.10e-02 | 0 |" in md
    lines = [x for x in md.splitlines() if x.startswith("- ") and "diffusers eager, `" in x]
    assert lines == [
        "- lossless plan block >= 1.25x diffusers eager, `sm90/bf16/u1` S=19000 x1: 1.329x -> met",
        "- lossless plan block >= 1.25x diffusers eager, `sm90/bf16/u1` S=37820 x1: 1.089x -> **not met**",
        "- FP8 plan block >= 1.5x diffusers eager, `sm90/fp8/u1` S=19000 x1: 1.603x, rel. error vs BF16 eager 2.10e-02 "
        "-> met",
        "- FP8 plan block >= 1.5x diffusers eager, `sm90/fp8/u1` S=37820 x1: 1.376x, rel. error vs BF16 eager 2.40e-02 "
        "-> **not met**",
    ]
    assert "`sm90/fp8/u1` S=37820 x1: 90.0% -> **not met**" in md and "`sm90/bf16/u1` S=19000 x1: 98.0% -> met\n" in md
    assert "## What each column compares" in md and "Host-clock" not in md


def test_matched_attention_speed_is_context_and_never_changes_the_verdict():
    doc = bench.new_doc()
    for r in records():
        bench.merge_record(doc, r)
    md = bench.render_markdown(doc)
    assert ("`sm90/fp8/u1` S=37820 x1: 90.0% -> **not met** (context, not the target: 99.0% of the same call made "
            "right after a plan forward)") in md
    assert "| 15.00 | 14.70 | 90.0% | 14.85 | 99.0% |" in md  # in plan, standalone, speed, after a forward, matched
    assert "| 15.00 | 14.70 | 98.0% | - | - |" in md  # records without the matched measurement (older files)


def test_markdown_flags_cpu_records_failures_and_fallbacks():
    doc = bench.new_doc()
    bench.merge_record(doc, record(timing="host-clock", device="cpu"))
    bench.merge_record(doc, record(S=37820, eager=None, plan_ms=1.0, speedup=None,
                                   error="OutOfMemoryError: CUDA out of memory"))
    bench.merge_record(doc, record(plan="p2", bitwise=False, counters={"attention.fallback": 3, "swiglu.fused": 2}))
    md = bench.render_markdown(doc)
    assert "Host-clock (CPU) records below: their times are meaningless" in md
    assert "failed: OutOfMemoryError: CUDA out of memory" in md
    assert "| **no** | 3.10e-03 | 3 |" in md
    line = [x for x in md.splitlines() if "`p2` S=19000 x1: 1.3" in x][0]
    assert "not bitwise equal" in line and "3 guarded calls fell back" in line
    assert not any("S=19000" in x and "`sm90/bf16/u1`" in x for x in bench.target_lines(doc["records"]))


BEST = dict(best_config="model.compile_repeated_blocks(fullgraph=True, dynamic=False); diffusers' default attention "
                        "(native)", best_first_call_s=21.3, best_rel_error=2.7e-3, best_max_abs_error=0.0625)


def test_markdown_with_diffusers_best():
    """best ms and vs best (= best / plan) in the table; every target line also against the best; its own section."""
    doc = bench.new_doc()
    bench.merge_record(doc, record(best_ms=39.5, best_ms_range=[39.1, 40.2], speedup_vs_best=39.5 / 35.0, **BEST))
    bench.merge_record(doc, record(S=37820, eager=130.7, plan_ms=120.0, best_error="BackendCompilerFailed: no cc",
                                   **BEST))
    bench.merge_record(doc, record(plan="p2", best_config="not run (bench.best=off)"))
    md = bench.render_markdown(doc)
    assert "| eager ms | best ms | plan ms | speedup | vs best |" in md
    assert "| sm90/bf16/u1 | 19000 | 1 | 46.50 | 39.50 | 35.00 | 1.33x | 1.13x | yes |" in md
    assert "| sm90/bf16/u1 | 37820 | 1 | 130.70 | - | 120.00 | 1.09x | - | yes |" in md
    assert "| sm90/bf16/u1 | 19000 | 1 | 39.50 (39.10-40.20) | 21.3 | 2.70e-03 | 6.25e-02 |" in md
    assert "| sm90/bf16/u1 | 37820 | 1 | failed: BackendCompilerFailed: no cc | 21.3 | 2.70e-03 | 6.25e-02 |" in md
    assert "Best settings: `p2`: `not run (bench.best=off)`; `sm90/bf16/u1`: `model.compile_repeated_blocks(" in md
    lines = [x for x in md.splitlines() if x.startswith("- ") and "diffusers eager, `" in x]
    assert lines == [
        "- lossless plan block >= 1.25x diffusers eager, `p2` S=19000 x1: 1.329x -> met; diffusers' best: not run "
        "(bench.best=off)",
        "- lossless plan block >= 1.25x diffusers eager, `sm90/bf16/u1` S=19000 x1: 1.329x -> met; 1.129x diffusers' "
        "best",
        "- lossless plan block >= 1.25x diffusers eager, `sm90/bf16/u1` S=37820 x1: 1.089x -> **not met**; diffusers' "
        "best: BackendCompilerFailed: no cc",
    ]
    summary = bench.summary_table(doc["records"]).splitlines()
    assert summary[0].split()[3:8] == ["eager", "ms", "best", "ms", "plan"] and "vs best" in summary[0]
    assert summary[2].split()[3:8] == ["46.50", "39.50", "35.00", "1.33", "1.13"]


def test_records_from_before_the_best_columns_load_and_render_dashes(tmp_path):
    """A results file written before the best setting existed (no best_* keys at all) loads and renders '-'."""
    old = {k: v for k, v in record().items() if not k.startswith("best") and k != "speedup_vs_best"}
    p = tmp_path / "block-h200.json"
    p.write_text(json.dumps({"schema_version": 1, "runs": [], "records": [old]}))
    doc = bench.load_doc(str(p))
    md = bench.render_markdown(doc)
    assert "| sm90/bf16/u1 | 19000 | 1 | 46.50 | - | 35.00 | 1.33x | - | yes |" in md
    assert "## diffusers' best setting" not in md
    assert "1.329x -> met\n" in md  # no best clause on an old record's target line
    assert bench.summary_table(doc["records"]).splitlines()[1].split()[3:8] == ["46.50", "-", "35.00", "1.33", "-"]


def test_a_run_keeps_every_earlier_runs_metadata(tmp_path):
    """A results file's records outlive any number of later runs, so the metadata of the run that wrote each (its
    device and versions) must too: add_run appends and never drops an earlier entry."""
    from h3plan.actions.bench import pipeline_records
    from h3plan.actions.bench.harness import Output

    out = Output(pipeline_records, str(tmp_path), "pipeline", "t")
    for i in range(12):
        out.add_run({"run": f"run {i}"})
    assert [r["run"] for r in out.doc["runs"]] == [f"run {i}" for i in range(12)]
