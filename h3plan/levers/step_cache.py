"""Fewer forwards: step caching inside the quality budget the recipe states (`recipe.cache`), not the kernel levers'.

Settings, each over the transformer's calls of one generation (N forwards: MiniMaxH3Scheduler at the request's
num_inference_steps, `video.num_inference_steps` or else the pipeline's default (facts/timesteps.request_steps), the
terminal sigma dropped, so 50 steps are 49 forwards):
- off: every forward computed (lossless).
- fixed: computes C of the N forwards, the first `warmup` and last `final` always, the rest spread evenly over the
  middle, at most `max_skip` skipped in a row; a skipped forward returns the last computed velocity (video and audio).
- taylor: the fixed schedule; a skipped forward extrapolates the velocity to first order from the last two computed
  ones, in step index (TaylorSeer's finite differences), where two exist (else it reuses as fixed does).
- first_block: adaptive, Cache-DiT's DBCache with Fn 1, Bn 0. Every forward runs the first block; its residual (its
  output less its input) is compared with the last computed forward's, sum |r - r_prev| / sum |r_prev| (the two sums
  reduced over the Ulysses group, so every rank takes the same decision); below `threshold` the other blocks are
  skipped and the cached residual of the other blocks (last block out - first block out) is added to the first
  block's output. Never in the first `warmup` or last `final` forwards, at most `max_skip` in a row. threshold 0:
  never skips.
Runtime: h3plan/runtime/levers/step_cache.py (a named diffusers hook, installed by SPEC.model_step). Exact where it
must be: a schedule computing every forward, or threshold 0, is bitwise the plan without the cache.

Quality is evidence (h3plan/facts/evidence.py): POINTS below are the published measurements of these settings on
H3's released weights, each at its knobs and workflow; `recipe.cache.evidence=FILE` adds points measured on the
user's checkpoint (`action=calibrate calibrate.target=step_cache` writes the file), which take precedence. A plan
whose knobs, workflow and step count equal a point's is judged by it against recipe.cache's budget:
- auto with a budget: the fastest setting whose evidence meets it, at the evidence's knobs (the knobs the user set
  in recipe.cache narrow the choice); none: a one-line refusal naming the best evidenced setting and its quality.
  off where warm-up + final cover every forward (nothing can skip) and without a budget.
- a forced setting (levers.step_cache=...) whose evidence misses the budget: refused, citing it; one without
  evidence is `unmeasured` and runs only with recipe.cache.unmeasured=true (the plan says so), else is refused naming
  the best evidenced setting; auto never picks one, unmeasured=true or not (the rule every lossy lever shares:
  h3plan/facts/evidence.py).
- `recipe.cache.policy=high`: SGLang's audited Cache-DiT policy for H3 (quality="high": first_block, warm-up 4,
  threshold 0.04, at most 1 in a row), one override; without a budget its own evidence is what the plan states.
Without a budget or a policy every setting but off is refused: lossless recipes keep every forward, and fp8/nvfp4's
34 dB / 0.97 covers the kernel levers, not skipped forwards. Torch-free.
"""

from __future__ import annotations

from typing import Any, Mapping

from h3plan.errors import ConfigError
from h3plan.facts import evidence as ev
from h3plan.facts.pipeline import pipeline_defaults, schedule_facts
from h3plan.facts.decision import Decision
from h3plan.facts.timesteps import request_steps
from h3plan.facts.workflows import DEFAULT_TASK

from .adaln_table import schedule
from .base import Context, LeverError, Option, Spec, Terms, resolve, VERIFY_GENERATION

MODES = ("fixed", "taylor", "first_block")
KNOBS = {"fixed": ("computed", "warmup", "final", "max_skip"), "taylor": ("computed", "warmup", "final", "max_skip"),
         "first_block": ("threshold", "warmup", "final", "max_skip")}
"""The recipe.cache values each setting runs with (beside the request's forwards)."""
USER_KNOBS = ("computed", "warmup", "final", "threshold", "max_skip")
TELEFUSER = (34, 49)  # computed of forwards (docs/sources.md#telefuser-velocity-cache)
HIGH = {"warmup": 4, "final": 0, "threshold": 0.04, "max_skip": 1}
POLICIES = {"high": ("first_block", HIGH)}
"""Named policies (recipe.cache.policy): name -> (setting, knobs). high: SGLang's quality="high" for H3
(MINIMAX_H3_HIGH_QUALITY_CACHE_DIT_CONFIG = (warm-up 4, threshold 0.04, 1 in a row), Fn 1, Bn 0; Cache-DiT has no
final forwards, so final 0)."""
DEFAULTS = {"fixed": {"warmup": 4, "final": 1, "max_skip": None}, "taylor": {"warmup": 4, "final": 1, "max_skip": None},
            "first_block": dict(HIGH)}
