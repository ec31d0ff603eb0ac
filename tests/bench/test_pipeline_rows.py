"""The pipeline bench's row bookkeeping (h3plan/actions/bench/pipeline.py), without a pipeline: the checks a row
declares (a step-cache row's overhead in every mode, a whole call against its extrapolation, a bitwise comparison),
the frames' comparison when the device has no room left, and a row that starts with memory an earlier row left."""

import pytest
import torch

from h3plan.actions.bench import pipeline as P, pipeline_checks as checks


def _full(mode, e2e, computed=20, forwards=49, skipped_s=2.6):
    return {"e2e_s": e2e, "forwards": forwards, "computed": computed, "skipped": forwards - computed,
            "skipped_s": skipped_s, "mode": mode}


@pytest.mark.parametrize("mode", ["fixed", "first_block"])
def test_every_step_cache_mode_is_checked_against_its_overhead_bound(mode):
    """The overhead check is declared before the runs for every cached call (E2E <= 1.03 x (per kind of computed
    forward: count x median, + rest)): a PASS or FAIL field in the row, first_block included (its skipped forwards'
    first block and decision are overhead the check counts). The H200's first_block row (pipeline-h200.json,
    rounded): 86.50 s against 1.03 x 83.87 s = 86.39 s, FAIL."""
    notes, ok = P.step_cache_notes(_full(mode, 186.6, computed=34), [(34, 5.365)], 4.24)
    assert notes[0].startswith("step_cache: the whole call, 34 of 49 forwards computed")
    assert ok["name"] == "overhead" and ok["result"] == "PASS" and ok["rule"] == checks.RULES["overhead"]
    assert ok["detail"].startswith("E2E 186.60 s <= 1.03 x (34 x 5.365 s + rest 4.24 s) = 192.25 s")
    assert P.step_cache_notes(_full(mode, 200.0, computed=34), [(34, 5.365)], 4.24)[1]["result"] == "FAIL"
    first_block = P.step_cache_notes(_full(mode, 86.5), [(20, 4.051)], 2.85)[1]
    assert first_block["result"] == "FAIL"
    assert "> 1.03 x (20 x 4.051 s + rest 2.85 s) = 86.39 s (1.031x)" in first_block["detail"]
    # no forward timed: no bound, no pass
    assert P.step_cache_notes(_full(mode, 86.5), [], 2.85)[1]["result"] == "FAIL"


def test_a_call_with_dense_and_sparse_forwards_is_bounded_per_kind():
    """The tier's whole call on the H200 (pipeline-h200.json, 12-03 16:37, rounded): 7 computed dense forwards of
    ~4.50 s and 39 sparse ones (the first 6.23 s, its JIT); one median for all (2.518 s) undercounts the dense ones."""
    secs = [4.5] * 4 + [0.1, 4.5, 0.1, 4.5, 0.1, 4.5] + [6.23] + [2.515] * 38
    computed = [t > 1 for t in secs]
    kinds = P.forward_kinds(secs, computed, dense=10)
    assert kinds == [(7, 4.5), (39, 2.515)]
    assert P.forward_kinds(secs, computed, dense=None) == [(46, 2.515)]
    jit = P.step_cache_notes(_full("first_block", 137.81, computed=46), kinds, 4.16)[1]
    assert jit["detail"] == "E2E 137.81 s > 1.03 x (7 x 4.500 s + 39 x 2.515 s + rest 4.16 s) = 137.76 s (1.030x)"
    assert jit["result"] == "FAIL"  # the first sparse forward's 3.7 s JIT inside the timed call
    warm = P.step_cache_notes(_full("first_block", 137.81 - 3.7, computed=46), kinds, 4.16)[1]
    assert warm["result"] == "PASS"


def test_a_whole_call_is_checked_against_the_short_calls_extrapolation():
    """Within 1% of forwards x the short call's median forward + its rest: PASS; beyond, or nothing to extrapolate
    from: FAIL."""
    assert checks.extrapolation(49, 5.95, 7.2, 49 * 5.95 + 7.2)["result"] == "PASS"
    near = checks.extrapolation(49, 5.95, 7.2, (49 * 5.95 + 7.2) * 1.009)
    far = checks.extrapolation(49, 5.95, 7.2, (49 * 5.95 + 7.2) * 1.011)
    assert near["result"] == "PASS" and far["result"] == "FAIL" and "(-1.09%)" in far["detail"]
    assert checks.extrapolation(49, None, 7.2, 300.0)["result"] == "FAIL"


