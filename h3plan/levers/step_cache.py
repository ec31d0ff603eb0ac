"""Fewer forwards: step caching inside the quality budget the recipe states (`recipe.cache`), not the kernel levers'.

Settings, each over the transformer's calls of one generation (N forwards: MiniMaxH3Scheduler at the request's
num_inference_steps, the terminal sigma dropped, so 50 steps are 49 forwards):
- off: every forward computed (lossless).
- fixed: computes C of the N forwards, the first `warmup` and last `final` always, the rest spread evenly over the
  middle; a skipped forward returns the last computed velocity (video and audio outputs).
- taylor: the fixed schedule; a skipped forward extrapolates the velocity to first order from the last two computed
  ones, in step index (TaylorSeer's finite differences), where two exist (else it reuses as fixed does).
- first_block: adaptive. Every forward runs the first block; when its output moved by less than `threshold`
  (relative L1 against the last computed forward's, the two sums reduced over the Ulysses group so every rank
  takes the same decision), the other blocks are skipped and the cached residual (last block out - first block
  out) is added; never in the warm-up or final forwards, at most `max_skip` in a row. threshold 0: never skips.
Runtime: h3plan/install/step_cache.py (a named diffusers hook). Exact where it must be: a schedule computing every
forward, or threshold 0, is bitwise the plan without the cache.

Policy: without a cache budget (recipe.cache psnr_db_min / ssim_min, both null by default) every setting but off is
refused and auto picks off, so lossless recipes keep every forward; the budget is the recipe's own lossy choice (as
recipe.vae=fp16 is). auto with a budget: fixed at recipe.cache.computed (null: TeleFuser's 34 of 49, scaled to the
request), or off where the request is too short to skip anything. Quality: no h3plan measurement exists (seeded
weights carry no trained model's step-to-step statistics); the reasons cite what peers measured on released
weights and `action=calibrate calibrate.target=step_cache` measures it on the user's checkpoint. Torch-free.
"""

from __future__ import annotations

from typing import Any, Mapping

from .adaln_table import schedule
from .base import Context, Option, Spec, resolve

MODES = ("fixed", "taylor", "first_block")
TELEFUSER = (34, 49)  # computed of forwards (docs/sources.md#telefuser-velocity-cache)


def _valid(v) -> bool:
    if v is None:
        return True
    keys = {"mode", "steps", "forwards", "computed", "warmup", "final", "threshold", "max_skip"}
    return isinstance(v, dict) and set(v) == keys and v["mode"] in MODES


SPEC = Spec(
    name="step_cache",
    settings={"off": True, "fixed": False, "taylor": False, "first_block": False},
    summary="fewer forwards: a fixed schedule reusing (fixed) or extrapolating (taylor) the velocity, or an adaptive "
            "first-block cache, inside recipe.cache's budget (lossy)",
    counter="step_cache",
    options=(Option("transformer", "step_cache", _valid, "None or dict(mode, steps, forwards, computed, warmup, final, "
                    "threshold, max_skip)", None),),
)

PUBLISHED = {
    "fixed": "published for the same kind of schedule on released weights: TeleFuser's conservative velocity cache computes "
             "34 of 49 DiT calls, 78.546 -> 55.450 s end to end on four GPUs (1.42x; its summary gives times and calls, no "
             "PSNR/SSIM; docs/sources.md#telefuser-velocity-cache)",
    "first_block": "published for a first-block cache on released weights: SGLang's audited Cache-DiT config for H3 (quality=high) "
                   "measured SSIM 0.931 / PSNR 28.16 dB against the uncached frames at 1.40x on 4xH200; its knobs are not "
                   "published, h3plan's first_block takes the cookbook's manual example (first block, warm-up 4, threshold "
                   "0.12, 2 in a row) and is not that audited config (docs/sources.md#sglang-cache-dit)",
}
PUBLISHED["taylor"] = PUBLISHED["fixed"] + "; the extrapolation was measured by no source on H3"
UNMEASURED = ("h3plan has not measured this config's quality (seeded weights carry no trained model's step-to-step "
              "statistics): action=calibrate calibrate.target=step_cache model.path=DIR measures it on your checkpoint")


