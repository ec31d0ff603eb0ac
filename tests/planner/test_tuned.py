"""A tuned hardware file (action=tune's output): its schema and provenance, the staleness rules, strict=true, the
kernel checks it carries, and auto picks from its measurements. The file is synthetic
(tests/planner/data/conf/hardware/tuned_synthetic.yaml), loaded through the search path as a user's would be."""

from pathlib import Path

import pytest
import yaml

from h3plan import cli
from h3plan.errors import H3PlanError
from h3plan.planner import resolve
from h3plan.facts import tuned
from h3plan.planning.config import compose

CONF = Path(__file__).parent / "data" / "conf"
SYNTHETIC = yaml.safe_load((CONF / "hardware" / "tuned_synthetic.yaml").read_text())


def render_summary(p) -> str:
    return " ".join(cli.render_summary(p).split())  # the summary wraps its lines


def plan(*overrides, conf=CONF, hw="tuned_synthetic"):
    return resolve(compose([f"hydra.searchpath=[file://{conf}]", f"hardware={hw}", "recipe=bf16",
                            "parallel=u1", *overrides]))


def _write(tmp_path, **tuned_changes):
    doc = yaml.safe_load((CONF / "hardware" / "tuned_synthetic.yaml").read_text())
    doc["tuned"].update(tuned_changes)
    doc["tuned"] = {k: v for k, v in doc["tuned"].items() if v is not None or k not in tuned_changes}
    (tmp_path / "hardware").mkdir(exist_ok=True)
    (tmp_path / "hardware" / "mine.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path


def test_provenance_is_in_the_plan():
    t = plan().get("hardware")["tuned"]
    for key in ("device", "compute_capability", "memory_gib", "date", "command", "versions", "checks"):
        assert t[key] not in (None, "", [], {}), key
    assert set(t["versions"]) == set(tuned.COMPARED)
    # the packaged facts the file does not measure are inherited through its defaults list
    assert plan().get("hardware")["measured"]["ulysses"]["a2a"]


@pytest.mark.parametrize("missing", ["device", "date", "command"])
def test_a_file_without_its_provenance_is_refused(tmp_path, missing):
    doc = yaml.safe_load((CONF / "hardware" / "tuned_synthetic.yaml").read_text())
    del doc["tuned"][missing]
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "mine.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(H3PlanError, match=missing):
        plan(conf=tmp_path, hw="mine")


def test_a_check_must_name_a_lever_setting(tmp_path):
    conf = _write(tmp_path, checks=[{"lever": "swiglu", "setting": "fast", "passed": True}])
    with pytest.raises(H3PlanError, match=r"hardware.tuned.checks\[0\].*swiglu=fast"):
        plan(conf=conf, hw="mine")


def test_stale_rules():
    made = {"versions": {"torch": "2.11.0", "triton": "3.5.0", "fa4": "4.0.0b36", "cudnn": None, "driver": "570.1"}}
    here = {"torch": "2.11.0", "triton": "3.6.0", "fa4": "4.0.0b36", "cudnn": "9.19.0", "driver": "570.1"}
    diff, unknown = tuned.stale(made, here)
    assert diff == ["triton 3.5.0 at tune time, 3.6.0 here"]
    assert unknown == ["cudnn"]  # missing in the file: not compared, and said so
    assert tuned.stale(made, {**here, "triton": "3.5.0"})[0] == []
    assert tuned.stale(made, {**here, "triton": "3.5.0", "torch": None})[1] == ["torch", "cudnn"]


def test_driver_version_is_read_without_torch(tmp_path):
    f = tmp_path / "version"
    f.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
                 "(dvs-builder@U16)\n")
    assert tuned.driver_version(str(f)) == "570.86.15"
    f.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n")
    assert tuned.driver_version(str(f)) == "550.54.14"
    assert tuned.driver_version(str(tmp_path / "absent")) is None


def test_a_stale_file_is_marked_and_strict_refuses_it():
    p = plan()  # the synthetic file's torch and triton versions are no real ones
    text = render_summary(p)
    assert "STALE: torch 0.0.0-synthetic at tune time" in text and "strict=true refuses it" in text
    with pytest.raises(H3PlanError) as e:
        plan("strict=true")
    assert "hardware.tuned" in str(e.value) and "stale" in str(e.value) and "\n" not in str(e.value)


def test_a_file_of_the_running_versions_is_not_stale(tmp_path):
    conf = _write(tmp_path, versions=tuned.running_versions())
    p = plan("strict=true", conf=conf, hw="mine")
    assert "STALE" not in render_summary(p)


def test_measured_on_replaces_the_mark():
    text = render_summary(plan())
    assert "measured on Synthetic GPU, 2026-12-02 04:00" in text
    qk = plan().decision("qk_norm_rope")
    assert qk.setting == "fused" and qk.hardware_verified


def test_a_failed_check_is_refused_with_its_reason():
    d = plan().decision("swiglu")
    assert d.setting == "off"
    assert any("kernel check failed on Synthetic GPU" in r and "NOT bitwise equal to R (synthetic)" in r
               for r in d.reasons)
    with pytest.raises(H3PlanError, match=r"levers.swiglu=on cannot apply: its kernel check failed on Synthetic GPU"):
        plan("levers.swiglu=on")
    assert "kernel checks failed there, refused: swiglu=on" in render_summary(plan())


def test_auto_attention_is_the_measured_fastest():
    d = plan().decision("attention")  # synthetic: cudnn_bf16 700 > fa4 600 > sdpa 300 TFLOP/s at the plan's shape
    assert d.setting == "cudnn_bf16"
    assert any("cudnn_bf16 58.6 ms, fa4 68.4 ms, sdpa 136.7 ms per call" in r for r in d.reasons)
    packaged = resolve(compose(["hardware=sm90", "recipe=bf16", "parallel=u1"])).decision("attention")
    assert packaged.setting == "fa4" and any("fa4 " in r and " ms" in r for r in packaged.reasons)


def test_prediction_reads_the_tuned_measurements():
    p = plan()
    assert p.derived_value("gemm_ms_per_block_est") == 50.0  # its gemm_block point at the plan's rows, 1 block
    assert p.derived_value("elementwise_ms_per_block_est") == 3.0
    assert p.derived_value("decode_s_est") == 40.0


def test_a_setting_checked_only_on_the_tuned_device_loses_its_mark(tmp_path):
    # sm107's packaged facts never ran anywhere; a tuned file whose check passed there drops the '*' for that setting
    checks = [{"lever": "qk_norm_rope", "setting": "fused", "passed": True}]
    doc = {"defaults": ["sm107", "_self_"],
           "tuned": {**SYNTHETIC["tuned"], "compute_capability": "10.7", "checks": checks}}
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "b.yaml").write_text(yaml.safe_dump(doc))
    p = resolve(compose([f"hydra.searchpath=[file://{tmp_path}]", "hardware=b", "recipe=bf16", "parallel=u1"]))
    assert p.decision("qk_norm_rope").hardware_verified
    assert not p.decision("modulation").hardware_verified  # never checked there: still a prediction
    assert "qk_norm_rope=fused" not in render_summary(p).split("untested")[1].split("lever ")[0]
