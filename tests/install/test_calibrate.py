"""`action=calibrate` on the tiny model (CPU, Triton interpreter): observers, the version-2 table, the held-out
check, static FP8 linear inputs, and a plan with the table through the installer and action=verify.

Contracts: the observing processor is diffusers' forward bit for bit; a calibrated table loads and validates
against its model; a table whose amax is 1e-3 of the truth clips nearly everything and is refused in one line
(not written; a .rejected.json that never loads); a static FP8 linear quantises with the fixed amax * margin.
"""

import json

import pytest
import torch
from install_helpers import ROOT, TINY, forward, tiny_inputs, tiny_model
from omegaconf import OmegaConf

from h3plan import resolve_config
from h3plan.actions import calibrate as action
from h3plan.facts.scale_table import ScaleTableError, load_table

FAST = {"seeds": [0], "count": 2, "heldout_seeds": [7], "device": "cpu", "percentile": 99.9}


def _cfg(out, **calibrate):
    return OmegaConf.create({"model": OmegaConf.load(ROOT / "conf/model/h3_tiny.yaml"), "parallel": {"seq_len": 19000},
                             "calibrate": {**FAST, "out": str(out), **calibrate}})


def _plan(*extra):
    return resolve_config(hardware="sm90", recipe="fp8", model="h3_tiny", **dict(e.split("=", 1) for e in extra))


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    out = tmp_path_factory.mktemp("cal") / "scales.json"
    lines = []
    import h3plan.actions.calibration as cal

    real = cal.say
    cal.say = lines.append
    try:
        rc = action.run(_cfg(out), _plan())
    finally:
        cal.say = real
    return rc, out, lines


def test_observer_forward_is_diffusers_bitwise():
    from h3plan.actions.calibration import _Run, _Stats

    from h3plan.install.hooks import installed

    model, inputs = tiny_model(), tiny_inputs()
    want = forward(model, inputs)
    dicts = {n: dict(m.__dict__) for n, m in model.named_modules()}
    run = _Run(model, _Stats(99.9))
    try:
        got = run.forward(inputs, "observe")
        hooks = installed(model)
    finally:
        run.close()
    assert torch.equal(got["video"], want[0]) and torch.equal(got["audio"], want[1])
    assert ("transformer_blocks.0.attn.to_q", "h3plan.calibrate") in hooks
    assert ("transformer_blocks.0.attn", "h3plan.calibrate.processor") in hooks
    assert type(model.transformer_blocks[0].attn.processor).__name__ == "MiniMaxH3AttnProcessor"  # restored
    assert installed(model) == [] and not model.transformer_blocks[0].attn.to_q._forward_pre_hooks
    assert {n: dict(m.__dict__) for n, m in model.named_modules()}.keys() == dicts.keys()
    assert all(m.__dict__.keys() == dicts[n].keys() for n, m in model.named_modules())  # nothing left on a module