"""Knobs a forced setting takes where recipe.cache leaves them null; first_block's are the high policy's. The one
home of these defaults: recipe.cache (planning/schema.py CacheBudget) leaves a knob null, `knob` reads it."""
F = 49  # forwards of the 50-step request every published point ran


def _first_block(workflows, knobs, **kw) -> ev.QualityPoint:
    return ev.QualityPoint.make("step_cache", "first_block", {**knobs, "forwards": F}, workflows, **kw)


SWEEP = "1xB200, T2VA 768p 16:9, 8.7 s, 50 steps, one run each"
POINTS = (
    _first_block(("t2va",), HIGH, ssim=0.931, psnr_db=28.16, speedup=1.40, source="docs/sources.md#sglang-cache-dit",
                 where="SGLang's quality=high, 4xH200, T2VA 1344x768x124, 50 steps, 3 prompts, video only"),
    *(_first_block(("t2va",), {**HIGH, "threshold": t, "max_skip": 3}, ssim=s, psnr_db=p, audio_snr_db=a, speedup=x,
                   source="docs/sources.md#sglang-dbcache-sweep", where=f"{SWEEP}, {hits} of 49 cached")
      for t, s, p, a, x, hits in ((0.04, 0.901, 28.77, 20.67, 1.53, 18), (0.08, 0.865, 26.56, 16.67, 2.23, 29),
                                  (0.12, 0.849, 25.29, 14.82, 2.56, 32), (0.24, 0.850, 25.35, 13.72, 2.84, 34))),
)
"""Published quality of these settings on H3's released weights against the same seed's uncached output (SSIM over
all channels). The Fn 1 / Bn 0 first-block DBCache is `first_block` at the same statistic; each point holds at its
warm-up, threshold, limit in a row and 49 forwards only, on T2VA (no FL2VA / Ref2VA point names its knobs)."""
SPEED_ONLY = {"fixed": "TeleFuser's conservative velocity cache computes 34 of 49 DiT calls, 1.42x on four GPUs, and "
                       "publishes no quality (docs/sources.md#telefuser-velocity-cache)"}
SPEED_ONLY["taylor"] = SPEED_ONLY["fixed"] + "; no source measured the extrapolation on H3"
EVIDENCE_REASONS = ("evidence (", "unmeasured:", "the schedule is too short")
"""How the reason that states a plan's quality evidence starts (the summary's `fewer` line prints it)."""
CALIBRATE = "action=calibrate calibrate.target=step_cache model.path=DIR measures it on your checkpoint"


def _valid(v) -> bool:
    if v is None:
        return True
    keys = {"mode", "steps", "forwards", "computed", "warmup", "final", "threshold", "max_skip"}
    return isinstance(v, dict) and set(v) == keys and v["mode"] in MODES


SPEC = Spec(
    name="step_cache",
    settings={"off": True, "fixed": False, "taylor": False, "first_block": False},
    summary="fewer forwards: a fixed schedule reusing (fixed) or extrapolating (taylor) the velocity, or an adaptive "
            "first-block cache, inside recipe.cache's budget and its evidence (lossy)",
    counter="step_cache",
    options=(Option("transformer", "step_cache", _valid, "None or dict(mode, steps, forwards, computed, warmup, final, "
                    "threshold, max_skip)", None),),
    terms={s: Terms(fewer_forwards=True) for s in ("fixed", "taylor", "first_block")},
    verify=VERIFY_GENERATION,
    recipe_section="cache",
    model_step=lambda model, decision, site: _model_step(model, decision, site),  # below
    config_problem=lambda cache: config_problem(cache),  # below
    budget_line=lambda d: budget_line(d),  # below
)


def knob(cache: Mapping[str, Any], key: str, setting: str = "fixed"):
    """recipe.cache's `key`, or setting's default (DEFAULTS) where recipe.cache leaves it null."""
    v = cache.get(key)
    return DEFAULTS[setting].get(key) if v is None else v