def test_a_bitwise_check_without_frames_fails():
    assert checks.bitwise({"bitwise": True}, "its reference")["result"] == "PASS"
    assert checks.bitwise({"bitwise": False, "psnr_db": 76.3}, "x")["detail"] == "differs from x (PSNR 76.3 dB)"
    assert checks.bitwise(None, "its reference")["result"] == "FAIL"


def test_frames_are_compared_on_the_host_when_the_device_has_no_room(monkeypatch):
    a = torch.rand(2, 3, 8, 8)
    real, seen = P._compared, []

    def full_device(torch_, x, y):
        seen.append(x.device.type)
        if len(seen) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.43 GiB")
        return real(torch_, x, y)

    monkeypatch.setattr(P, "_compared", full_device)
    out = P._compare(torch, torch.device("cpu"), a, a.clone())
    assert len(seen) == 2 and out["bitwise"] is True and out["note"] == "compared on the host (no device memory left)"


@pytest.mark.parametrize("left, noted", [(0.0, False), (1.4, True)])
def test_a_row_that_starts_with_memory_left_by_another_says_so(monkeypatch, left, noted):
    """_Session.settle records what an earlier row still holds after gc (1.4 GiB more than the eager row had is
    enough for the fl2va reference row to run out of memory on the H200); the record names it."""
    s = P._Session.__new__(P._Session)
    s.torch, s.device, s.resting, s.tensors = torch, torch.device("cuda"), None, None
    allocated = iter([10 * 2**30, (10 + left) * 2**30])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: next(allocated))
    first, second = P._Row(P.Setting(), [], []), P._Row(P.Setting(), [], [])
    s.settle(first)
    s.settle(second)
    assert first.left_gib is None and (second.left_gib == pytest.approx(left) if noted else second.left_gib is None)
    assert second.left_what == ("none that Python reaches" if noted else "")  # this machine's tensors are no CUDA's


def test_what_an_earlier_row_left_is_named_by_its_tensors_beyond_the_first_rows():
    """A weight put back in new memory (an uninstall) counts as the one it replaced; what is left over is named,
    largest first."""
    from collections import Counter

    w, frames = (2**26, (4096, 8192), "bfloat16"), (1535115264, (1, 124, 3, 768, 1344), "float32")
    before = Counter([w, w])
    assert P.extra_tensors(Counter([w, w]), before) == "none that Python reaches"
    assert P.extra_tensors(Counter([w, w, frames, w]), before) == \
        "[1, 124, 3, 768, 1344] float32 1464 MiB, [4096, 8192] bfloat16 64 MiB"


class _Plan:
    """What the frames' bookkeeping reads of a plan: its groups' names and whether it is lossless."""

    def __init__(self, lossless):
        self.lossless = lossless

    def get(self, group):
        return {"hardware": {"name": "sm90"}, "parallel": {"name": "u1", "ulysses": 1}}[group]


def _setting(name, label, vae, plan=None, of=None):
    s = P.Setting()
    s.name, s.label, s.vae, s.plan, s.of = name, label, vae, plan, of
    return s


def _row(setting, frames, forwards):
    row = P._Row(setting, [1.0], [1.0])
    row.frames, row.frames_forwards = frames, forwards
    return row


def _rec():
    from h3plan.actions.bench.pipeline_records import CallRecord

    return CallRecord(run="r2", video="32x32x124", S=1, gpus=1, setting="plan", label="x", vae="fp16", forward_s=1.0,
                      rest_s=1.0, wall_s=2.0, e2e_s=2.0, steps_e2e=49)


def _opts(frames_dir=None):
    return P.PipelineBenchOptions(**{**P.DEFAULTS, "vae": (), "plans": (), "frames_dir": frames_dir, "video": None,
                                     "out_dir": "x", "tag": None})


