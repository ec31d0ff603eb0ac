"""The same CLI entry (h3plan.cli.run) in-process: more bad inputs (one stderr line, exit 2) and the
action dispatch, without paying an interpreter start each."""

import sys
import types

import pytest

from h3plan import cli

BAD = [
    (["hardware=sm200"], "hardware=sm200: no such option; available: sm100, sm103, sm107, sm90"),
    (["levers.attention=fa5"], "levers.attention=fa5: not allowed; allowed: auto, sdpa, cudnn_bf16, cudnn_fp8, fa4"),
    (["levers.atention=fa4"], "levers.atention: unknown key; allowed: gemm_quant, adaln_table, attention,"),
    (["parallel.seq_len=-5"], "parallel.seq_len=-5: must be a positive integer"),
    (["parallel.seq_len=abc"], "parallel.seq_len: Value 'abc'"),
    (["model=h3_tiny", "parallel=u8"], "must divide the 4 attention heads of model h3_tiny; allowed: 1, 2, 4"),
    (["levers.fa4_2cta=on"], "levers.fa4_2cta=on cannot apply: sm90 has no FA4 2-CTA kernel"),
    (["hardware.device.sm_count=???"], "hardware.device.sm_count: missing value"),
    (["parallel.seq_len=["], "cannot parse the override"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["format=xml"], "format=xml: not allowed; allowed: table, yaml, json"),
]


@pytest.mark.parametrize("argv,fragment", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input(capsys, argv, fragment):
    assert cli.run(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], err
    assert out == ""


def test_action_dispatch(capsys, monkeypatch):
    seen = {}

    def fake_run(cfg, plan):
        seen["attention"] = plan.decision("attention").setting
        seen["blocks"] = cfg.bench.blocks
        return 3

    monkeypatch.setitem(sys.modules, "h3plan.actions.bench", types.SimpleNamespace(run=fake_run))
    assert cli.run(["action=bench", "bench.blocks=[2]"]) == 3
    assert seen == {"attention": "fa4", "blocks": [2]}
    assert capsys.readouterr().out == ""


def test_unknown_action_module():
    from h3plan.actions import run_action
    from h3plan.errors import UsageError

    cfg = types.SimpleNamespace(action=types.SimpleNamespace(name="nonexistent"))
    with pytest.raises(UsageError, match="unknown action 'nonexistent'"):
        run_action(cfg, None)


def test_missing_torch_is_an_install_hint_not_an_internal_error(capsys, monkeypatch):
    def needs_torch(cfg, plan):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setitem(sys.modules, "h3plan.actions.verify", types.SimpleNamespace(run=needs_torch))
    assert cli.run(["action=verify"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("h3plan: error: action=verify needs 'torch', which is not installed: pip install -e '.[runtime]'")
    assert "internal error" not in err and len(err.splitlines()) == 1


def test_table_marks_unverified_and_keeps_order(capsys):
    assert cli.run(["hardware=sm90"]) == 0
    out = capsys.readouterr().out
    table = out.split("\n\n")[1].splitlines()[1:]  # header line, blank, lever table, blank, derived
    rows = [line.split()[0] for line in table if not line.startswith(" ")]
    from h3plan.levers import REGISTRY

    assert rows == list(REGISTRY)
    qk = next(line for line in out.splitlines() if line.startswith("qk_norm_rope"))
    assert " * " not in qk  # the fused kernels passed the H200 suite (conf/hardware/sm90.yaml verified)
    assert cli.run(["hardware=sm107"]) == 0
    out = capsys.readouterr().out
    att = next(line for line in out.splitlines() if line.startswith("attention "))
    assert " * " in att  # nothing ever ran on sm107
