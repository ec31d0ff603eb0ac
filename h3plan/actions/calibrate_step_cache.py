"""`python -m h3plan action=calibrate calibrate.target=step_cache recipe.cache={psnr_db_min:..,ssim_min:..} model.path=DIR`:
measure step-cache configs on the user's checkpoint and write the fastest one inside the cache budget into a plan file.

Pipeline: diffusers' t2va denoise + decode blocks (h3plan/actions/pipeline_build.py), the transformer from `model.path`
(from_pretrained; null: seeded weights, which say nothing about a trained model's steps: the output says so), the VAE
from DIR/vae where the folder has one (else seeded from the `vae` config), the audio VAE seeded (the frames compared are
the video's). Prompts: `calibrate.seeds` seeded prompt embeddings and noise (a prompt's text encoder output is not part
of this: `calibrate.inputs` is not read here). Request: the plan's `video` and `pipeline.num_inference_steps`.

For every prompt the plan with step_cache off gives the reference frames; each candidate (fixed and taylor at
computed forwards 90, 80, 70, 60, 50% of the request's, first_block at thresholds 0.04, 0.08, 0.12, 0.2; warm-up and
final from recipe.cache) runs the same call and is judged by its worst PSNR and SSIM over the prompts (quality.compare).
Speed is ranked by forwards computed (mean over the prompts; first_block also pays its first block on every skipped
forward, so it ranks after a fixed schedule computing as many), not by a clock. The winner's plan (this plan's config
with levers.step_cache and recipe.cache.computed / threshold set) goes to `calibrate.plan_out`; none inside the
budget: exit 2 with one line, nothing written.
"""

from __future__ import annotations

import os

from h3plan.errors import UsageError

from .gpu_only import calibrate_too_wide
from .pipeline_build import build_pipeline, prompt_inputs

FRACTIONS = (0.9, 0.8, 0.7, 0.6, 0.5)
THRESHOLDS = (0.04, 0.08, 0.12, 0.2)
ORDER = ("fixed", "taylor", "first_block")


def candidates(forwards: int, warmup: int, final: int) -> list[tuple[str, dict]]:
    """(setting, recipe.cache values) in the order tried; fixed schedules that skip at least one forward."""
    out: list[tuple[str, dict]] = []
    for c in sorted({-(-forwards * round(f * 10) // 10) for f in FRACTIONS}, reverse=True):
        if warmup + final <= c < forwards:
            out += [(s, {"computed": c}) for s in ("fixed", "taylor")]
    return out + [("first_block", {"threshold": t}) for t in THRESHOLDS]


def _variant(cfg, setting: str, values: dict):
    from omegaconf import OmegaConf

    from h3plan.planner import resolve

    c = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    c.levers.step_cache = setting
    for k, v in values.items():
        c.recipe.cache[k] = v
    return c, resolve(c)


def _pipe(cfg, device):
    from .inputs import load_model

    path = cfg.model.get("path")
    pipe = build_pipeline(cfg.model.diffusers_config, cfg.vae.diffusers_config, vae_name=cfg.vae.name, device=device)
    weights = "seeded weights (they carry no trained model's step-to-step statistics: the numbers say nothing about your videos)"
    if path:
        pipe.update_components(transformer=load_model(path, device=device))
        weights = f"model.path={path}"
        if os.path.isdir(os.path.join(path, "vae")):
            from diffusers import AutoencoderKLMiniMaxH3

            pipe.update_components(vae=AutoencoderKLMiniMaxH3.from_pretrained(path, subfolder="vae").to(device).eval())
            weights += " (transformer and VAE)"
        else:
            weights += " (transformer; the VAE seeded: the folder has no vae/)"
    return pipe, weights


def run(cfg, plan, c) -> int:
    """CLI entry for calibrate.target=step_cache; `c` is the CalibrateConfig."""
    import torch

    from h3plan.actions.calibration import say
    from h3plan.install import install, uninstall
    from h3plan.install.step_cache import calls

    from .quality import compare
    from .verify import _prepare_device

    cache = plan.get("recipe").get("cache") or {}
    psnr_min, ssim_min = cache.get("psnr_db_min"), cache.get("ssim_min")
    if psnr_min is None or ssim_min is None:
        raise UsageError("calibrate.target=step_cache judges configs by the cache budget, which this recipe does not set: "
                         "pass recipe.cache={psnr_db_min:28,ssim_min:0.93}")
    device = _prepare_device(c.device, "calibrate.device")
    if device == "cpu" and int(cfg.model.diffusers_config.hidden_size) > 1024:
        raise UsageError(calibrate_too_wide("step_cache"))
    steps = int(plan.get("pipeline")["num_inference_steps"])
    video = plan.get("video")
    pipe, weights = _pipe(cfg, device)
    prompts = [int(s) for s in c.seeds]

    def frames(p):
        install(pipe, p)
        try:
            out, made = [], []
            for s in prompts:
                out.append(pipe(**prompt_inputs(pipe, int(c.text_tokens), seed=s), height=int(video["height"]),
                                width=int(video["width"]), num_frames=int(video["frames"]), num_inference_steps=steps,
                                output_type="pt", output="videos", generator=torch.Generator("cpu").manual_seed(s)))
                made.append(calls(pipe.transformer)[-1]["computed"] if calls(pipe.transformer) else None)
            return out, made
        finally:
            uninstall(pipe)

    _, off = _variant(cfg, "off", {})
    refs, _ = frames(off)
    d = plan.decision("step_cache")
    n, w, f = (d.param("forwards"), d.param("warmup"), d.param("final")) if d.enabled else (None, None, None)
    if n is None:
        _, probe = _variant(cfg, "fixed", {})
        pd = probe.decision("step_cache")
        n, w, f = pd.param("forwards"), pd.param("warmup"), pd.param("final")
    say(f"calibrate step_cache: {weights}; {len(prompts)} prompts (seeds {prompts}), {n} forwards per call; budget PSNR >= "
        f"{psnr_min:g} dB, SSIM >= {ssim_min:g} against the uncached frames")
    results = []
    for setting, values in candidates(n, w, f):
        vcfg, vplan = _variant(cfg, setting, values)
        outs, made = frames(vplan)
        q = [compare(o.float(), r.float()) for o, r in zip(outs, refs)]
        worst_psnr = min(float("inf") if x["psnr_db"] is None else x["psnr_db"] for x in q)
        worst_ssim = min(x["ssim"] for x in q)
        computed = sum(made) / len(made)
        ok = worst_psnr >= psnr_min and worst_ssim >= ssim_min
        results.append((ok, computed, ORDER.index(setting), setting, values, worst_psnr, worst_ssim, vplan))
        say(f"  {setting} {values}: computed {computed:g} of {n}, worst PSNR {worst_psnr:.2f} dB, SSIM {worst_ssim:.4f}: "
            f"{'inside' if ok else 'outside'} the budget")
    inside = sorted((r for r in results if r[0]), key=lambda r: (r[1], r[2]))
    if not inside:
        raise UsageError(f"calibrate step_cache: no candidate stays inside PSNR >= {psnr_min:g} dB, SSIM >= {ssim_min:g} "
                         f"on these prompts ({len(results)} tried); nothing written: keep levers.step_cache=off")
    _, computed, _, setting, values, p, s, best = inside[0]
    out = str(c.plan_out)
    best.save(out)
    say(f"calibrate step_cache: {setting} {values} computes {computed:g} of {n} forwards at worst PSNR {p:.2f} dB, SSIM "
        f"{s:.4f}: plan written to {out} (install it with h3plan.install(pipe, '{out}'))")
    return 0
