"""`python -m h3plan action=calibrate calibrate.target=step_cache recipe.cache={psnr_db_min:..,ssim_min:..}
model.path=DIR [calibrate.prompts=prompts.txt]`: measure step-cache settings on the user's checkpoint, write every
measurement as calibrated quality points (the file recipe.cache.evidence reads) and the fastest setting inside the
budget as a plan that cites them.

Checked before any model loads (one line each): a cache budget; a t2va request; the prompts file where the checkpoint
has a text encoder (DIR/text_encoder/): it must exist, be UTF-8 text and hold at least one prompt (one a line,
blank lines skipped); a prompts file without a checkpoint text encoder is refused.

Prompts: with DIR/text_encoder/ (and DIR/tokenizer/; the processor from DIR/processor/ where present, else built at
the conditioner's vision geometry, which t2va reads only for its token type ids) every prompt goes through diffusers'
own `MiniMaxH3TextEncoderStep`, prompt k under seed calibrate.seeds[k mod len]; the conditioner is freed before the
pipeline is built. Without one: `calibrate.seeds` seeded prompt embeddings of calibrate.text_tokens rows (the output
says so). Pipeline: diffusers' t2va denoise + decode blocks (h3plan/actions/pipeline_build.py), the transformer from
`model.path` (null: seeded weights, which say nothing about a trained model's steps: the output says so), the VAE
from DIR/vae and the audio VAE from DIR/audio_vae where the folder has them (else seeded). Request: the plan's `video`
at its own num_inference_steps (facts/timesteps.request_steps).

For every prompt the uncached plan gives the reference video and soundtrack; each candidate (fixed and taylor at
computed forwards 90, 80, 70, 60, 50% of the request's, first_block at thresholds 0.04, 0.08, 0.12, 0.2; warm-up,
final and the limit in a row from recipe.cache, else each setting's defaults) runs the same calls and is judged by its
worst video PSNR / SSIM (quality.compare) and worst audio SNR (quality.snr_db) over the prompts against
recipe.cache's bounds. Speed is ranked by forwards computed (mean over the prompts; first_block also pays its first
block on every skipped forward, so it ranks after a fixed schedule computing as many), not by a clock; a point's
speedup is forwards / computed. Written: every candidate's point to `calibrate.evidence_out` (facts/evidence.py
format; kind calibrated, the checkpoint named); the winner's plan (this plan's config with levers.step_cache, its
recipe.cache knobs and recipe.cache.evidence set) to `calibrate.plan_out`. None inside the budget: exit 2 with one
line; the points are written all the same (they are measurements), no plan.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone

from h3plan.errors import UsageError
from h3plan.facts import evidence as ev
from h3plan.facts.timesteps import request_steps
from h3plan.facts.workflows import DEFAULT_TASK
from h3plan.levers import REGISTRY, TERM_OWNERS

from .gpu_only import calibrate_too_wide
from .pipeline_build import build_pipeline, pipeline_blocks, prompt_inputs
from .text_encoder_build import build_processor

lever = REGISTRY[TERM_OWNERS["fewer_forwards"]]  # the lever calibrated: its defaults, knobs and name
NAME = lever.SPEC.name

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


def read_prompts(path: str) -> list[str]:
    """The prompts of a text file, one a line (blank lines skipped); UsageError for a file that is missing, not
    UTF-8 text, or empty."""
    where = f"calibrate.prompts={path}"
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UsageError(f"{where}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{where}: not UTF-8 text (a prompts file holds one prompt a line)") from None
    if "\x00" in text:
        raise UsageError(f"{where}: not text (it holds NUL bytes; a prompts file holds one prompt a line)")
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise UsageError(f"{where}: holds no prompt (one prompt a line)")
    return prompts


def text_encoder_dir(path) -> str | None:
    """DIR/text_encoder where the checkpoint has one (its config.json), else None."""
    if not path:
        return None
    d = os.path.join(os.fspath(path), "text_encoder")
    return d if os.path.isfile(os.path.join(d, "config.json")) else None


def _check(cfg, plan, c) -> tuple[ev.Budget, list[str] | None]:
    """Everything that can be refused before a model loads (module docstring)."""
    cache = plan.get("recipe").get("cache") or {}
    budget = ev.Budget.of(cache)
    if budget.ssim_min is None:
        raise UsageError("calibrate.target=step_cache judges settings by the cache budget, which this recipe does not "
                         "set: pass recipe.cache={psnr_db_min:28,ssim_min:0.93}")
    return budget, check_request(cfg, plan, c, NAME)


def check_request(cfg, plan, c, target: str) -> list[str] | None:
    """The request and the prompts of a calibrate target that runs diffusers' t2va call, refused in one line before a
    model loads: a t2va request; calibrate.prompts exactly where the checkpoint has a text encoder, read as text.
    Returns the prompts (None: seeded prompt embeddings)."""
    task = (plan.derived_value("sequence") or {}).get("task", DEFAULT_TASK)
    if task != "t2va":
        raise UsageError(f"calibrate.target={target} runs t2va requests (diffusers' t2va denoise and decode); the "
                         f"plan's request is {task}")
    te = text_encoder_dir(cfg.model.get("path"))
    prompts = c.prompts
    if te and not prompts:
        raise UsageError(f"model.path={cfg.model.get('path')} has a text encoder: name the prompts it encodes, "
                         "calibrate.prompts=FILE (one prompt a line)")
    if prompts and not te:
        raise UsageError(f"calibrate.prompts={prompts} needs a checkpoint with a text encoder (model.path=DIR with "
                         "text_encoder/ and tokenizer/); without one the prompts are seeded embeddings "
                         "(calibrate.seeds)")
    return read_prompts(str(prompts)) if prompts else None


def calibration_runs(cfg, c, prompts: list[str] | None, device) -> tuple[list[tuple], str]:
    """(prompt inputs or None for seeded embeddings, generator seed) per call of a calibration, and how they were made:
    the prompts through the checkpoint's text encoder, else one seeded prompt embedding per calibrate.seeds."""
    seeds = [int(s) for s in c.seeds]
    if prompts is not None:
        te = text_encoder_dir(cfg.model.get("path"))
        assert te is not None  # check_request
        inputs = _encode(te, prompts, device)
        return ([(inp, seeds[k % len(seeds)]) for k, inp in enumerate(inputs)],
                f"{len(prompts)} prompts of calibrate.prompts={c.prompts} through the checkpoint's text encoder")
    said = f"{len(seeds)} seeded prompt embeddings (seeds {seeds}; no text encoder in the checkpoint)"
    return [(None, s) for s in seeds], said


