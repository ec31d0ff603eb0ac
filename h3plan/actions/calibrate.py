"""`python -m h3plan action=calibrate ...`: make the static FP8 scale table that recipes read
(recipe.fp8_static_table; format in h3plan/facts/scale_table.py).

Builds the model (`calibrate.checkpoint` through diffusers' from_pretrained, else seeded random weights as
action=verify does: model=h3_tiny on the CPU with the Triton interpreter, real width on a GPU), runs the
calibration inputs with observers at every FP8 site, then the held-out check (h3plan/actions/calibration.py) on a
disjoint set. Inputs: `calibrate.inputs` (captured forward kwargs: a .pt file or a directory) or seeded
synthetic requests, `seeds` x `steps` of diffusers' MiniMaxH3Scheduler schedules (at the `pipeline` group's
video and audio shifts), held out: `heldout_seeds` x the steps between.

The FP8 sites of the check are the plan's (attention=cudnn_fp8, gemm_quant=fp8); a plan with neither checks
both. The table passes when the static scales' worst PSNR against the BF16 eager forward is at least
recipe.budget.psnr_db_min and, on the blocks' own update, they lose at most calibrate.max_loss_db to dynamic
scales (h3plan.actions.calibration.heldout_check); it is then written to `calibrate.out` and the last line names it with
the command whose plan reads it (table_overrides, planned before it is printed). Otherwise it
goes to <stem>.rejected.json (its provenance marks it rejected, so it never loads) and the command exits 2
with one line. Returns 0 on success.
"""

from __future__ import annotations

import dataclasses
import os

from h3plan.errors import H3PlanError, UsageError
from h3plan.facts.pipeline import schedule_facts
from h3plan.facts.attention import backend_spec
from h3plan.levers import SPECS, TERM_OWNERS, owner, terms
from h3plan.planner import resolve
from h3plan.planning.action_configs import CalibrateConfig
from h3plan.planning.config import compose
from h3plan.planning.request import MIN_STEPS, STEPS_RULE
from h3plan.facts.scale_table import ScaleTableError, config_hash, write

from .calibrate_sparse_attention import run as run_sparse_attention
from .calibrate_step_cache import run as run_step_cache
from .gpu_only import CALIBRATE_SMOKE as CPU_SMOKE, calibrate_too_wide
from .verify import CPU_MAX_ROWS, _cfg_get, _prepare_device

# the calibrate targets besides fp8_scales: the levers judged by their own budget -> their recipe section
SECTIONS = {name: s.recipe_section for name, s in SPECS.items() if s.recipe_section}
# the levers whose decisions say where the plan runs FP8, by the role their Terms (or options) give them
BACKEND, GEMMS = TERM_OWNERS["attention_backend"], TERM_OWNERS["gemm_dtype"]  # the blocks' attention, their GEMMs
SCALES = owner("scale_table")  # the lever whose static setting reads the table for the attention


def _own_budget(section: str):
    """The calibration that measures a lever judged by its own budget, by its recipe section."""
    return {"cache": run_step_cache, "sparse": run_sparse_attention}[section]


