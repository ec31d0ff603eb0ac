"""`python -m h3plan action=calibrate calibrate.target=sparse_attention recipe.sparse={psnr_db_min:..,ssim_min:..}
model.path=DIR`: measure block-sparse attention on the user's checkpoint against the dense call, and write the
sparsest keep fraction inside recipe.sparse's budget into a plan file.

The same pipeline and prompts as calibrate.target=step_cache (h3plan/actions/calibrate_step_cache.py: diffusers' t2va
blocks, the transformer from `model.path`, seeded weights otherwise, which say nothing about a trained model's
attention: the output says so). For every prompt the plan with sparse_attention off gives the reference frames and
soundtrack; each candidate keep fraction (KEEPS, at recipe.sparse.dense_forwards) runs the same call and is judged by
its worst frames PSNR and SSIM over the prompts (quality.compare) and reports its worst audio SNR (the budget holds
frames only, as the published SubBlock point does). The winner (the smallest keep inside the budget: the least
attention work) goes to `calibrate.plan_out` with recipe.sparse.keep set; none inside: exit 2, nothing written.
"""

from __future__ import annotations

import math

from h3plan.errors import UsageError

from .calibrate_step_cache import _pipe
from .pipeline_build import prompt_inputs

KEEPS = (0.5, 0.35, 0.25, 0.15)


def _variant(cfg, setting: str, keep: float | None):
    from omegaconf import OmegaConf

    from h3plan.planner import resolve

    c = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    c.levers.sparse_attention = setting
    if keep is not None:
        c.recipe.sparse.keep = keep
    return c, resolve(c)


def snr_db(x, ref) -> float:
    """10 log10(|ref|^2 / |x - ref|^2); inf where they are equal."""
    err = float(((x.float() - ref.float()) ** 2).sum())
    return math.inf if err == 0 else 10 * math.log10(float((ref.float() ** 2).sum()) / err)


def run(cfg, plan, c) -> int:
    """CLI entry for calibrate.target=sparse_attention; `c` is the CalibrateConfig."""
    import torch

    from h3plan.actions.calibration import say
    from h3plan.install import install, uninstall

    from .quality import compare
    from .verify import _prepare_device

    sparse = plan.get("recipe").get("sparse") or {}
    psnr_min, ssim_min = sparse.get("psnr_db_min"), sparse.get("ssim_min")
    if psnr_min is None or ssim_min is None:
        raise UsageError("calibrate.target=sparse_attention judges keep fractions by the sparse budget, which this recipe "
                         "does not set: pass recipe.sparse={psnr_db_min:28,ssim_min:0.9}")
    device = _prepare_device(c.device, "calibrate.device")
    if device == "cpu" and int(cfg.model.diffusers_config.hidden_size) > 1024:
        raise UsageError("calibrate on the CPU needs a small model: pass model=h3_tiny vae=h3_tiny_pipe (real width needs a GPU)")
    steps = int(plan.get("pipeline")["num_inference_steps"])
    video = plan.get("video")
    pipe, weights = _pipe(cfg, device)
    prompts = [int(s) for s in c.seeds]

    def call(p):
        install(pipe, p)
        try:
            out = []
            for s in prompts:
                r = pipe(**prompt_inputs(pipe, int(c.text_tokens), seed=s), height=int(video["height"]),
                         width=int(video["width"]), num_frames=int(video["frames"]), num_inference_steps=steps,
                         output_type="pt", output=["videos", "audio"], generator=torch.Generator("cpu").manual_seed(s))
                out.append((r["videos"], r["audio"]))
            return out
        finally:
            uninstall(pipe)

    _, off = _variant(cfg, "off", None)
    refs = call(off)
    say(f"calibrate sparse_attention: {weights}; {len(prompts)} prompts (seeds {prompts}); budget PSNR >= {psnr_min:g} dB, "
        f"SSIM >= {ssim_min:g} against the dense frames; dense forwards {sparse.get('dense_forwards')}")
    results = []
    for keep in KEEPS:
        _, vplan = _variant(cfg, "block_sparse", keep)
        outs = call(vplan)
        q = [compare(o[0].float(), r[0].float()) for o, r in zip(outs, refs)]
        worst_psnr = min(math.inf if x["psnr_db"] is None else x["psnr_db"] for x in q)
        worst_ssim = min(x["ssim"] for x in q)
        worst_snr = min(snr_db(o[1], r[1]) for o, r in zip(outs, refs))
        ok = worst_psnr >= psnr_min and worst_ssim >= ssim_min
        results.append((ok, keep, worst_psnr, worst_ssim, worst_snr, vplan))
        say(f"  keep {keep:g}: worst PSNR {worst_psnr:.2f} dB, SSIM {worst_ssim:.4f}, audio SNR {worst_snr:.2f} dB: "
            f"{'inside' if ok else 'outside'} the budget")
    inside = sorted((r for r in results if r[0]), key=lambda r: r[1])
    if not inside:
        raise UsageError(f"calibrate sparse_attention: no keep fraction stays inside PSNR >= {psnr_min:g} dB, SSIM >= "
                         f"{ssim_min:g} on these prompts ({len(results)} tried); nothing written: keep "
                         "levers.sparse_attention=off")
    _, keep, p, s, snr, best = inside[0]
    out = str(c.plan_out)
    best.save(out)
    say(f"calibrate sparse_attention: keep {keep:g} at worst PSNR {p:.2f} dB, SSIM {s:.4f}, audio SNR {snr:.2f} dB: plan "
        f"written to {out} (install it with h3plan.install(pipe, '{out}'))")
    return 0
