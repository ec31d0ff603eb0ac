"""`action=verify` on the tiny model in the Triton interpreter (1 block, S=48).

Contract: the lossless plan is bitwise equal to the reference with the same attention backend (sdpa
on both sides here: FA4 cannot run on the CPU and verify says so); a kernel that changes one bit, or a
guard that never lets the fused path run, makes verify fail (exit status 1).
"""

import math

import pytest
from install_helpers import LEVERS, ROOT, plan
from omegaconf import OmegaConf

from h3plan.actions import get_action
from h3plan.actions.verify import compare


def _cfg(**verify):
    v = {"blocks": 1, "seq_len": 48, "seed": 0, "device": "cpu", "dtype": "bf16", **verify}
    return OmegaConf.create({"model": OmegaConf.load(ROOT / "conf/model/h3_tiny.yaml"), "verify": v,
                             "parallel": {"seq_len": 19000}})


LOSSLESS_FA4 = dict(attention="fa4", qk_norm_rope="fused", modulation="exact", gated_residual="on", swiglu="on")


@pytest.mark.slow  # verify in the interpreter over the tiny model (~9 s)
def test_verify_lossless_plan_passes_bitwise(capsys):
    rc = get_action("verify")(_cfg(), plan(**LOSSLESS_FA4), registry=LEVERS)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "attention backend 'fa4' cannot run here (FA4 needs a CUDA device (tensors on cpu)): sdpa replaces it" in out
    assert "PASS  R (attention=sdpa) vs diffusers    bitwise equal" in out
    for lever in ("qk_norm_rope=fused", "modulation=exact", "gated_residual=on", "swiglu=on"):
        assert f"PASS  {lever:<34} bitwise equal to R; fused path ran" in out
    assert "PASS  whole plan vs R                    bitwise equal" in out
    assert "modulation fused 2 fallback 0" in out
    assert out.rstrip().splitlines()[-1] == ("verify: PASS (lossless, not run here: attention=fa4: fa4 cannot run "
                                             "here, sdpa in its place)")


def test_verify_fails_on_a_one_bit_change(monkeypatch, capsys):
    import torch

    import h3plan.runtime.kernels.gated_residual as gr

    real = gr.gated_residual

    def off_by_one_ulp(h, gate, index, y):
        out = real(h, gate, index, y)
        bits = out.view(torch.int16).clone()
        bits[0, 0, 0] += 1
        return bits.view(torch.bfloat16)

    monkeypatch.setattr(gr, "gated_residual", off_by_one_ulp)
    rc = get_action("verify")(_cfg(), plan(attention="sdpa", gated_residual="on"), registry=LEVERS)
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL  gated_residual=on                  NOT bitwise equal to R" in out


def test_verify_fails_when_the_fused_path_never_runs(monkeypatch, capsys):
    import h3plan.runtime.kernels.swiglu as sw

    monkeypatch.setattr(sw, "swiglu_check", lambda x: "regressed guard")
    rc = get_action("verify")(_cfg(), plan(attention="sdpa", swiglu="on"), registry=LEVERS)
    out = capsys.readouterr().out
    assert rc == 1 and "fused path never ran: regressed guard" in out


def test_verify_lossy_plan_reports_error_within_budget(capsys):
    """Every check passes, but the FP8 GEMMs only ran their emulation on the CPU: not PASS, INCOMPLETE (exit 3)."""
    rc = get_action("verify")(_cfg(), plan(attention="sdpa", gemm_quant="fp8"), registry=LEVERS)
    out = capsys.readouterr().out
    assert rc == 3, out
    assert "emulated here: FP8 GEMM needs CUDA (input on cpu)" in out and "psnr" in out
    assert out.rstrip().splitlines()[-1] == ("verify: INCOMPLETE: every check that ran passed, but not checked here: "
                                             "gemm_quant=fp8 (only its emulation ran: FP8 GEMM needs CUDA (input on "
                                             "cpu))")


def test_verify_refuses_real_width_on_cpu():
    cfg = _cfg()
    cfg.model = OmegaConf.load(ROOT / "conf/model/h3.yaml")
    with pytest.raises(ValueError, match="model=h3_tiny"):
        get_action("verify")(cfg, plan(attention="sdpa"), registry=LEVERS)


def test_compare_metrics():
    import torch

    b = torch.tensor([1.0, -2.0, 4.0])
    assert compare(b.clone(), b)["bitwise"] and compare(b.clone(), b)["psnr_db"] == float("inf")
    m = compare(torch.tensor([1.0, -2.0, 3.0]), b)
    assert not m["bitwise"] and m["max_abs"] == 1.0
    assert abs(m["psnr_db"] - 10 * math.log10(16.0 / (1 / 3))) < 1e-9  # peak max|b| = 4, mse 1/3
    assert abs(m["rel"] - 1 / 21 ** 0.5) < 1e-12


@pytest.mark.parametrize("argv, message", [
    (["verify.device=cuda"], "verify.device=cuda: this machine has no CUDA device (torch.cuda.is_available() is "
                             "False); on the CPU use verify.device=cpu (or auto) with model=h3_tiny: python -m h3plan "
                             "action=verify model=h3_tiny"),
    (["verify.seq_len=100000"], "verify.seq_len=100000: at most 256 rows on the CPU (the Triton interpreter takes "
                                "minutes per few hundred rows; longer runs need a GPU): python -m h3plan action=verify "
                                "model=h3_tiny"),
    (["verify.blocks=50"], "verify.blocks=50: at most 4 blocks on the CPU"),
])
def test_cpu_mistakes_are_one_line_user_errors(capsys, argv, message):
    """On a machine without CUDA: a CUDA device, or a length the interpreter would take many minutes over, is the
    user's request: exit 2, one line with the command that runs here (never `internal error: AssertionError`)."""
    import torch

    from h3plan import cli

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert cli.run(["action=verify", "model=h3_tiny", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("h3plan: error: " + message), err


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["fixed", "taylor"])
def test_verify_step_cache_reports_a_generation(setting, capsys):
    """step_cache: verify runs a generation of the plan's forwards cached and uncached: the computed count is
    the plan's, computed forwards bitwise the uncached ones, the skipped ones' error printed; the single forward of the
    whole-plan check is off the cache's schedule, computes, and stays bitwise equal to R."""
    import h3plan

    eager = {"levers.attention": "sdpa", "levers.qk_norm_rope": "eager", "levers.modulation": "eager",
             "levers.gated_residual": "off", "levers.swiglu": "off", "levers.step_cache": setting,
             "pipeline.num_inference_steps": 6,
             "recipe.cache": {"psnr_db_min": 28.0, "ssim_min": 0.93, "computed": 3, "warmup": 1, "final": 1,
                              "unmeasured": True}}
    p = h3plan.resolve_config(model="h3_tiny", **eager)
    rc = get_action("verify")(_cfg(), p)
    out = capsys.readouterr().out
    assert rc == 0, out
    line = next(x for x in out.splitlines() if x.startswith(f"PASS  step_cache={setting} (a generation)"))
    assert "3 of 5 forwards computed (plan: 3); computed forwards bitwise the uncached ones; 2 differ" in line
    assert "PASS  whole plan vs R                    bitwise equal" in out