def call_inputs(pipe, run: tuple, text_tokens: int) -> dict:
    """The prompt inputs of one calibration call (calibration_runs)."""
    inp, seed = run
    return inp if inp is not None else prompt_inputs(pipe, int(text_tokens), seed=seed)


def _variant(cfg, setting: str, values: dict, evidence: str | None = None):
    from omegaconf import OmegaConf

    from h3plan.planner import resolve

    c = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    setattr(c.levers, NAME, setting)
    for k, v in values.items():
        c.recipe.cache[k] = v
    c.recipe.cache.unmeasured = evidence is None  # a candidate runs to be measured; the winner cites its points
    c.recipe.cache.evidence = evidence
    return c, resolve(c)


def _encode(te_dir: str, prompts: list[str], device):
    """(prompt_embeds, text_token_tags) per prompt through diffusers' MiniMaxH3TextEncoderStep with the checkpoint's
    conditioner, tokenizer and processor; the conditioner is freed after."""
    import torch
    from diffusers.modular_pipelines.minimax_h3.encoders import MiniMaxH3TextEncoderStep
    from transformers import AutoProcessor, AutoTokenizer, Qwen3VLForConditionalGeneration

    root = os.path.dirname(te_dir)
    try:
        model = Qwen3VLForConditionalGeneration.from_pretrained(te_dir, dtype=torch.bfloat16).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(os.path.join(root, "tokenizer"))
        proc_dir = os.path.join(root, "processor")
        processor = (AutoProcessor.from_pretrained(proc_dir) if os.path.isdir(proc_dir)
                     else build_processor(tokenizer, model.config.to_dict()))
    except (OSError, ValueError) as e:
        raise UsageError(f"model.path={root}: cannot load its text encoder "
                         f"({str(e).strip().splitlines()[0][:200]})") from None
    step = MiniMaxH3TextEncoderStep().init_pipeline()
    step.update_components(text_encoder=model, tokenizer=tokenizer, processor=processor)
    out = []
    for p in prompts:
        state = step(prompt=p)
        out.append({"prompt_embeds": state.get("prompt_embeds"), "text_token_tags": state.get("text_token_tags")})
    del step, model
    return out


def _pipe(cfg, device):
    from .inputs import load_model

    path = cfg.model.get("path")
    pipe = build_pipeline(cfg.model.diffusers_config, cfg.vae.diffusers_config, vae_name=cfg.vae.name, device=device,
                          blocks=pipeline_blocks())
    weights = ("seeded weights (they carry no trained model's step-to-step statistics: the numbers say nothing "
               "about your videos)")
    if path:
        pipe.update_components(transformer=load_model(path, device=device))
        loaded = ["transformer"]
        for sub in ("vae", "audio_vae"):
            if os.path.isdir(os.path.join(path, sub)):
                from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio

                cls = AutoencoderKLMiniMaxH3 if sub == "vae" else AutoencoderKLMiniMaxH3Audio
                pipe.update_components(**{sub: cls.from_pretrained(path, subfolder=sub).to(device).eval()})
                loaded.append(sub)
        seeded = [s for s in ("vae", "audio_vae") if s not in loaded]
        weights = f"model.path={path} ({', '.join(loaded)}" + (f"; seeded: {', '.join(seeded)}" if seeded else "") + ")"
    return pipe, weights