def config_problem(cache: Mapping[str, Any]) -> tuple[str, str] | None:
    """(key, why) for a recipe.cache value the schema's types let through, else None."""
    def is_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if (cache["psnr_db_min"] is None) != (cache["ssim_min"] is None):
        return "recipe.cache", "a cache budget needs both psnr_db_min and ssim_min (or neither: no step cache)"
    if cache["computed"] is not None and (not is_int(cache["computed"]) or cache["computed"] < 1):
        return f"recipe.cache.computed={cache['computed']}", "must be an integer >= 1 (forwards computed) or null"
    for k in ("warmup", "final"):
        if not is_int(cache[k]) or cache[k] < 0:
            return f"recipe.cache.{k}={cache[k]}", "must be an integer >= 0 (forwards that never skip)"
    if not is_int(cache["max_skip"]) or cache["max_skip"] < 1:
        return f"recipe.cache.max_skip={cache['max_skip']}", "must be an integer >= 1"
    if cache["threshold"] < 0:
        return f"recipe.cache.threshold={cache['threshold']}", "must be >= 0 (0: never skips)"
    return None


def computed_mask(forwards: int, computed: int, warmup: int, final: int) -> tuple[bool, ...]:
    """Which of `forwards` calls compute (True) under a fixed schedule: the first `warmup` and last `final`, and the
    rest of `computed` spread evenly over the middle (the middle's first forward among them). computed >= forwards,
    or warm-up and final covering every forward: all True."""
    head, tail = min(warmup, forwards), min(final, max(forwards - warmup, 0))
    middle = forwards - head - tail
    k = min(max(computed - head - tail, 0), middle)
    picked = {head + (j * middle) // k for j in range(k)} if k else set()
    return tuple(i < head or i >= forwards - tail or i in picked for i in range(forwards))


def scaled(computed: int, planned: int, forwards: int) -> int:
    """The computed count for a call of `forwards` when the plan computes `computed` of `planned` (same fraction,
    rounded up)."""
    return computed if forwards == planned else min(forwards, -(-computed * forwards // planned))


def forwards_of(steps: int, video_shift: float) -> int:
    return len(schedule(int(steps), float(video_shift)))


def _request(ctx: Context) -> tuple[int, int]:
    steps = int(ctx.pipeline.get("num_inference_steps", 50))
    shift = (ctx.pipeline.get("schedulers") or {}).get("video_shift", 12.0)
    return steps, forwards_of(steps, shift)


def _cache(ctx: Context) -> Mapping[str, Any]:
    return ctx.recipe.get("cache") or {}


def _budget(ctx: Context) -> bool:
    c = _cache(ctx)
    return c.get("psnr_db_min") is not None and c.get("ssim_min") is not None


def _computed(ctx: Context) -> int:
    c, (_, n) = _cache(ctx), _request(ctx)
    if c.get("computed") is not None:
        return int(c["computed"])
    want = -(-TELEFUSER[0] * n // TELEFUSER[1])
    return min(n, max(want, c.get("warmup", 4) + c.get("final", 1)))


def _too_short(ctx: Context) -> str | None:
    c, (steps, n) = _cache(ctx), _request(ctx)
    w, f = c.get("warmup", 4), c.get("final", 1)
    if n <= w + f:
        return (f"the schedule is too short to skip anything: {n} forwards (num_inference_steps={steps}), warm-up {w} + "
                f"final {f} never skip")
    return None


def policy(ctx: Context, s: str) -> list[str]:
    """Any setting but off needs the recipe's cache budget; with one it is the recipe's own lossy choice."""
    if s == "off" or _budget(ctx):
        return []
    kind = "lossless" if ctx.lossless_only else f"budget {ctx.recipe['budget']['psnr_db_min']} dB (kernel levers only)"
    return [f"recipe {ctx.recipe['name']} ({kind}) sets no cache budget and step_cache={s} skips forwards (lossy): "
            "set recipe.cache={psnr_db_min:...,ssim_min:...}"]


def blockers(ctx: Context, s: str) -> list[str]:
    if s == "off":
        return []
    c, (steps, n) = _cache(ctx), _request(ctx)
    out = []
    if s == "first_block" and ctx.ring > 1:
        out.append(f"parallel.ring={ctx.ring}: the first block's statistic is reduced over the Ulysses group only")
    if s in ("fixed", "taylor") and c.get("computed") is not None:
        if c["computed"] > n:
            out.append(f"recipe.cache.computed={c['computed']} is longer than the request's {n} forwards "
                       f"(num_inference_steps={steps})")
        elif c["computed"] < min(n, c.get("warmup", 4) + c.get("final", 1)):
            out.append(f"recipe.cache.computed={c['computed']} is fewer than the forwards that never skip "
                       f"(warm-up {c.get('warmup', 4)} + final {c.get('final', 1)})")
    return out


def params(ctx: Context, s: str) -> dict:
    if s == "off":
        return {}
    c, (steps, n) = _cache(ctx), _request(ctx)
    p = {"steps": steps, "forwards": n, "warmup": int(c.get("warmup", 4)), "final": int(c.get("final", 1)),
         "psnr_db_min": c.get("psnr_db_min"), "ssim_min": c.get("ssim_min")}
    if s == "first_block":
        return {**p, "threshold": float(c.get("threshold", 0.12)), "max_skip": int(c.get("max_skip", 2))}
    mask = computed_mask(n, _computed(ctx), p["warmup"], p["final"])
    return {**p, "computed": sum(mask), "skipped": [i for i, m in enumerate(mask) if not m]}


def explain(ctx: Context, s: str) -> list[str]:
    if s == "off":
        return ["every forward computed: the transformer's own velocity at every step"]
    p, short = params(ctx, s), _too_short(ctx)
    if s == "first_block":
        what = (f"first-block cache: skips the other blocks while the first block's output moved by < {p['threshold']:g} "
                f"(relative L1, reduced over the Ulysses group), at most {p['max_skip']} in a row, never in the first "
                f"{p['warmup']} or last {p['final']} of {p['forwards']} forwards")
    else:
        how = "reuses the last computed velocity" if s == "fixed" else "extrapolates the velocity (first order, step index)"
        what = (f"computes {p['computed']} of {p['forwards']} forwards (num_inference_steps={p['steps']}; warm-up "
                f"{p['warmup']} and final {p['final']} never skip) and {how} for the other {p['forwards'] - p['computed']}")
    out = [what, f"budget recipe.cache: PSNR >= {p['psnr_db_min']} dB, SSIM >= {p['ssim_min']} against the uncached frames",
           PUBLISHED[s], UNMEASURED]
    return out + ([short] if short else [])


def auto(ctx: Context):
    if not _budget(ctx):
        why = ("a lossless recipe keeps every forward" if ctx.lossless_only
               else "the kernel levers' budget does not cover skipped forwards")
        return "off", [f"no cache budget (recipe.cache.psnr_db_min / ssim_min): {why}"], {}
    short = _too_short(ctx)
    if short:
        return "off", [short], {}
    return "fixed", explain(ctx, "fixed"), params(ctx, "fixed")


def decide(ctx: Context):
    return resolve(ctx, SPEC, auto=auto, blockers=blockers, params=params, explain=explain, policy=policy)


def install(builder, decision) -> None:
    if decision.setting == "off":
        builder.skip(SPEC.name, decision.reasons[0])
        return
    p = decision.param
    builder.set(SPEC.name, "step_cache", {
        "mode": decision.setting, "steps": p("steps"), "forwards": p("forwards"),
        "computed": p("computed", p("forwards")), "warmup": p("warmup"), "final": p("final"),
        "threshold": p("threshold", 0.0), "max_skip": p("max_skip", 1)})