def settings(cfg) -> CalibrateConfig:
    """cfg.calibrate (DictConfig, dict or absent) over the dataclass defaults; an unknown key is one line."""
    raw = _cfg_get(cfg, "calibrate", {})
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(raw):
            raw = OmegaConf.to_container(raw, resolve=True)
    except ImportError:
        pass
    raw = dict(raw or {})
    names = [f.name for f in dataclasses.fields(CalibrateConfig)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise UsageError(f"calibrate.{unknown[0]}: unknown key; allowed: {', '.join(names)}")
    return CalibrateConfig(**raw)


def fp8_sites(plan) -> tuple[bool, bool, str]:
    """(FP8 attention, FP8 linears, why) from what the plan's decisions change (their Terms): an attention backend
    that takes FP8 inputs, FP8 block GEMMs."""
    t = terms({d.lever: d for d in plan.decisions})
    att = t.attention_backend is not None and backend_spec(t.attention_backend).fp8_inputs
    lin = t.gemm_dtype == "fp8"
    s = {d.lever: d.setting for d in plan.decisions}
    named = f"{BACKEND}={s.get(BACKEND)}, {GEMMS}={s.get(GEMMS)}"
    if att or lin:
        return att, lin, f"the plan's FP8 sites: {named}"
    return True, True, f"the plan runs no FP8 site ({named}): checking FP8 attention and FP8 linears both"


def default_steps(n_eval: int, count: int) -> list[int]:
    if count < 1:
        raise UsageError(f"calibrate.count={count}: must be >= 1")
    if count == 1 or n_eval == 1:
        return [n_eval // 2]
    return sorted({round(i * (n_eval - 1) / (count - 1)) for i in range(count)})


def between(steps: list[int], n_eval: int) -> list[int]:
    """Held-out steps: the midpoints between calibration steps that are not calibration steps themselves."""
    mids = sorted({(a + b) // 2 for a, b in zip(steps, steps[1:])} - set(steps))
    return mids or [s for s in (n_eval // 3, (2 * n_eval) // 3, n_eval - 1, 0) if s not in steps][:1] or steps[:1]


def _check_steps(name: str, steps, n_eval: int) -> list[int]:
    steps = [int(s) for s in steps]
    bad = [s for s in steps if not 0 <= s < n_eval]
    if bad or not steps:
        raise UsageError(f"calibrate.{name}={steps}: steps index the {n_eval} model evaluations of the schedule "
                         f"(0..{n_eval - 1})")
    return steps


def _model(cfg, c: CalibrateConfig, device, dtype):
    from .inputs import build_model

    dcfg = cfg.model.diffusers_config
    if c.checkpoint is None:
        return build_model(dcfg, blocks=c.blocks, device=device, dtype=dtype, seed=int(c.weights_seed)), \
            f"seeded random weights (seed {c.weights_seed}, h3plan.actions.inputs.build_model)"
    from diffusers import MiniMaxH3Transformer3DModel

    try:
        model = MiniMaxH3Transformer3DModel.from_pretrained(c.checkpoint, subfolder=c.subfolder, torch_dtype=dtype)
    except (OSError, ValueError) as e:
        raise UsageError(f"calibrate.checkpoint={c.checkpoint}: cannot load a MiniMaxH3Transformer3DModel "
                         f"({str(e).splitlines()[0][:200]})") from None
    if config_hash(model.config) != config_hash(dcfg):
        raise UsageError(f"calibrate.checkpoint={c.checkpoint} is not model={cfg.model.name} (its config differs): "
                         "pass the model config that matches the checkpoint")
    if c.blocks is not None:
        del model.transformer_blocks[int(c.blocks):]
    return (model.to(device).eval().requires_grad_(False),
            f"checkpoint {c.checkpoint}" + (f" ({c.subfolder})" if c.subfolder else ""))


def _inputs(cfg, c: CalibrateConfig, device, seq_len):
    """(calibration inputs, held-out inputs, provenance of each, request)."""
    from h3plan.actions.calibration import load_inputs, schedule, seeded_inputs

    from .inputs import layout

    if c.inputs is not None:
        calib = load_inputs(c.inputs, device=device)
        if c.heldout_inputs is not None:
            held = load_inputs(c.heldout_inputs, device=device)
        else:
            if len(calib) < 2:
                raise UsageError(f"calibrate.inputs={c.inputs}: one input leaves nothing to hold out; capture more or "
                                 "set calibrate.heldout_inputs")
            k = max(1, len(calib) // 4)
            calib, held = calib[:-k], calib[-k:]
        shared = {i.meta["sha256"] for i in calib} & {i.meta["sha256"] for i in held}
        if shared and c.heldout_inputs is not None:
            raise UsageError(f"calibrate.heldout_inputs shares files with calibrate.inputs (sha256 "
                             f"{sorted(shared)[0]}): the held-out set must be disjoint")

        def files(xs):
            return {"kind": "files", "count": len(xs), "files": sorted({(i.meta["file"],
                                                                         i.meta["sha256"]) for i in xs})}

        request = {"seq_lens": sorted({i.meta["seq_len"] for i in calib + held})}
        return calib, held, files(calib), files(held), request
    overlap = sorted(set(map(int, c.seeds)) & set(map(int, c.heldout_seeds)))
    if overlap:
        raise UsageError(f"calibrate.heldout_seeds shares seed {overlap[0]} with calibrate.seeds: the held-out set "
                         f"must be disjoint")
    if not c.seeds or not c.heldout_seeds:
        raise UsageError("calibrate.seeds and calibrate.heldout_seeds must each name at least one seed")
    shifts = schedule_facts(cfg.get("pipeline"))
    pairs = schedule(int(c.num_inference_steps), shifts["video_shift"], shifts["audio_shift"])
    n = len(pairs)
    steps = _check_steps("steps", c.steps, n) if c.steps is not None else default_steps(n, int(c.count))
    held_steps = _check_steps("heldout_steps", c.heldout_steps, n) if c.heldout_steps is not None else between(steps, n)
    dcfg = cfg.model.diffusers_config
    calib = seeded_inputs(dcfg, seq_len, c.seeds, steps, pairs, device=device)
    held = seeded_inputs(dcfg, seq_len, c.heldout_seeds, held_steps, pairs, device=device, role="held-out")

    def seeded(seeds, st):
        return {"kind": "seeded", "count": len(seeds) * len(st), "seeds": list(map(int, seeds)), "steps": st,
                "timesteps": [list(pairs[s]) for s in st], "num_inference_steps": int(c.num_inference_steps),
                "shifts": {"video": shifts["video_shift"], "audio": shifts["audio_shift"]}}

    n_text, n_audio, n_video = layout(seq_len)
    request = {"seq_len": seq_len, "batch": 1, "rows": {"text": n_text, "audio": n_audio, "video": n_video}}
    return calib, held, seeded(c.seeds, steps), seeded(c.heldout_seeds, held_steps), request


def table_overrides(plan, out: str) -> list[str]:
    """The overrides that plan what `plan` planned with the table `out` read: its presets, an explicit
    parallel.seq_len, its forced levers, then static scales from the table (recipe.fp8_scale_mode=static: auto keeps
    dynamic scales outside the long U8 row even with a table)."""
    over = [f"{k}={plan.get(k)['name']}" for k in ("hardware", "recipe", "parallel", "model")]
    seq = plan.derived_value("sequence") or {}
    if seq.get("source") == "parallel.seq_len":
        over.append(f"parallel.seq_len={seq['seq_len']}")
    over += [f"levers.{d.lever}={d.setting}" for d in plan.decisions if d.forced]
    return over + ["recipe.fp8_scale_mode=static", f"recipe.fp8_static_table={out}"]


def uses_table(plan) -> bool:
    """The plan reads a static scale table: FP8 attention with static scales, or FP8 linears with static inputs."""
    d = {x.lever: x for x in plan.decisions}
    att = d[SCALES].setting == "static"
    lin = terms(d).gemm_dtype == "fp8" and d[GEMMS].param("input_scales") == "static"
    return att or lin


def _closing_line(plan, out: str, summary: str) -> str:
    """The last line: the table and a command whose plan uses it (planned here first, so the hint is proven)."""
    import shlex

    over = table_overrides(plan, out)
    head = f"calibrate: table {out}; held-out check PASS: {summary}"
    try:
        ok = uses_table(resolve(compose(over)))
    except H3PlanError as e:
        return f"{head}; planning with it fails: {e}"
    if not ok:
        return (f"{head}; no FP8 site of this plan reads a static table "
                f"({BACKEND} {plan.decision(BACKEND).setting}, {GEMMS} {plan.decision(GEMMS).setting})")
    return f"{head}; plan with it: python -m h3plan {shlex.join(over)}"


def rejected_path(out: str) -> str:
    stem, ext = os.path.splitext(out)
    return f"{stem}.rejected{ext or '.json'}"


def run(cfg, plan) -> int:
    """CLI entry: cfg is the composed config (cfg.model, cfg.calibrate, cfg.parallel), plan the resolved Plan."""
    c = settings(cfg)
    if c.target in SECTIONS:
        return _own_budget(SECTIONS[c.target])(cfg, plan, c)
    if c.target != SCALES:
        raise UsageError(f"calibrate.target={c.target}: allowed: {', '.join([SCALES, *sorted(SECTIONS)])}")
    if c.statistic not in ("amax", "percentile"):
        raise UsageError(f"calibrate.statistic={c.statistic}: allowed: amax, percentile")
    if c.percentile is not None and not 0 < float(c.percentile) <= 100:
        raise UsageError(f"calibrate.percentile={c.percentile}: must be in (0, 100], or null to skip it")
    if isinstance(c.num_inference_steps, bool) or not isinstance(c.num_inference_steps,
                                                                 int) or c.num_inference_steps < MIN_STEPS:
        raise UsageError(f"calibrate.num_inference_steps={c.num_inference_steps}: {STEPS_RULE}")
    recipe = plan.get("recipe") or {}
    budget = (recipe.get("budget") or {}).get("psnr_db_min")
    if budget is None:
        raise UsageError(f"action=calibrate judges the table by recipe.budget.psnr_db_min, which recipe "
                         f"{recipe.get('name')} does not set: use recipe=fp8 or recipe=nvfp4")
    margin = float(c.margin if c.margin is not None else recipe.get("fp8_static_margin", 1.0))
    if not margin > 0:
        raise UsageError(f"calibrate.margin={margin}: must be > 0")
    device = _prepare_device(c.device, "calibrate.device")
    import torch

    from h3plan.actions.calibration import calibrate, say

    from .inputs import resolve_dtype

    dcfg = cfg.model.diffusers_config
    if device == "cpu" and int(dcfg["hidden_size"]) > 1024:
        raise UsageError(calibrate_too_wide())
    dtype = resolve_dtype(c.dtype)
    default_len = 48 if device == "cpu" else int(_cfg_get(_cfg_get(cfg, "parallel", {}), "seq_len", 19000))
    seq_len = int(c.seq_len if c.seq_len is not None else default_len)
    if device == "cpu" and seq_len > CPU_MAX_ROWS:
        raise UsageError(f"calibrate.seq_len={seq_len}: at most {CPU_MAX_ROWS} rows on the CPU (the Triton "
                         f"interpreter; longer runs need a GPU): {CPU_SMOKE}")
    model, weights = _model(cfg, c, device, dtype)
    calib, held, calib_prov, held_prov, request = _inputs(cfg, c, device, seq_len)
    att, lin, why = fp8_sites(plan)
    where = "Triton interpreter" if device == "cpu" else torch.cuda.get_device_name(device)
    say(f"calibrate: {cfg.model.name}, {len(model.transformer_blocks)} blocks, hidden {model.config.hidden_size}; "
        f"{len(calib)} calibration + {len(held)} held-out inputs; {device} ({where}); {dtype}; margin {margin:g}; "
        f"budget psnr >= {budget:g} dB; {why}")
    provenance = {"model": str(cfg.model.name), "config_hash": config_hash(model.config),
                  "num_layers": len(model.transformer_blocks), "weights": weights, "request": request,
                  "inputs": calib_prov, "heldout": held_prov, "device": device,
                  "dtype": str(dtype).replace("torch.", "")}
    table = calibrate(model, calib, held, margin=margin, budget_psnr_db=float(budget), max_loss_db=c.max_loss_db,
                      fp8_attention=att, fp8_linears=lin,
                      statistic=c.statistic, percentile=c.percentile, provenance=provenance)
    check = table["provenance"]["heldout"]["check"]
    out = str(c.out)
    if not check["passed"]:
        bad = rejected_path(out)
        write(bad, table)
        raise ScaleTableError(f"scale table {out}: refused by the held-out check ({check['summary']}); not written, "
                              f"the rejected table is {bad}")
    write(out, table)
    say(_closing_line(plan, out, check["summary"]))
    return 0
