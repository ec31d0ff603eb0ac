"""step_cache on the tiny MiniMaxH3ModularPipeline (CPU): diffusers' own `pipe(...)` after `h3plan.install(pipe, plan)`.

Contract: a schedule that computes every forward, and first_block at threshold 0, are rtol=0, atol=0 against the same
plan with step_cache off (a computing forward runs diffusers' forward untouched); a schedule that skips computes
exactly the forwards its mask names (counters and calls(model)) at the request's step count, for two plans of two
step counts; a call at another step count computes every forward, counted with the reason, and the install report
says so; uninstall removes the hook by name. What a skipped forward returns: test_step_cache_trajectory.py.
"""

import pytest
import torch

pytest.importorskip("transformers", reason="diffusers' MiniMaxH3ModularPipeline imports transformers")

import h3plan  # noqa: E402
from h3plan.install import counters, reset_counters, uninstall  # noqa: E402
from h3plan.runtime.levers.step_cache import HOOK, STATE, calls  # noqa: E402
from h3plan.levers.step_cache import computed_mask  # noqa: E402
from h3plan.runtime.counters import fallback_reasons  # noqa: E402
from test_install_pipeline import _cfg  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 6  # 5 forwards
EAGER = {"levers.attention": "sdpa", "levers.vae_ops": "eager", "levers.vae_graphs": "off",
         "levers.qk_norm_rope": "eager", "levers.modulation": "eager", "levers.gated_residual": "off",
         "levers.swiglu": "off"}


def _pipe():
    from h3plan.actions.pipeline_build import build_pipeline

    return build_pipeline(_cfg("conf/model/h3_tiny.yaml"), _cfg("conf/vae/h3_tiny_pipe.yaml"), vae_name="h3_tiny_pipe",
                          layers=2, vae_dtype=torch.float32)


def _plan(setting, steps=STEPS, **cache):
    """The request's own step count (video.num_inference_steps); the pipeline's default stays diffusers' 50 unless
    `pipeline` says otherwise."""
    over = {"video.num_inference_steps": steps, **EAGER, "levers.step_cache": setting}
    if "pipeline" in cache:
        over["pipeline.num_inference_steps"] = cache.pop("pipeline")
    if setting != "off":  # seeded weights: no evidence covers these schedules
        over["recipe.cache"] = {"psnr_db_min": 28.0, "ssim_min": 0.93, "unmeasured": True, **cache}
    return h3plan.resolve_config(model="h3_tiny", vae="h3_tiny_pipe", **over)


def _call(pipe, steps=STEPS):
    from h3plan.actions.pipeline_build import prompt_inputs

    return pipe(**prompt_inputs(pipe, 4, seed=0), height=32, width=32, num_frames=124, num_inference_steps=steps,
                output_type="pt", output="videos", generator=torch.Generator("cpu").manual_seed(0))


@pytest.fixture(scope="module")
def uncached():
    pipe = _pipe()
    h3plan.install(pipe, _plan("off"))
    return _call(pipe)


@pytest.mark.parametrize("setting,cache", [("fixed", {"computed": 5, "warmup": 1, "final": 1}),
                                           ("taylor", {"computed": 5, "warmup": 1, "final": 1}),
                                           ("first_block", {"threshold": 0.0, "warmup": 1, "final": 1})])
def test_every_forward_computed_is_bitwise_the_plan_without_cache(uncached, setting, cache):
    pipe = _pipe()
    h3plan.install(pipe, _plan(setting, **cache))
    reset_counters()
    out = _call(pipe)
    torch.testing.assert_close(out, uncached, rtol=0, atol=0)
    c = counters()
    assert c["step_cache.fused"] == 5 and c["step_cache.computed"] == 5 and c["step_cache.calls"] == 1
    assert "step_cache.skipped" not in c and "step_cache.fallback" not in c
    assert calls(pipe.transformer) == [{"forwards": 5, "computed": 5, "skipped": 0}]