def budget_line(d: Decision) -> tuple[str, str]:
    """The summary's line for a lossy schedule: what it computes, and its quality evidence."""
    what = next((r for r in d.reasons if not r.startswith("forced by")), d.reasons[0])
    quality = next((r for r in d.reasons if r.startswith(EVIDENCE_REASONS)), "")
    return "fewer", f"{SPEC.name}={d.setting}: {what}; {quality}"


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def config_problem(cache: Mapping[str, Any]) -> tuple[str, str] | None:
    """(key, why) for a recipe.cache value the schema's types let through, else None (values against the request:
    `request_problem`)."""
    if (cache["psnr_db_min"] is None) != (cache["ssim_min"] is None):
        return "recipe.cache", "a cache budget needs both psnr_db_min and ssim_min (or neither: no step cache)"
    if cache.get("audio_snr_db_min") is not None and cache["psnr_db_min"] is None:
        return "recipe.cache.audio_snr_db_min", "bounds the audio beside psnr_db_min and ssim_min: set those too"
    if cache["computed"] is not None and (not _is_int(cache["computed"]) or cache["computed"] < 1):
        return f"recipe.cache.computed={cache['computed']}", "must be an integer >= 1 (forwards computed) or null"
    for k in ("warmup", "final"):
        if cache[k] is not None and (not _is_int(cache[k]) or cache[k] < 0):
            return f"recipe.cache.{k}={cache[k]}", "must be an integer >= 0 (forwards that never skip) or null"
    if cache["max_skip"] is not None and (not _is_int(cache["max_skip"]) or cache["max_skip"] < 1):
        return (f"recipe.cache.max_skip={cache['max_skip']}",
                "must be an integer >= 1 (forwards skipped in a row) or null")
    if cache["threshold"] is not None and cache["threshold"] < 0:
        return f"recipe.cache.threshold={cache['threshold']}", "must be >= 0 (0: never skips) or null"
    policy = cache.get("policy")
    if policy is not None:
        if policy not in POLICIES:
            return f"recipe.cache.policy={policy}", f"allowed: {', '.join(POLICIES)} (or null)"
        named = [k for k in USER_KNOBS if cache[k] is not None]
        if named:
            return (f"recipe.cache.{named[0]}={cache[named[0]]}", f"recipe.cache.policy={policy} fixes its own knobs "
                    f"({_knob_text(POLICIES[policy][1])}): drop recipe.cache.{named[0]} or the policy")
    return None


# ---------------------------------------------------------------- schedules


