"""`python -m h3plan action=calibrate calibrate.target=sparse_attention recipe.sparse={ssim_min:..} model.path=DIR`:
measure block-sparse attention on the user's checkpoint against the dense call, write every keep fraction's quality as
calibrated evidence, and the sparsest keep inside recipe.sparse's budget as a plan that cites it.

The same pipeline and prompts as calibrate.target=step_cache (h3plan/actions/calibrate_step_cache.py: diffusers' t2va
blocks, the transformer from `model.path`, seeded weights otherwise, which say nothing about a trained model's
attention: the output says so). For every prompt the plan with sparse_attention off gives the reference frames and
soundtrack; each candidate keep fraction (KEEPS, at recipe.sparse.dense_forwards) runs the same call (planned with
recipe.sparse.unmeasured=true: this run is its measurement) and becomes one calibrated quality point, the worst frames
PSNR and SSIM and the worst audio SNR over the prompts (quality.compare, quality.snr_db). Written: every point to
`calibrate.evidence_out` (facts/evidence.py format; null: sparse_attention_points.yaml), and the winner (the smallest
keep whose point meets the budget: the least attention work) to `calibrate.plan_out` (null:
sparse_attention_plan.yaml), planned with recipe.sparse.evidence set to the points file, so the plan cites them. None
inside: exit 2 with one line, no plan written.
"""

from __future__ import annotations

import math
import os
from datetime import datetime, timezone

from h3plan.errors import UsageError
from h3plan.facts import evidence as ev
from h3plan.levers import REGISTRY, TERM_OWNERS

from h3plan.facts.timesteps import request_steps

from .calibrate_step_cache import _finite, _pipe, call_inputs, calibration_runs, check_request
from .gpu_only import calibrate_too_wide

lever = REGISTRY[TERM_OWNERS["sparse_blocks"]]  # the lever calibrated
NAME = lever.SPEC.name

KEEPS = (0.5, 0.35, 0.25, 0.15)


def _variant(cfg, setting: str, keep: float | None, evidence: str | None = None):
    """The plan at one candidate: measured (no evidence yet: recipe.sparse.unmeasured) or, with `evidence`, cited."""
    from omegaconf import OmegaConf

    from h3plan.planner import resolve

    c = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    setattr(c.levers, NAME, setting)
    if keep is not None:
        c.recipe.sparse.keep = keep
        c.recipe.sparse.evidence = evidence
        c.recipe.sparse.unmeasured = evidence is None
    return c, resolve(c)


def run(cfg, plan, c) -> int:
    """CLI entry for calibrate.target=sparse_attention; `c` is the CalibrateConfig."""
    from .verify import _prepare_device

    sparse = plan.get("recipe").get("sparse") or {}
    budget = ev.Budget.of(sparse)
    if budget.empty:
        raise UsageError("calibrate.target=sparse_attention judges keep fractions by the sparse budget, which this "
                         "recipe does not set: pass recipe.sparse={ssim_min:0.8} (and/or psnr_db_min)")
    prompts = check_request(cfg, plan, c, NAME)
    device = _prepare_device(c.device, "calibrate.device")  # before the kernels import: TRITON_INTERPRET on a CPU
    if device == "cpu" and int(cfg.model.diffusers_config.hidden_size) > 1024:
        raise UsageError(calibrate_too_wide(NAME))
    import torch

    from h3plan.actions.calibration import say
    from h3plan.install import install, uninstall

    from .quality import compare, snr_db

    video = plan.get("video")
    steps = request_steps(plan.derived_value("sequence") or video, plan.get("pipeline"))
    runs, said = calibration_runs(cfg, c, prompts, device)
    pipe, weights = _pipe(cfg, device)

    def call(p):
        install(pipe, p)
        try:
            out = []
            for run in runs:
                r = pipe(**call_inputs(pipe, run, c.text_tokens), height=int(video["height"]),
                         width=int(video["width"]), num_frames=int(video["frames"]), num_inference_steps=steps,
                         output_type="pt", output=["videos", "audio"],
                         generator=torch.Generator("cpu").manual_seed(run[1]))
                out.append((r["videos"], r["audio"]))
            return out
        finally:
            uninstall(pipe)

    _, off = _variant(cfg, "off", None)
    refs = call(off)
    say(f"calibrate sparse_attention: {weights}; {said}; budget {budget.text()} against the dense frames; dense "
        f"forwards {sparse.get('dense_forwards')}")
    results, points = [], []
    for keep in KEEPS:
        _, vplan = _variant(cfg, "block_sparse", keep)
        outs = call(vplan)
        q = [compare(o[0].float(), r[0].float()) for o, r in zip(outs, refs)]
        snr = [snr_db(o[1].float(), r[1].float()) for o, r in zip(outs, refs)]
        d = vplan.decision(NAME)
        point = _finite(ev.QualityPoint.make(
            NAME, "block_sparse", {k: d.param(k) for k in ("keep", "dense_forwards",
                                                                      "video_only", "forwards")},
            ["t2va"], psnr_db=min(math.inf if x["psnr_db"] is None else x["psnr_db"] for x in q),
            ssim=min(x["ssim"] for x in q), audio_snr_db=min(math.inf if x is None else x for x in snr),
            speedup=None, kind="calibrated",
            where=f"{len(runs)} prompts, worst of each; {d.param('sparse_forwards')} of {d.param('forwards')} "
                  f"forwards sparse; {weights}"))
        points.append(point)
        ok = point.meets(budget)
        results.append((ok, keep, point))
        say(f"  keep {keep:g}: worst {point.quality()}: {'inside' if ok else 'outside'} the budget")
    evidence = os.path.abspath(str(c.evidence_out or f"{NAME}_points.yaml"))
    ev.write_points(evidence, NAME, points, checkpoint=cfg.model.get("path"),
                    date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    say(f"calibrate sparse_attention: {len(points)} calibrated points written to {evidence} "
        f"(recipe.sparse.evidence={evidence})")
    inside = sorted((r for r in results if r[0]), key=lambda r: r[1])
    if not inside:
        raise UsageError(f"calibrate sparse_attention: no keep fraction stays inside {budget.text()} on these prompts "
                         f"({len(results)} tried; points in {evidence}); no plan written: keep "
                         f"levers.{NAME}=off")
    _, keep, point = inside[0]
    _, best = _variant(cfg, "block_sparse", keep, evidence=evidence)
    out = str(c.plan_out or f"{NAME}_plan.yaml")
    best.save(out)
    say(f"calibrate sparse_attention: keep {keep:g} at worst {point.quality()}: plan written to {out} "
        f"(install it with h3plan.install(pipe, '{out}'))")
    return 0