def test_frames_compare_only_calls_of_as_many_forwards_and_a_lossy_plan_meets_the_lossless_one():
    """A whole call's frames (49 forwards) never meet a short call's (3); a lossy plan's frames are held against the
    lossless plan's (sm90/bf16/u1, fp32 VAE) from a call of as many forwards."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 8, 8, generator=g)
    eager = _row(_setting("eager", "diffusers eager", "fp16"), x, 3)
    lossless = _row(_setting("plan", "sm90/bf16/u1", "fp32", _Plan(True)), x, 49)
    lossy = _row(_setting("plan", "sm90/fp8/u1 +vae=fp16", "fp16", _Plan(False)), (x + 0.01).clamp(0, 1), 49)
    rec = _rec()
    P._frames(torch, torch.device("cpu"), _opts(), lossy, [eager, lossless, lossy], rec, None)
    assert rec.frames == {} and rec.checks == []  # eager's frames came from a 3-forward call
    vs = rec.frames_vs_lossless
    assert vs["against"] == "sm90/bf16/u1 (fp32 VAE)" and vs["from"] == "this run" and 35 < vs["psnr_db"] < 45
    eager.frames_forwards = 49
    rec = _rec()
    P._frames(torch, torch.device("cpu"), _opts(), lossy, [eager, lossless, lossy], rec, None)
    assert rec.frames["against"] == "diffusers eager (fp16 VAE)" and rec.frames["bitwise"] is None


def test_a_lossy_plan_meets_the_lossless_frames_an_earlier_run_kept(tmp_path):
    """bench.pipeline.frames_dir: one run keeps the lossless plan's frames, a later run (another process) compares its
    lossy plan with them, only where the seeded weights' fingerprint is the same."""
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    store = {"dir": str(tmp_path), "fingerprint": "w1"}
    lossless = _row(_setting("plan", "sm90/bf16/u1", "fp32", _Plan(True)), x, 49)
    first = _rec()
    first.run = "r1"
    P._frames(torch, torch.device("cpu"), _opts(str(tmp_path)), lossless, [lossless], first, store)
    assert lossless.stored and len(list(tmp_path.glob("*.pt"))) == 1
    lossy = _row(_setting("plan", "sm90/fp8/u1 +vae=fp16", "fp16", _Plan(False)), (x * 0.99), 49)
    rec = _rec()
    P._frames(torch, torch.device("cpu"), _opts(str(tmp_path)), lossy, [lossy], rec, store)
    assert rec.frames_vs_lossless["from"] == "run r1 (bench.pipeline.frames_dir)"
    assert rec.frames_vs_lossless["psnr_db"] > 30
    other = _row(_setting("plan", "sm90/fp8/u1 +vae=fp16", "fp16", _Plan(False)), x, 49)
    rec = _rec()
    P._frames(torch, torch.device("cpu"), _opts(str(tmp_path)), other, [other], rec, {**store, "fingerprint": "w2"})
    assert rec.frames_vs_lossless == {}  # frames of other weights never compare
    short = _row(_setting("plan", "sm90/fp8/u1 +vae=fp16", "fp16", _Plan(False)), x, 3)
    rec = _rec()
    P._frames(torch, torch.device("cpu"), _opts(str(tmp_path)), short, [short], rec, store)
    assert rec.frames_vs_lossless == {}  # no lossless frames from a 3-forward call


def test_a_plan_whose_reference_failed_records_its_bitwise_check_failed():
    """The reference row ran out of memory (no frames): the plan's declared bitwise check is a FAIL, never absent."""
    x = torch.rand(1, 3, 4, 4)
    plan = _setting("plan", "sm90/bf16/u1", "fp32", _Plan(True))
    ref = _row(_setting("reference", "eager with sm90/bf16/u1's attention", "fp32", of=plan), None, None)
    ref.error = "OutOfMemoryError: CUDA out of memory"
    row = _row(plan, x, 3)
    rec = _rec()
    P._frames(torch, torch.device("cpu"), _opts(), row, [ref, row], rec, None)
    assert [(c["name"], c["result"]) for c in rec.checks] == [("bitwise", "FAIL")] and rec.frames == {}
    ref.frames, ref.frames_forwards, ref.error = x.clone(), 3, None
    rec = _rec()
    P._frames(torch, torch.device("cpu"), _opts(), row, [ref, row], rec, None)
    assert [(c["name"], c["result"]) for c in rec.checks] == [("bitwise", "PASS")] and rec.frames["bitwise"] is True