def test_the_fp8_forward_s_linears_go_back_at_close():
    from h3plan.actions.calibration import _Run, _Stats
    from h3plan.install.hooks import installed

    model, inputs = tiny_model(), tiny_inputs()
    want = forward(model, inputs)
    linears = [type(m).__name__ for m in model.modules()]
    run = _Run(model, _Stats(99.9), fp8_linears=True)
    try:
        run.forward(inputs, "observe")
        fp8 = run.forward(inputs, "dynamic")
        assert "h3plan.calibrate.fp8_linears" in [n for _, n in installed(model)]
    finally:
        run.close()
    assert not torch.equal(fp8["video"], want[0])  # the FP8 linears ran
    assert [type(m).__name__ for m in model.modules()] == linears and installed(model) == []
    got = forward(model, inputs)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_calibrate_writes_a_table_that_loads(calibrated):
    rc, out, lines = calibrated
    assert rc == 0
    assert lines[-1].startswith(f"calibrate: table {out}; held-out check PASS") and "budget 34 dB" in lines[-1]
    assert sum("observed" in x for x in lines) == 2 and sum("held-out 1/1" in x for x in lines) == 1
    t = load_table(str(out), model_config=TINY)
    assert sorted(t.attention) == ["transformer_blocks.0.attn", "transformer_blocks.1.attn"]
    assert len(t.linears) == 12 and all(v > 0 for v in t.linears.values())
    p = t.provenance
    assert p["model"] == "h3_tiny" and p["num_layers"] == 2 and p["margin"] == 1.0 and p["statistic"] == "amax"
    assert p["inputs"]["seeds"] == [0] and p["heldout"]["seeds"] == [7] and p["inputs"]["steps"] == [0, 48]
    assert p["heldout"]["steps"] == [24] and p["request"]["rows"] == {"text": 4, "audio": 6, "video": 38}
    check = p["heldout"]["check"]
    assert check["passed"] and check["static"]["psnr_db"] >= 34 and check["dynamic"]["psnr_db"] >= 34
    assert check["update_loss_db"] <= check["max_loss_db"] == 3.0
    assert "torch emulation" in check["fp8_sites"]["attention"]
    assert set(check["clipped"]["sites"]) >= {"transformer_blocks.1.attn.q", "transformer_blocks.1.ff.net.2"}
    assert t.percentile["p"] == 99.9
    pct = t.percentile["linears"]["transformer_blocks.0.ff.net.2"]
    assert 0 < pct <= t.linears["transformer_blocks.0.ff.net.2"] * 2 ** (1 / 16)


def test_closing_hint_plans_with_the_table(calibrated):
    """The last line's command, planned as written, reads the table statically (FP8 attention scales and the FP8
    linears' inputs); recipe.fp8_static_table alone would leave both dynamic."""
    import shlex

    from h3plan.actions.calibrate import uses_table
    from h3plan.planning.config import compose
    from h3plan.planner import resolve

    _, out, lines = calibrated
    head, sep, command = lines[-1].partition("; plan with it: python -m h3plan ")
    assert sep, lines[-1]
    argv = shlex.split(command)
    assert (argv[:4] == ["hardware=sm90", "recipe=fp8", "parallel=u1", "model=h3_tiny"]
            and argv[-1] == f"recipe.fp8_static_table={out}")
    p = resolve(compose(argv))
    assert uses_table(p) and p.decision("fp8_scales").setting == "static"
    assert p.decision("gemm_quant").param("input_scales") == "static"
    alone = _plan(f"recipe.fp8_static_table={out}")
    assert not uses_table(alone) and alone.decision("fp8_scales").setting == "dynamic"


def test_linear_amax_is_the_max_over_the_calibration_inputs(calibrated):
    """Independent hooks on the plain model over the same seeded inputs give the table's linear amax."""
    from h3plan.actions.calibration import schedule, seeded_inputs

    _, out, _ = calibrated
    t = load_table(str(out))
    model = tiny_model()
    seen = {}
    lin = model.transformer_blocks[1].ff.net[2]
    lin.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", max(seen.get("x", 0.0), float(a[0].abs().max()))))
    for inp in seeded_inputs(TINY, 48, [0], [0, 48], schedule(50, 12.0, 3.0)):
        forward(model, inp.make())
    assert seen["x"] == t.linears["transformer_blocks.1.ff.net.2"]


def test_tampered_or_stale_table_is_refused(calibrated, tmp_path):
    _, out, _ = calibrated
    raw = json.loads(out.read_text())
    for edit, fault in [(lambda r: r["attention"]["transformer_blocks.0.attn"].__setitem__("q", -1.0),
                         "finite numbers > 0"),
                        (lambda r: r["linears"].pop("transformer_blocks.1.attn.to_v"), "to_q/to_k/to_v"),
                        (lambda r: r.__setitem__("version", 1), "stale"),
                        (lambda r: r["provenance"].__setitem__("config_hash", "0" * 16), "not this model")]:
        r = json.loads(json.dumps(raw))
        edit(r)
        p = tmp_path / "t.json"
        p.write_text(json.dumps(r))
        with pytest.raises(ScaleTableError) as e:
            load_table(str(p), model_config=TINY)
        assert fault in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


