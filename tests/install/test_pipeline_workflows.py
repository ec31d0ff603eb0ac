"""Every workflow of diffusers' MiniMaxH3ModularPipeline (t2va, fl2va, ref2va) on the tiny pipeline holding both
partitions (CPU): `h3plan.install(pipe, plan)` then diffusers' own `pipe(...)`, against the same call without the plan.

Contract: rtol=0, atol=0 (videos and audio), the transformers' kernels off (sdpa, eager modulation: the installer
tests' business), adaln_table on, so the AdaLN tables of each partition serve the call. Table misses are counted
exactly: a call whose timestep vectors the partition's keys do not hold (workflows.py) misses once per AdaLN linear
per forward on its first call, then hits (each miss adds its entry); `h3plan.prepare` tables them ahead.
"""

import pytest
import torch

pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")

import h3plan  # noqa: E402
from h3plan.install import counters, install, reset_counters, uninstall  # noqa: E402
from test_install_pipeline import _cfg  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 3  # MiniMaxH3Scheduler: 2 transformer forwards
SIZE = 32


def _pipe():
    from h3plan.actions.pipeline_build import build_pipeline, workflow_blocks

    pipe = build_pipeline(_cfg("conf/model/h3_tiny.yaml"), _cfg("conf/vae/h3_tiny_pipe.yaml"), vae_name="h3_tiny_pipe",
                          layers=1, blocks=workflow_blocks(), partitions=("transformer", "transformer_ref"))
    # the tiny VAE's canvas: references resized to the generated size, not the release's 2048 px short edge
    pipe.register_to_config(reference_image_short_edge=SIZE)
    return pipe


@pytest.fixture(scope="module")
def pipes():
    return _pipe(), _pipe()


def _plan(**over):
    return h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe",
                                 **{"levers.attention": "sdpa", "levers.adaln_table": "on", "levers.vae_graphs": "off",
                                    "levers.qk_norm_rope": "eager", "levers.modulation": "eager",
                                    "levers.gated_residual": "off", "levers.swiglu": "off", **over})


def _call(pipe, workflow, audio_reference=False):
    from h3plan.actions.pipeline_build import prompt_inputs, workflow_inputs

    media = workflow_inputs(pipe, workflow, SIZE, SIZE, seed=1, audio_reference=audio_reference)
    out = pipe(**prompt_inputs(pipe, 4, seed=0), **media, height=SIZE, width=SIZE, num_frames=124,
               num_inference_steps=STEPS, output_type="pt", output=["videos", "audio"],
               generator=torch.Generator("cpu").manual_seed(0))
    return out["videos"], out["audio"]


def _table_counts():
    c = counters()
    return c.get("adaln_table.fused", 0), c.get("adaln_table.fallback", 0)


# (workflow, audio reference, misses on the first call of a t2va plan): AdaLN linears = 1 block + norm_out
LINEARS, FORWARDS = 2, STEPS - 1
CASES = [("t2va", False, 0), ("fl2va", False, LINEARS * FORWARDS), ("ref2va", False, 0),
         ("ref2va", True, LINEARS * FORWARDS)]


@pytest.mark.parametrize("workflow,audio_ref,misses", CASES, ids=["t2va", "fl2va", "ref2va", "ref2va-audio-ref"])
def test_each_workflow_runs_bitwise_with_its_partition_tables(pipes, workflow, audio_ref, misses):
    pipe, ref_pipe = pipes
    uninstall(pipe)
    report = install(pipe, _plan(), num_inference_steps=STEPS)
    assert set(report.reports) >= {"transformer", "transformer_ref", "vae"}
    ref_notes = " ".join(report["transformer_ref"].notes)
    assert "transformer_ref serves ref2va" in ref_notes and "condition_video=True" in ref_notes
    assert "encode (keyframes, references)" in " ".join(report["vae"].notes)
    want = _call(ref_pipe, workflow, audio_ref)
    for attempt, expect_misses in enumerate((misses, 0)):  # a miss adds its entry: the second call hits
        reset_counters()
        got = _call(pipe, workflow, audio_ref)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        fused, fallback = _table_counts()
        assert (fused + fallback, fallback) == (LINEARS * FORWARDS, expect_misses), (attempt, dict(counters()))
        if fallback:
            assert all("not in the table" in r for r in counters().reasons["adaln_table"]), counters().reasons


def test_prepare_tables_a_workflow_ahead(pipes):
    pipe, ref_pipe = pipes
    uninstall(pipe)
    install(pipe, _plan(), num_inference_steps=STEPS)
    added = h3plan.prepare(pipe, num_inference_steps=STEPS, condition_video=True)
    assert added == FORWARDS  # fl2va's vectors on transformer (transformer_ref has them already)
    reset_counters()
    got, want = _call(pipe, "fl2va"), _call(ref_pipe, "fl2va")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert _table_counts() == (LINEARS * FORWARDS, 0)
    uninstall(pipe)


# vae_encode_precision on the tiny pipeline: the fl2va / ref2va plans (their requests encode) keep diffusers' fp32
# encode, bitwise; a forced fp16 encode (under recipe.vae=fp16, the decode kept fp32 so only the encode differs)
# changes the conditioning latents: the frames stay within ENCODE_VIDEO_ATOL of the fp32-encode frames (pixels in
# [0, 1]) and are not bitwise (the lever ran). 1 transformer block, 2 forwards: a stated tolerance for this tiny call
# only.
ENCODE_VIDEO_ATOL = 5e-3  # measured on the CPU: 7.5e-4 (fl2va), 7.8e-4 (ref2va)
ENCODE_REQUEST = {"fl2va": {"video.task": "fl2va", "video.keyframes": ["first"]},
                  "ref2va": {"video": "ref2va_768x1344_5s"}}


@pytest.mark.parametrize("workflow", ["fl2va", "ref2va"])
def test_the_encode_lever_keeps_the_default_bitwise_and_a_forced_fp16_encode_within_tolerance(pipes, workflow):
    pipe, ref_pipe = pipes
    want = _call(ref_pipe, workflow)
    uninstall(pipe)
    plan = _plan(**ENCODE_REQUEST[workflow])
    assert plan.decision("vae_encode_precision").setting == "fp32"
    install(pipe, plan, num_inference_steps=STEPS)
    for g, w in zip(_call(pipe, workflow), want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    uninstall(pipe)
    forced = _plan(**ENCODE_REQUEST[workflow], **{"recipe.vae": "fp16", "levers.vae_precision": "fp32",
                                                  "levers.vae_encode_precision": "fp16"})
    report = install(pipe, forced, num_inference_steps=STEPS)
    assert "vae_encode_precision=fp16" in " ".join(report["vae"].notes)
    got = _call(pipe, workflow)
    uninstall(pipe)
    assert {p.dtype for p in pipe.vae.encoder.parameters()} == {torch.float32}  # uninstall restored it
    err = (got[0].float() - want[0].float()).abs().max().item()
    assert 0 < err <= ENCODE_VIDEO_ATOL, err
    for g, w in zip(_call(pipe, workflow), want):  # and the call after uninstall is diffusers' again, bit for bit
        torch.testing.assert_close(g, w, rtol=0, atol=0)