def test_a_run_without_its_own_compile_takes_the_latest_of_the_same_request():
    """fill_speedups: a lossy row's ratio against diffusers' compile at its own VAE precision, from an earlier run of
    the same request where its run has none (best_run names it; a whole call preferred), never another request's."""
    from h3plan.actions.bench.pipeline_records import fill_speedups

    req = {"workflow": "t2va", "video": "768x1344x124", "S": 37820, "gpus": 1, "layers": 50, "steps_e2e": 49}
    old = [{**req, "run": "a", "setting": "best", "label": "b", "vae": "fp16", "e2e_s": 300.0, "wall_s": 20.0},
           {**req, "run": "b", "setting": "best", "label": "b", "vae": "fp16", "e2e_s": 310.0, "wall_s": 310.0,
            "whole_call": True},
           {**req, "run": "c", "setting": "best", "label": "b", "vae": "fp16", "e2e_s": 280.0, "wall_s": 20.0, "S": 1}]
    rows = [{**req, "run": "d", "setting": "plan", "label": "p", "vae": "fp16", "e2e_s": 155.0}]
    fill_speedups(rows, old)
    assert rows[0]["best_run"] == "b" and rows[0]["speedup_vs_best"] == pytest.approx(2.0)
    alone = [{**req, "run": "d", "setting": "plan", "label": "p", "vae": "bf16", "e2e_s": 155.0}]
    fill_speedups(alone, old)
    assert alone[0]["speedup_vs_best"] is None and "best_run" not in alone[0]
    # another card's compile is no baseline: an H100 plan row never takes an H200 run's compile, nor the reverse
    h200 = [{**r, "device": "NVIDIA H200"} for r in old]
    h100 = [{**req, "run": "d", "setting": "plan", "label": "p", "vae": "fp16", "e2e_s": 155.0,
             "device": "NVIDIA H100 80GB HBM3"}]
    fill_speedups(h100, h200)
    assert h100[0]["speedup_vs_best"] is None and "best_run" not in h100[0]
    same = [{**h100[0], "device": "NVIDIA H200"}]
    fill_speedups(same, h200)
    assert same[0]["best_run"] == "b"


def test_a_plan_without_diffusers_rows_in_its_run_meets_an_earlier_runs_compile(tmp_path):
    """A run of the fp8 plan alone (bench.pipeline.eager=false best=false) compares its whole call's frames with the
    frames diffusers' compile at the same VAE precision left in frames_dir (a run before, another process): PSNR,
    no bitwise claim."""
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    store = {"dir": str(tmp_path), "fingerprint": "w"}
    best = _row(_setting("best", "diffusers transformer.compile_repeated_blocks(fullgraph=True)", "fp16"), x, 49)
    P._frames(torch, torch.device("cpu"), _opts(str(tmp_path)), best, [best], _rec(), store)
    plan = _row(_setting("plan", "sm90/fp8/u1 +vae=fp16", "fp16", _Plan(False)), x * 0.98, 49)
    rec = _rec()
    P._frames(torch, torch.device("cpu"), _opts(str(tmp_path)), plan, [plan], rec, store)
    assert rec.frames["against"] == "diffusers transformer.compile_repeated_blocks(fullgraph=True) (fp16 VAE)"
    assert rec.frames["from"] == "run r2 (bench.pipeline.frames_dir)" and rec.frames["bitwise"] is None
    assert rec.frames["psnr_db"] > 30 and rec.checks == []


def test_options_time_any_subset_of_rows_but_not_none():
    from h3plan.errors import UsageError

    o = P.options({"bench": {"out_dir": "x", "pipeline": {"eager": False, "plan": False}}})
    assert (o.eager, o.best, o.plan) == (False, True, False)
    with pytest.raises(UsageError, match="^bench.pipeline.best=false eager=false plan=false: no row to time$"):
        P.options({"bench": {"out_dir": "x", "pipeline": {"eager": False, "plan": False, "best": False}}})


def test_a_whole_turn_keeps_the_short_calls_figures_apart_from_the_whole_calls(monkeypatch):
    """bench.pipeline.whole: the short call (2 untimed + 3 timed forwards) gives the extrapolation, the whole call
    (every forward) the E2E; each keeps its own rest."""
    s = P._Session.__new__(P._Session)
    s.opts, s.full_forwards, s.last_parts, s.progress = _opts(), 6, {}, P.Quiet()
    calls = iter([(None, [9.0, 2.0, 1.0, 1.2, 1.1], 20.0), (None, [1.0, 1.1, 1.2, 1.0, 1.3, 1.1], 12.0)])
    monkeypatch.setattr(s, "call", lambda forwards=None: next(calls), raising=False)
    row = P._Row(P.Setting(), [], [])
    s.whole_turn(row, row.setting)
    assert row.whole == {"e2e_s": 12.0, "forwards": 6, "short_forwards_s": [1.0, 1.2, 1.1],
                         "short_rest_s": pytest.approx(20.0 - 14.3)}
    assert row.call_forwards == [1.0, 1.1, 1.2, 1.0, 1.3, 1.1] and row.walls == [pytest.approx(12.0 - 6.7)]
    assert row.first == 9.0


