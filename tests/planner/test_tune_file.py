"""action=tune on the CPU: refused in one line; its writer (h3plan/actions/tune.py) leaves no partial file when
interrupted, and the hardware file it writes from a (synthetic) measurement set loads through the search path,
extends the packaged group, carries its provenance and drives the plan."""

import os
from pathlib import Path

import pytest
import yaml

from h3plan import cli
from h3plan.actions import tune
from h3plan.planner import resolve
from h3plan.facts import tuned
from h3plan.planning.config import compose

TUNED = {"device": "Synthetic GPU", "compute_capability": "9.0", "memory_gib": 139.8, "date": "2026-12-02 04:30",
         "command": "python -m h3plan action=tune", "versions": {k: None for k in tuned.COMPARED},
         "runtime": {"cuda": "13.0"}, "quick": True, "seconds": 1.0,
         "checks": [{"lever": "gated_residual", "setting": "on", "passed": False, "detail": "NOT bitwise equal to R"}],
         "source": "synthetic (tests/planner/test_tune_file.py)"}
MEASURED = {"on_hardware": True, "hbm_copy_tbps": 4.0,
            "attention": [{"seq_len": 37820, "heads": 56, "sdpa": 350.0, "cudnn_bf16": 560.0, "fa4": 650.0}],
            "gemm_block": [{"rows": 37820, "dtype": "bf16", "layers": 1, "ms": 41.0, "source": "synthetic"}],
            "elementwise": [{"recipe": "bf16", "rows": 37820, "layers": 1, "ms": [2.5], "source": "synthetic"}],
            "decode": [{"precision": "fp32", "tiles": "default", "latent": [1, 24, 5, 48, 84], "seconds": 6.0,
                        "source": "synthetic"}]}


def test_cpu_refuses_in_one_line(capsys):
    assert cli.run(["action=tune"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "action=tune measures a GPU and this machine has none" in err


def test_an_interrupted_write_leaves_nothing(tmp_path):
    target = tmp_path / "hardware" / "mine.yaml"
    with pytest.raises(KeyboardInterrupt):
        with tune.atomic_write(target) as tmp:
            tmp.write_text("half a file")
            raise KeyboardInterrupt
    assert not target.exists() and os.listdir(target.parent) == []
    with tune.atomic_write(target) as tmp:
        tmp.write_text("whole")
    assert target.read_text() == "whole" and os.listdir(target.parent) == ["mine.yaml"]


def test_the_written_file_loads_and_drives_the_plan(tmp_path):
    out = tmp_path / "hardware" / "sm90_synthetic.yaml"
    record = {"tuned": TUNED, "measured": MEASURED, "backends": ["sdpa", "cudnn_bf16", "fa4", "cudnn_fp8"],
              "steps_s": {"attention": 1.0}, "seconds": 1.0}
    files = tune.write_outputs(out, "sm90", TUNED, MEASURED, None, record)
    assert [f.name for f in files] == ["sm90_synthetic.yaml", "tune-sm90_synthetic.json", "tune-sm90_synthetic.md"]
    assert yaml.safe_load(out.read_text())["defaults"] == ["sm90", "_self_"]
    p = resolve(compose([f"hydra.searchpath=[file://{tmp_path}]", "hardware=sm90_synthetic",
                         "recipe=bf16", "parallel=u1"]))
    hw = p.get("hardware")
    assert hw["tuned"]["device"] == "Synthetic GPU" and hw["tuned"]["date"] == "2026-12-02 04:30"
    assert hw["measured"]["ulysses"]["a2a"]  # inherited from the packaged sm90
    assert p.derived_value("decode_s_est") == pytest.approx(6.0 * 37 / 5, rel=1e-3)  # scaled by latent volume
    assert p.decision("gated_residual").setting == "off"  # its check failed there
    assert "measured on Synthetic GPU, 2026-12-02 04:30" in " ".join(cli.render_summary(p).split())
    assert "| gated_residual=on | FAIL |" in (tmp_path / "hardware" / "tune-sm90_synthetic.md").read_text()
    elsewhere = tune.write_outputs(out, "sm90", TUNED, MEASURED, None, record, results=tmp_path / "res" / "tune-x")
    assert [f.name for f in elsewhere[1:]] == ["tune-x.json", "tune-x.md"] and elsewhere[1].parent.name == "res"


def test_versions_as_the_gpu_gives_them_write_plain_yaml(tmp_path):
    """torch.__version__ is a TorchVersion (a str subclass) that yaml.safe_dump refuses: a tune would die there after
    measuring everything."""
    from torch.torch_version import TorchVersion

    latent = [1, 24, 37, 48, 84]
    measured = dict(MEASURED, decode=[dict(MEASURED["decode"][0], latent=latent),
                                      dict(MEASURED["decode"][0], precision="fp16", latent=latent)])
    text = tune.hardware_file("sm90", dict(TUNED, runtime={"torch": TorchVersion("2.11.0+cu130")}), measured)
    doc = yaml.safe_load(text)
    assert doc["tuned"]["runtime"]["torch"] == "2.11.0+cu130" and "&id" not in text


def test_regret_of_auto_from_a_synthetic_table():
    from h3plan.actions.bench import regret

    base = [f"hydra.searchpath=[file://{Path(__file__).parent / 'data' / 'conf'}]", "hardware=tuned_synthetic",
            "recipe=bf16"]
    r = regret.sweep(base, levers=("attention",))
    assert r["auto"]["settings"] == {"attention": "cudnn_bf16"} and r["regret"] == 0.0  # the measured fastest
    assert any("refused" in a for a in r["arms"])  # cudnn_fp8: lossy under a lossless recipe
    forced = regret.sweep(base + ["levers.attention=fa4"], levers=("attention",))
    assert forced["best"]["settings"] == {"attention": "cudnn_bf16"} and forced["regret"] > regret.TARGET  # it can fail
    assert "| NO |" in regret.markdown([forced])