def computed_mask(forwards: int, computed: int, warmup: int, final: int,
                  max_skip: int | None = None) -> tuple[bool, ...]:
    """Which of `forwards` calls compute (True) under a fixed schedule: the first `warmup` and last `final`, and the
    rest of `computed` spread evenly over the middle (the middle's first forward among them); with `max_skip`, more
    forwards compute where the spread would skip more than that many in a row. computed >= forwards, or warm-up and
    final covering every forward: all True."""
    def mask(c: int) -> tuple[bool, ...]:
        head, tail = min(warmup, forwards), min(final, max(forwards - warmup, 0))
        middle = forwards - head - tail
        k = min(max(c - head - tail, 0), middle)
        picked = {head + (j * middle) // k for j in range(k)} if k else set()
        return tuple(i < head or i >= forwards - tail or i in picked for i in range(forwards))

    out = mask(computed)
    while max_skip is not None and longest_skip(out) > max_skip and sum(out) < forwards:
        out = mask(sum(out) + 1)
    return out


def longest_skip(mask) -> int:
    """The most forwards skipped in a row."""
    run = best = 0
    for m in mask:
        run = 0 if m else run + 1
        best = max(best, run)
    return best


def fewest_mask(forwards: int, warmup: int, final: int, max_skip: int) -> list[bool]:
    """first_block's schedule that skips the most (True: computed): every forward it may skip skipped, earliest first
    (not in warm-up or final, after a computed one, at most `max_skip` in a row). Its k-th skipped forward comes no
    later than any other schedule's k-th, so where forwards cost less later (sparse attention after dense ones) it
    also skips the most time."""
    mask, run, seen = [], 0, False
    for i in range(forwards):
        if seen and warmup <= i < forwards - final and run < max_skip:
            run += 1
            mask.append(False)
        else:
            run, seen = 0, True
            mask.append(True)
    return mask


def fewest_computed(forwards: int, warmup: int, final: int, max_skip: int) -> int:
    """The fewest forwards first_block computes (fewest_mask)."""
    return sum(fewest_mask(forwards, warmup, final, max_skip))


def scaled(computed: int, planned: int, forwards: int) -> int:
    """The computed count for a call of `forwards` when the plan computes `computed` of `planned` (same fraction,
    rounded up)."""
    return computed if forwards == planned else min(forwards, -(-computed * forwards // planned))


def forwards_of(steps: int, video_shift: float) -> int:
    return len(schedule(int(steps), float(video_shift)))


# ---------------------------------------------------------------- the request and recipe.cache


def _request(ctx: Context) -> tuple[int, int]:
    """(num_inference_steps, forwards) of the request: its own steps, else the pipeline's default."""
    steps = request_steps(ctx.request, ctx.pipeline or pipeline_defaults())
    return steps, forwards_of(steps, schedule_facts(ctx.pipeline)["video_shift"])


def _workflow(ctx: Context) -> str:
    return str((ctx.request or {}).get("task", DEFAULT_TASK))


def _cache(ctx: Context) -> Mapping[str, Any]:
    return ctx.recipe.get("cache") or {}


def _budget(ctx: Context) -> ev.Budget:
    return ev.Budget.of(_cache(ctx))


def _policy(ctx: Context) -> str | None:
    return _cache(ctx).get("policy")


def _user_knobs(ctx: Context) -> dict[str, Any]:
    c = _cache(ctx)
    if _policy(ctx):
        return dict(POLICIES[_policy(ctx)][1])
    return {k: c[k] for k in USER_KNOBS if c.get(k) is not None}


def _knobs(ctx: Context, s: str) -> dict[str, Any]:
    """The knobs setting `s` runs with here: the policy's; else recipe.cache's over the setting's defaults, and under
    auto the knobs of the evidence auto picks."""
    c, (_, n) = _cache(ctx), _request(ctx)
    k = {**DEFAULTS[s], **{key: v for key, v in _user_knobs(ctx).items() if key in KNOBS[s]}}
    pick = _auto_point(ctx) if ctx.requested(SPEC.name) == "auto" and not _policy(ctx) else None
    if pick is not None and pick.setting == s:
        k.update({key: v for key, v in pick.knobs if key in KNOBS[s]})
    if s in ("fixed", "taylor"):
        want = k.get("computed", c.get("computed"))
        if want is None:
            want = min(n, max(-(-TELEFUSER[0] * n // TELEFUSER[1]), k["warmup"] + k["final"]))
        k["computed"] = sum(computed_mask(n, int(want), k["warmup"], k["final"], k["max_skip"]))
    return {**k, "forwards": n}


def _knob_text(k: Mapping[str, Any]) -> str:
    parts = [f"computed {k['computed']}" if "computed" in k else None,
             f"threshold {k['threshold']:g}" if "threshold" in k else None,
             f"warm-up {k.get('warmup')}", f"final {k.get('final')}",
             f"at most {k['max_skip']} in a row" if k.get("max_skip") is not None else None,
             f"{k['forwards']} forwards" if "forwards" in k else None]
    return ", ".join(p for p in parts if p)


def _too_short(ctx: Context, s: str = "fixed") -> str | None:
    k, (steps, n) = _knobs(ctx, s), _request(ctx)
    if n <= k["warmup"] + k["final"]:
        return (f"the schedule is too short to skip anything: {n} forwards (num_inference_steps={steps}), warm-up "
                f"{k['warmup']} + final {k['final']} never skip")
    return None


def request_problem(ctx: Context) -> ConfigError | None:
    """A recipe.cache value the request rules out (forced or auto alike): a ConfigError naming the key."""
    c, (steps, n) = _cache(ctx), _request(ctx)
    if c.get("computed") is None or not (_budget(ctx).ssim_min is not None or _policy(ctx)):
        return None
    w, f = knob(c, "warmup"), knob(c, "final")
    if c["computed"] > n:
        return ConfigError(f"recipe.cache.computed={c['computed']}", f"is longer than the request's {n} forwards "
                           f"(num_inference_steps={steps}): at most {n}", fix={"recipe.cache.computed": str(n)})
    if c["computed"] < min(n, w + f):
        return ConfigError(f"recipe.cache.computed={c['computed']}", f"is fewer than the forwards that never skip "
                           f"(warm-up {w} + final {f}): at least {min(n, w + f)}",
                           fix={"recipe.cache.computed": str(min(n, w + f))})
    m = c.get("max_skip")
    if m is not None:
        exact = computed_mask(n, c["computed"], w, f)
        if longest_skip(exact) > m:
            need = sum(computed_mask(n, c["computed"], w, f, m))
            return ConfigError(f"recipe.cache.computed={c['computed']}",
                               f"skips {longest_skip(exact)} forwards in a row of {n}, more than "
                               f"recipe.cache.max_skip={m}: compute at least {need}",
                               fix={"recipe.cache.computed": str(need)})
    return None


# ---------------------------------------------------------------- evidence


def points(ctx: Context) -> tuple[ev.QualityPoint, ...]:
    """The published points, and the calibrated ones of recipe.cache.evidence (EvidenceError: one line)."""
    return ev.with_calibrated(POINTS, _cache(ctx).get("evidence"), SPEC.name, "recipe.cache.evidence",
                              (ctx.model or {}).get("path"))


def _applicable(ctx: Context, s: str, knobs: Mapping[str, Any]) -> list[ev.QualityPoint]:
    return [p for p in points(ctx) if p.applies(SPEC.name, s, knobs, _workflow(ctx))]


def judge(ctx: Context, s: str) -> ev.Verdict:
    """How the evidence for `s` at its knobs here stands against recipe.cache's budget (a policy without a budget:
    judged against no bound, so any applicable point meets)."""
    return ev.verdict(_applicable(ctx, s, _knobs(ctx, s)), _budget(ctx))


def _evidence_text(ctx: Context, s: str, v: ev.Verdict) -> str:
    if v.status == "unmeasured":
        return (f"unmeasured: no published or calibrated quality for {s} at {_knob_text(_knobs(ctx, s))} on "
                f"{_workflow(ctx)}; it runs because recipe.cache.unmeasured=true, so no measurement backs the budget "
                f"({CALIBRATE})")
    assert v.point is not None
    which = "calibrated on your checkpoint" if v.point.kind == "calibrated" else "published on released weights"
    verdict = (f"meets recipe.cache ({_budget(ctx).text()})" if v.status == "meets" and not _budget(ctx).empty
               else f"misses recipe.cache: {'; '.join(v.misses)}" if v.status == "misses"
               else "the quality this policy promises (no recipe.cache bound set)")
    return f"evidence ({which}): {v.point.cite()}: {verdict}"


def _candidates(ctx: Context) -> list[ev.QualityPoint]:
    """Every evidenced setting of this request (workflow, forwards) whose evidence meets the budget, at the knobs
    recipe.cache sets (each point stands for its setting at its knobs)."""
    wf, (_, n), mine = _workflow(ctx), _request(ctx), _user_knobs(ctx)
    out = []
    for p in points(ctx):
        if p.lever != SPEC.name or wf not in p.workflows or p.knob("forwards") != n:
            continue
        if any(p.knob(k) != v for k, v in mine.items()) or (ctx.ring > 1 and p.setting == "first_block"):
            continue
        at = [q for q in points(ctx) if q.applies(SPEC.name, p.setting, dict(p.knobs), wf)]
        if ev.verdict(at, _budget(ctx)).status == "meets":
            out.append(p)
    return out


def _auto_point(ctx: Context) -> ev.QualityPoint | None:
    """The evidence auto plans by: the fastest point that meets the budget (the user's calibrated point first on a
    tie); None: none does."""
    found = _candidates(ctx) if _budget(ctx).ssim_min is not None else []
    return max(found, key=lambda p: (p.speedup or 1.0, p.kind == "calibrated")) if found else None


# ---------------------------------------------------------------- the decision


def _enabled(ctx: Context) -> bool:
    """A budget or a named policy: the recipe's own lossy choice."""
    return _budget(ctx).ssim_min is not None or _policy(ctx) is not None


def policy(ctx: Context, s: str) -> list[str]:
    """Any setting but off needs the recipe's cache budget or a named policy; with one it is the recipe's own lossy
    choice."""
    if s == "off" or _enabled(ctx):
        return []
    kind = "lossless" if ctx.lossless_only else f"budget {ctx.recipe['budget']['psnr_db_min']} dB (kernel levers only)"
    return [f"recipe {ctx.recipe['name']} ({kind}) sets no cache budget and step_cache={s} skips forwards (lossy): "
            "set recipe.cache={psnr_db_min:...,ssim_min:...} or recipe.cache.policy=high"]


def blockers(ctx: Context, s: str) -> list[str]:
    if s == "off":
        return []
    out = []
    if s == "first_block" and ctx.ring > 1:
        out.append(f"parallel.ring={ctx.ring}: the first block's statistic is reduced over the Ulysses group only")
    pol = _policy(ctx)
    if pol and POLICIES[pol][0] != s:
        out.append(f"recipe.cache.policy={pol} is a {POLICIES[pol][0]} policy")
    if out or not _enabled(ctx) or _too_short(ctx, s):
        return out
    v = judge(ctx, s)
    if v.status == "misses":
        assert v.point is not None
        out.append(f"its evidence misses recipe.cache ({'; '.join(v.misses)}): {v.point.cite()}")
    elif v.status == "unmeasured" and not _cache(ctx).get("unmeasured"):
        out.append(f"unmeasured: no published or calibrated quality for {s} at {_knob_text(_knobs(ctx, s))} on "
                   f"{_workflow(ctx)}; {_best_evidenced(ctx)}; {CALIBRATE} (recipe.cache.evidence=FILE), or run it "
                   "without evidence with recipe.cache.unmeasured=true")
    return out


def _best_evidenced(ctx: Context) -> str:
    """The evidenced setting a refusal of an unmeasured one names: the one auto plans here, else the best measured for
    this request, else where the evidence is."""
    pick, (_, n), wf = _auto_point(ctx), _request(ctx), _workflow(ctx)
    if pick is not None:
        return (f"the best evidenced setting inside the budget is {pick.setting} ({_knob_text(dict(pick.knobs))}) at "
                f"{pick.cite()}, which auto plans")
    top = ev.best(p for p in points(ctx) if wf in p.workflows and p.knob("forwards") == n)
    if top is not None:
        return (f"the best evidenced setting is {top.setting} ({_knob_text(dict(top.knobs))}) at {top.cite()}"
                + (f", which misses {'; '.join(top.misses(_budget(ctx)))}" if top.misses(_budget(ctx)) else ""))
    top = _best_anywhere(ctx)
    return (f"no step-cache setting has evidence for {wf} at {n} forwards; the best evidenced is {top.setting} "
            f"({_knob_text(dict(top.knobs))}) on {', '.join(top.workflows)}")


def _best_anywhere(ctx: Context) -> ev.QualityPoint:
    """The best evidenced point of any request (POINTS is never empty)."""
    top = ev.best(points(ctx))
    assert top is not None
    return top


def params(ctx: Context, s: str) -> dict:
    if s == "off":
        return {}
    (steps, n), k, b = _request(ctx), _knobs(ctx, s), _budget(ctx)
    p = {"steps": steps, "forwards": n, "warmup": int(k["warmup"]), "final": int(k["final"]),
         "max_skip": k["max_skip"], "psnr_db_min": b.psnr_db_min, "ssim_min": b.ssim_min,
         "audio_snr_db_min": b.audio_snr_db_min, "policy": _policy(ctx)}
    v = judge(ctx, s) if not _too_short(ctx, s) else None
    p["evidence"] = ("none needed: skips nothing" if v is None else v.status if v.point is None
                     else f"{v.point.kind}: {v.point.source}")
    if s == "first_block":
        return {**p, "threshold": float(k["threshold"]), "fewest_computed": fewest_computed(n, p["warmup"], p["final"],
                                                                                               int(k["max_skip"]))}
    mask = computed_mask(n, k["computed"], p["warmup"], p["final"], k["max_skip"])
    return {**p, "computed": sum(mask), "skipped": [i for i, m in enumerate(mask) if not m]}


def explain(ctx: Context, s: str) -> list[str]:
    if s == "off":
        return ["every forward computed: the transformer's own velocity at every step"]
    p, short = params(ctx, s), _too_short(ctx, s)
    limit = f", at most {p['max_skip']} in a row" if p["max_skip"] is not None else ""
    if s == "first_block":
        what = (f"first-block cache (Cache-DiT's DBCache, Fn 1, Bn 0): skips the other blocks while the first block's "
                f"residual moved by < {p['threshold']:g} (relative L1 against the last computed forward's, reduced "
                f"over the Ulysses group){limit}, never in the first {p['warmup']} or last {p['final']} of "
                f"{p['forwards']} forwards (num_inference_steps={p['steps']}): computes "
                f"{p['fewest_computed']}..{p['forwards']}")
    else:
        how = ("reuses the last computed velocity" if s == "fixed"
               else "extrapolates the velocity (first order, step index)")
        what = (f"computes {p['computed']} of {p['forwards']} forwards (num_inference_steps={p['steps']}; warm-up "
                f"{p['warmup']} and final {p['final']} never skip{limit}) and {how} for the other "
                f"{p['forwards'] - p['computed']}")
    b = _budget(ctx)
    pol = _policy(ctx)
    budget = (f"budget recipe.cache: {b.text()} against the uncached frames" if not b.empty
              else f"recipe.cache.policy={pol}: no budget set, its evidence is what it promises")
    out = [what, budget]
    if short:
        out.append(short)
    else:
        v = judge(ctx, s)
        out.append(_evidence_text(ctx, s, v))
    if s in SPEED_ONLY:
        out.append(SPEED_ONLY[s])
    return out


def auto(ctx: Context):
    if not _enabled(ctx):
        why = ("a lossless recipe keeps every forward" if ctx.lossless_only
               else "the kernel levers' budget does not cover skipped forwards")
        return "off", [f"no cache budget (recipe.cache.psnr_db_min / ssim_min) or policy: {why}"], {}
    pol = _policy(ctx)
    if pol:
        s = POLICIES[pol][0]
        if _too_short(ctx, s):
            return "off", [f"recipe.cache.policy={pol}: " + str(_too_short(ctx, s))], {}
        why = blockers(ctx, s)
        if why:
            raise LeverError(SPEC.name, s, [f"recipe.cache.policy={pol}"] + why)
        return s, explain(ctx, s), params(ctx, s)
    if all(_too_short(ctx, s) for s in MODES):
        return "off", [str(_too_short(ctx, "first_block"))], {}
    pick = _auto_point(ctx)
    if pick is None:
        raise LeverError(SPEC.name, "auto", [_no_evidence(ctx)])
    return pick.setting, explain(ctx, pick.setting), params(ctx, pick.setting)


def _no_evidence(ctx: Context) -> str:
    (steps, n), wf, b = _request(ctx), _workflow(ctx), _budget(ctx)
    here = [p for p in points(ctx) if wf in p.workflows and p.knob("forwards") == n]
    top = ev.best(here)
    if top is None:
        # auto never picks an unmeasured setting, unmeasured=true or not: the user names one to run without evidence
        name = f"levers.step_cache={_best_anywhere(ctx).setting}"
        run = (f"force one, {name}, which the recipe.cache.unmeasured=true you set lets run without evidence"
               if _cache(ctx).get("unmeasured") else f"run one without evidence with {name} and "
               "recipe.cache.unmeasured=true")
        return (f"recipe.cache ({b.text()}): no step-cache setting has published or calibrated quality for {wf} at {n} "
                f"forwards (num_inference_steps={steps}; the published points are T2VA at {F}), and auto picks only "
                f"evidenced settings: {CALIBRATE} (recipe.cache.evidence=FILE), {run}, or levers.step_cache=off "
                "(no cache)")
    return (f"recipe.cache ({b.text()}): no evidenced step-cache setting meets it for {wf} at {n} forwards; the best "
            f"evidenced is {top.setting} ({_knob_text(dict(top.knobs))}) at {top.cite()}, which misses "
            f"{'; '.join(top.misses(b))}: lower the budget, {CALIBRATE}, or levers.step_cache=off (no cache)")


def decide(ctx: Context):
    bad = request_problem(ctx)
    if bad is not None:
        raise bad
    return resolve(ctx, SPEC, auto=auto, blockers=blockers, params=params, explain=explain, policy=policy)


def values(decision) -> dict[str, Any]:
    """What the installed cache runs by: the decision's mode and schedule (its install option's value)."""
    p = decision.param
    return {"mode": decision.setting, "steps": p("steps"), "forwards": p("forwards"),
            "computed": p("computed", p("forwards")), "warmup": p("warmup"), "final": p("final"),
            "threshold": p("threshold", 0.0), "max_skip": p("max_skip") or p("forwards")}


def install(builder, decision) -> None:
    if decision.setting == "off":
        builder.skip(SPEC.name, decision.reasons[0])
        return
    builder.set(SPEC.name, "step_cache", values(decision))


def _model_step(model, decision, site) -> None:
    """The cache's hook on the transformer (h3plan/runtime/levers/step_cache.py, through the install's Site)."""
    site.runtime().install(model, values(decision), site)