def test_a_sparse_plan_is_warmed_up_to_its_first_sparse_forward():
    """A plan with block-sparse attention: before its timed whole call the bench runs the plan's own schedule, untimed,
    up to its first sparse forward (dense_forwards + 1 forwards) and stops there, so that kernel's JIT is not timed (the
    H200 tier row's first sparse forward took 6.23 s against 2.52 s); a plan without it runs no such call."""
    from types import SimpleNamespace

    import h3plan

    made = []

    class Transformer(torch.nn.Module):
        def forward(self, x):
            made.append(1)
            return x

    def pipe(num_inference_steps, **_):
        for _ in range(num_inference_steps - 1):
            pipe.transformer(torch.zeros(1))
        return "frames"

    pipe.transformer = Transformer()
    session = SimpleNamespace(pipe=pipe, request=SimpleNamespace(height=32, width=32, num_frames=124), prompt={},
                              media={}, opts=SimpleNamespace(seed=0, whole=True), full_forwards=49, torch=torch,
                              fw=SimpleNamespace(sync=lambda: None))
    tier = SimpleNamespace(name="plan", plan=h3plan.resolve_config(tier="quality"))
    P._Session.warm_sparse(session, tier)
    assert len(made) == tier.plan.decision("sparse_attention").param("dense_forwards") + 1 == 11
    assert not pipe.transformer._forward_hooks  # its counting hook removed
    made.clear()
    P._Session.warm_sparse(session, SimpleNamespace(name="plan", plan=h3plan.resolve_config(recipe="fp8")))
    assert not made


ADAPTIVE = {"psnr_db_min": 28, "ssim_min": 0.93, "threshold": 0.08, "warmup": 4, "final": 1, "max_skip": 2,
            "unmeasured": True}


def _fp8_row(**extra):
    return {"run": "2026-01-01 00:00:00", "workflow": "t2va", "setting": "plan", "recipe": "fp8", "gpus": 1,
            "label": "sm90/fp8/u1 +step_cache=first_block +vae=fp16", "vae": "fp16",
            "request": {"video": "t2v_768x1344_5s", "video.task": "t2va", "memory.text_encoder": "auto"}, **extra}


def test_a_row_records_the_recipe_fields_its_label_cannot_say():
    """`+vae=fp16` on an fp8 row is the decode's precision: the fp8 recipe's FP8 tiles or, with recipe.vae=fp16,
    diffusers' tiles. The bench records the recipe fields a run set (recipe_overrides) and replan composes them."""
    from h3plan.actions.bench.pipeline_records import recipe_overrides, replan
    from h3plan.planner import resolve_config

    plain = resolve_config(hardware="sm90", parallel="u1", recipe="fp8")
    assert recipe_overrides(plain) == {}
    ran = resolve_config(hardware="sm90", parallel="u1", recipe="fp8", **{"recipe.vae": "fp16",
                                                                           "recipe.cache": ADAPTIVE,
                                                                           "levers.step_cache": "first_block"})
    over = recipe_overrides(ran)
    assert over["recipe.vae"] == "fp16" and over["recipe.cache"]["threshold"] == 0.08
    assert replan(_fp8_row(), hardware="sm90").decision("vae_tiles").setting == "fp8_tiles"  # the label alone
    again = replan(_fp8_row(recipe_overrides=over), hardware="sm90")
    assert again.decision("vae_tiles").setting == ran.decision("vae_tiles").setting == "default"
    assert again.get("recipe")["cache"] == ran.get("recipe")["cache"]


def test_a_row_from_before_recipe_overrides_takes_its_corrections():
    from h3plan.actions.bench.pipeline_records import replan

    row = _fp8_row()
    key = {k: row[k] for k in ("run", "workflow", "setting", "label", "vae")}
    fixes = [{"row": key, "what": "x", "recipe_overrides": {"recipe.vae": "fp16", "recipe.cache": ADAPTIVE}},
             {"row": {**key, "run": "2026-01-02 00:00:00"}, "what": "another row's", "recipe_overrides": {}}]
    assert replan(row, fixes=fixes, hardware="sm90").decision("vae_tiles").setting == "default"
    assert replan(row, fixes=fixes[1:], hardware="sm90").decision("vae_tiles").setting == "fp8_tiles"


def test_a_replan_note_is_no_correction_of_the_rows_figures():
    from h3plan.actions.bench.pipeline_records import checks_text

    row = {**_fp8_row(), "checks": [{"name": "overhead", "result": "PASS"}]}
    key = {k: row[k] for k in ("run", "workflow", "setting", "label", "vae")}
    note = {"row": key, "what": "replanned", "recipe_overrides": {"recipe.vae": "fp16"}}
    assert checks_text(row, [note]) == "overhead PASS"
    assert checks_text(row, [{"row": key, "what": "edited after the run"}]) == "overhead PASS (corrected)"
    assert checks_text(row, [{**note, "checks": [{"name": "bitwise", "result": "FAIL"}]}]) == \
        "overhead PASS, bitwise FAIL (corrected)"