def run(cfg, plan, c) -> int:
    """CLI entry for calibrate.target=step_cache; `c` is the CalibrateConfig."""
    budget, prompts = _check(cfg, plan, c)
    from .verify import _prepare_device

    device = _prepare_device(c.device, "calibrate.device")  # before the kernels import: TRITON_INTERPRET on a CPU
    if device == "cpu" and int(cfg.model.diffusers_config.hidden_size) > 1024:
        raise UsageError(calibrate_too_wide(NAME))
    import torch

    from h3plan.actions.calibration import say
    from h3plan.install import install, of_lever, uninstall

    calls = of_lever(NAME).calls  # the cache's generations (its runtime module)

    from .quality import compare, snr_db

    video, pipeline = plan.get("video"), plan.get("pipeline")
    steps = request_steps(plan.derived_value("sequence") or video, pipeline)
    runs, said = calibration_runs(cfg, c, prompts, device)
    pipe, weights = _pipe(cfg, device)

    def outputs(p):
        install(pipe, p)
        try:
            out, made = [], []
            for run in runs:
                res = pipe(**call_inputs(pipe, run, c.text_tokens), height=int(video["height"]),
                           width=int(video["width"]), num_frames=int(video["frames"]),
                           num_inference_steps=steps, output_type="pt", output=["videos", "audio"],
                           generator=torch.Generator("cpu").manual_seed(run[1]))
                out.append((res["videos"], res["audio"]))
                made.append(calls(pipe.transformer)[-1]["computed"] if calls(pipe.transformer) else None)
            return out, made
        finally:
            uninstall(pipe)

    _, off = _variant(cfg, "off", {})
    refs, _ = outputs(off)
    n = int((plan.derived_value("sequence") or {}).get("transformer_forwards") or steps - 1)
    cache = plan.get("recipe").get("cache") or {}
    w, f = lever.knob(cache, "warmup"), lever.knob(cache, "final")
    say(f"calibrate step_cache: {weights}; {said}, {n} forwards per call; budget {budget.text()} against the uncached "
        "output")
    results, points = [], []
    for setting, values in candidates(n, w, f):
        _, vplan = _variant(cfg, setting, values)
        outs, made = outputs(vplan)
        q = [compare(o[0].float(), r[0].float()) for o, r in zip(outs, refs)]
        snr = [snr_db(o[1].float(), r[1].float()) for o, r in zip(outs, refs)]
        point = ev.QualityPoint.make(
            NAME, setting, _knobs(vplan), ["t2va"],
            psnr_db=min(float("inf") if x["psnr_db"] is None else x["psnr_db"] for x in q),
            ssim=min(x["ssim"] for x in q), audio_snr_db=min(float("inf") if x is None else x for x in snr),
            speedup=round(n / (sum(made) / len(made)), 4), kind="calibrated",
            where=f"{len(runs)} prompts, worst of each; {sum(made) / len(made):g} of {n} forwards computed (mean); "
                  f"speedup in forwards, not timed")
        point = _finite(point)
        points.append(point)
        ok = point.meets(budget)
        results.append((ok, sum(made) / len(made), ORDER.index(setting), setting, values, point))
        say(f"  {setting} {values}: computed {sum(made) / len(made):g} of {n}, worst {point.quality()}: "
            f"{'inside' if ok else 'outside'} the budget")
    evidence = os.path.abspath(str(c.evidence_out or f"{NAME}_points.yaml"))
    ev.write_points(evidence, NAME, points, checkpoint=cfg.model.get("path"),
                    date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    say(f"calibrate step_cache: {len(points)} calibrated points written to {evidence} "
        f"(recipe.cache.evidence={evidence})")
    inside = sorted((r for r in results if r[0]), key=lambda r: (r[1], r[2]))
    if not inside:
        raise UsageError(f"calibrate step_cache: no candidate stays inside {budget.text()} on these prompts "
                         f"({len(results)} tried; points in {evidence}); no plan written: keep levers.step_cache=off")
    _, computed, _, setting, values, point = inside[0]
    _, best = _variant(cfg, setting, values, evidence=evidence)
    out = str(c.plan_out or f"{NAME}_plan.yaml")
    best.save(out)
    say(f"calibrate step_cache: {setting} {values} computes {computed:g} of {n} forwards at worst {point.quality()}: "
        f"plan written to {out} (install it with h3plan.install(pipe, '{out}'))")
    return 0


def _knobs(plan) -> dict:
    d = plan.decision(NAME)
    return {k: d.param(k) for k in (*lever.KNOBS[d.setting], "forwards")}


def _finite(p: ev.QualityPoint) -> ev.QualityPoint:
    """A point whose output equalled the reference on every prompt (PSNR or SNR infinite) records 99 dB: the files hold
    finite numbers."""
    from dataclasses import replace

    cap = 99.0
    return replace(p, psnr_db=min(p.psnr_db, cap) if p.psnr_db is not None else None,
                   audio_snr_db=min(p.audio_snr_db, cap) if p.audio_snr_db is not None else None)