def test_heldout_check_refuses_a_table_that_clips(monkeypatch, calibrated, tmp_path):
    import h3plan.actions.calibration as cal

    real = cal.rows

    def shrunk(*a, **k):
        att, lin, pct = real(*a, **k)
        return ({f: {c: v * 1e-3 for c, v in r.items()} for f, r in att.items()}, {f: v * 1e-3 for f, v in lin.items()},
                pct)

    monkeypatch.setattr(cal, "rows", shrunk)
    monkeypatch.setattr(cal, "say", lambda line: None)
    out = tmp_path / "bad.json"
    with pytest.raises(ScaleTableError) as e:
        action.run(_cfg(out, percentile=None, count=1), _plan())
    msg = str(e.value)
    assert "\n" not in msg and f"scale table {out}: refused by the held-out check" in msg and "EXCEEDED" in msg
    assert not out.exists()
    rejected = tmp_path / "bad.rejected.json"
    check = json.loads(rejected.read_text())["provenance"]["heldout"]["check"]
    assert not check["passed"] and check["clipped"]["max_fraction"] > 0.5
    with pytest.raises(ScaleTableError, match="rejected by its held-out check"):
        load_table(str(rejected))


def test_static_fp8_linear_input():
    """set_static_input: codes of x * 448 / (amax * margin), saturated beyond amax * margin; None: dynamic again."""
    from h3plan.runtime.kernels.fp8 import quantize_ref
    from h3plan.runtime.quant.fp8 import FP8Linear

    torch.manual_seed(0)
    lin = FP8Linear.from_linear(torch.nn.Linear(32, 16, bias=False).to(torch.bfloat16))
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    dynamic = lin(x)
    lin.set_static_input(0.5, margin=2.0)
    assert float(lin.input_amax) == 1.0 and "input_amax" in lin.state_dict() and "static amax 1" in repr(lin)
    x8, xs = quantize_ref(x.reshape(-1, 32), torch.tensor(1.0))
    want = ((x8.float() * xs) @ (lin.weight.float() * lin.weight_scale[:, None]).t()).to(torch.bfloat16)
    torch.testing.assert_close(lin(x), want, rtol=0, atol=0)
    assert float(x8.float().abs().max()) == 448.0  # |x| > 1 saturates
    lin.set_static_input(None)
    torch.testing.assert_close(lin(x), dynamic, rtol=0, atol=0)


@pytest.mark.slow  # install and verify in the interpreter (~2 s)
def test_plan_with_the_table_installs_and_verifies(calibrated, capsys):
    """recipe=fp8 with recipe.fp8_scale_mode=static and the table: fp8_scales=static, the FP8 linears take the
    table's input amax through the real lever registry, and action=verify passes (cudnn_fp8 cannot run on the
    CPU: verify substitutes sdpa and keeps the FP8 linears with their static inputs)."""
    from h3plan.actions import get_action
    from h3plan.install import install, uninstall

    _, out, _ = calibrated
    off = [f"levers.{k}={v}" for k, v in (("modulation", "eager"), ("gated_residual", "off"), ("swiglu", "off"))]
    p = _plan("recipe.fp8_scale_mode=static", f"recipe.fp8_static_table={out}", *off)
    assert p.decision("fp8_scales").setting == "static"
    assert p.decision("gemm_quant").to_dict()["params"]["input_scales"] == "static"
    model = tiny_model()
    report = install(model, p)
    t = load_table(str(out))
    assert float(model.transformer_blocks[1].ff.net[2].input_amax) == t.linears["transformer_blocks.1.ff.net.2"]
    assert any("static scales from" in n for n in report.notes)
    uninstall(model)
    assert isinstance(model.transformer_blocks[1].ff.net[2], torch.nn.Linear)
    cfg = OmegaConf.create({"model": OmegaConf.load(ROOT / "conf/model/h3_tiny.yaml"), "parallel": {"seq_len": 19000},
                            "verify": {"blocks": 1, "seq_len": 48, "seed": 0, "device": "cpu", "dtype": "bf16"}})
    rc = get_action("verify")(cfg, p)
    text = capsys.readouterr().out
    assert rc == 3, text
    # the FP8 GEMMs and cuDNN FP8 only run their emulation / sdpa on the CPU: every check passes, the verdict says so
    assert ("PASS  gemm_quant=fp8" in text
            and text.rstrip().splitlines()[-1].startswith("verify: INCOMPLETE: every check"))