@pytest.mark.parametrize("steps,computed", [(4, 2), (6, 3)])
def test_the_request_steps_drive_the_schedule_through_pipe(steps, computed):
    """Two plans of two step counts, each from the request's video.num_inference_steps alone (the pipeline's default
    stays 50): diffusers' pipe(...) at the request's count skips what each plan's mask skips."""
    pipe = _pipe()
    plan = _plan("fixed", steps, computed=computed, warmup=1, final=1)
    n = steps - 1
    mask = computed_mask(n, computed, 1, 1)
    assert plan.decision("step_cache").param("skipped") == [i for i, m in enumerate(mask) if not m] != []
    report = h3plan.install(pipe, plan)
    assert any(f"planned for num_inference_steps={steps} (the request's)" in x for x in report["transformer"].notes)
    assert any("num_inference_steps=50 (the pipeline's default)" in x for x in report["transformer"].notes)
    ran = []
    handle = pipe.transformer.transformer_blocks[0].register_forward_hook(lambda *a: ran.append(1))
    reset_counters()
    _call(pipe, steps)
    handle.remove()
    c = counters()
    assert (c["step_cache.computed"], c["step_cache.skipped"], c["step_cache.calls"]) == (sum(mask), n - sum(mask), 1)
    assert "step_cache.fallback" not in c and len(ran) == sum(mask)
    assert pipe.transformer.__dict__[STATE].done == list(mask)  # what each forward did, in order


def test_a_call_at_another_step_count_computes_and_says_why():
    pipe = _pipe()
    report = h3plan.install(pipe, _plan("fixed", 4, computed=2, warmup=1, final=1, pipeline=STEPS))
    assert any(f"num_inference_steps={STEPS} (the pipeline's default), or at any count not planned, is not the plan's 4"
               in x for x in report["transformer"].notes)
    reset_counters()
    _call(pipe, STEPS)
    c = counters()
    # its first forward passes the vector every count's first forward passes: placed as the plan's, it computes
    assert (c["step_cache.fallback"], c["step_cache.computed"]) == (4, 1) and "step_cache.skipped" not in c
    assert calls(pipe.transformer) == []
    (why,) = fallback_reasons()["step_cache"]
    assert why.startswith(f"a call at num_inference_steps={STEPS}, not the plan's 4: every forward computed")
    reset_counters()
    _call(pipe, 3)  # a count nothing indexed
    assert any("no indexed step count" in w for w in fallback_reasons()["step_cache"])


def test_install_steps_run_the_plan_scaled_and_count_it():
    pipe = _pipe()
    report = h3plan.install(pipe, _plan("fixed", 4, computed=2, warmup=1, final=1), num_inference_steps=STEPS)
    assert any(f"num_inference_steps={STEPS} (install(num_inference_steps=)) run the plan's schedule scaled" in x
               for x in report["transformer"].notes)
    reset_counters()
    _call(pipe, STEPS)
    c = counters()
    assert c["step_cache.scaled"] == 5 and c["step_cache.skipped"] >= 1 and "step_cache.fallback" not in c


@pytest.mark.parametrize("setting", ["fixed", "taylor"])
def test_a_skipping_schedule_computes_its_mask_and_is_counted(uncached, setting):
    pipe = _pipe()
    report = h3plan.install(pipe, _plan(setting, computed=3, warmup=1, final=1))
    assert any("computes 3 of 5 forwards" in s.new for s in report["transformer"].swaps)
    reset_counters()
    out = _call(pipe)
    assert calls(pipe.transformer) == [{"forwards": 5, "computed": 3, "skipped": 2}]
    assert not torch.equal(out, uncached)  # the skipped forwards changed the trajectory
    assert uninstall(pipe)
    registry = getattr(pipe.transformer, "_diffusers_hook", None)
    assert registry is None or HOOK not in registry.hooks
    reset_counters()
    _call(pipe)
    assert "step_cache.fused" not in counters() and calls(pipe.transformer) == []


def test_first_block_skips_when_the_first_block_barely_moves():
    pipe = _pipe()
    h3plan.install(pipe, _plan("first_block", threshold=1e9, warmup=1, final=1, max_skip=2))
    reset_counters()
    _call(pipe)
    c = counters()
    # forwards 0 and 4 never skip (warm-up 1, final 1); 1 and 2 skip on forward 0's residual; 3 computes (max_skip 2
    # in a row)
    assert (c["step_cache.computed"], c["step_cache.skipped"]) == (3, 2)
    assert pipe.transformer.__dict__[STATE].done == [True, False, False, True, True]  # the bench times these apart