def test_captured_inputs_round_trip(tmp_path):
    from h3plan.actions.calibration import capture_inputs, load_inputs
    from h3plan.errors import UsageError

    model, inputs = tiny_model(), tiny_inputs()
    with capture_inputs(model, str(tmp_path / "cap")):
        forward(model, inputs)
        forward(model, tiny_inputs(seed=1))
    got = load_inputs(str(tmp_path / "cap"))
    assert [g.meta["file"] for g in got] == ["input_00000.pt", "input_00001.pt"]
    kw = got[0].make()
    assert sorted(kw) == sorted(inputs) and all(torch.equal(kw[k], inputs[k]) for k in inputs)
    torch.save({"hidden_states": torch.zeros(1)}, tmp_path / "bad.pt")
    with pytest.raises(UsageError, match=r"bad.pt: missing 'audio_hidden_states'"):
        load_inputs(str(tmp_path / "bad.pt"))


def test_bad_settings_are_one_line(tmp_path):
    from h3plan.errors import UsageError

    with pytest.raises(UsageError, match="calibrate.bogus: unknown key"):
        action.run(_cfg(tmp_path / "x.json", bogus=1), _plan())
    with pytest.raises(UsageError, match="shares seed 0"):
        action.run(_cfg(tmp_path / "x.json", heldout_seeds=[0]), _plan())
    with pytest.raises(UsageError,
                       match=r"calibrate.num_inference_steps=1: must be >= 2: diffusers' MiniMaxH3Scheduler"):
        action.run(_cfg(tmp_path / "x.json", num_inference_steps=1), _plan())
    with pytest.raises(UsageError, match="recipe bf16 does not set"):
        action.run(_cfg(tmp_path / "x.json"), resolve_config(hardware="sm90", recipe="bf16", model="h3_tiny"))


def test_cli_form_runs_to_its_end(tmp_path, capsys):
    """`python -m h3plan action=calibrate recipe=fp8 model=h3_tiny` through the CLI entry, to its closing line: the
    hint is planned with compose() inside the running Hydra job (GlobalHydra already initialised there)."""
    from h3plan import cli

    out = tmp_path / "fp8_scales.json"
    argv = ["action=calibrate", "recipe=fp8", "model=h3_tiny", "calibrate.seeds=[0]", "calibrate.count=2",
            "calibrate.heldout_seeds=[7]", f"calibrate.out={out}"]
    rc = cli.run(argv)
    stdout, err = capsys.readouterr()
    assert rc == 0 and err == "", err
    assert out.exists() and load_table(str(out))
    assert "; plan with it: python -m h3plan " in stdout.strip().splitlines()[-1]


def test_cpu_refusal_ends_with_the_form_that_runs(tmp_path):
    """As verify and bench do: the refusal of the real width on a CPU ends with the small command that runs."""
    from h3plan.errors import UsageError

    cfg = _cfg(tmp_path / "x.json")
    cfg.model = OmegaConf.load(ROOT / "conf/model/h3.yaml")
    with pytest.raises(UsageError) as e:
        action.run(cfg, _plan())
    assert str(e.value).endswith(": python -m h3plan action=calibrate recipe=fp8 model=h3_tiny"), e.value
