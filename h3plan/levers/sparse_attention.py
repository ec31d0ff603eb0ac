"""Fewer attention FLOPs: block-sparse attention for the target-video query rows, inside `recipe.sparse`'s budget.

Settings:
- off: every attention call dense (lossless).
- block_sparse: on a sparse forward (the first `dense_forwards` of a generation stay dense), a router
  (h3plan/runtime/kernels/block_router.py) scores, per head and query block of target-video rows, every key block by
  a sub-block log-sum-exp and keeps `keep` of them (the blocks holding text, condition, reference or audio keys and
  the query block's own diagonal always), and FA4's block-sparse forward runs the kept blocks. Query blocks holding
  any other row (text, conditions, references, audio, mixed) keep every key block in the same call (dense).
  Blocks: `hardware.fa4.block_sparse` (128 x 128 on SM90: FA4's own tile, so a kept block runs at the dense rate).

Policy, as step_cache's: without a budget (recipe.sparse psnr_db_min / ssim_min, either or both; null by default)
block_sparse is refused and auto picks off, so every packaged recipe keeps dense attention; the budget is the recipe's
own lossy choice. Also refused: ring attention (parallel.ring > 1: each ring step sees one key block range, no row's
whole key set), an attention backend other than fa4 (cuDNN's FP8 SDPA takes no block mask and FA4's FP8 forward is
SM100-only; with recipe=fp8, levers.attention=fa4 keeps the FP8 GEMMs and composes), a GPU with no FA4 block-sparse
forward, and a request whose forwards are all dense (auto: off, with the reason). ulysses_exchange (decided after)
leaves out projection_split, whose attention calls see a slice of the query rows. Ulysses: the router runs after the
exchange on this rank's heads over the whole sequence, so the mask is per head and local (no extra communication).
Runtime: h3plan/runtime/levers/sparse_attention.py (the forward index from the timestep vector through
runtime/schedule.py schedule_index; each call's block-sparse attention, `SparseState.take`, as the attention
processor's override), installed by SPEC.model_step.

Quality is evidence, by step_cache's rules (h3plan/facts/evidence.py): `PUBLISHED` (SubBlock on released weights:
SSIM, no PSNR, so a budget with a PSNR bound needs the user's own measurement) and the calibrated points of
`recipe.sparse.evidence=FILE` (`action=calibrate calibrate.target=sparse_attention` writes it; they take precedence).
With a budget, auto and a forced block_sparse alike run only where the evidence at the plan's knobs meets it; evidence
that misses is a one-line refusal citing it; no evidence at these knobs ("unmeasured") runs only with
recipe.sparse.unmeasured=true, and the plan says so. Under auto as well: recipe.sparse names the one lossy setting and
its knobs, so auto picks nothing the user did not name (the unmeasured rule every lossy lever shares,
h3plan/facts/evidence.py; step_cache's auto, which picks settings and knobs by their evidence, refuses instead).
Torch-free.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any, Mapping

from h3plan.facts import evidence as ev
from h3plan.facts.pipeline import pipeline_defaults, schedule_facts
from h3plan.facts.timesteps import request_steps
from h3plan.facts.workflows import DEFAULT_TASK
from h3plan.facts.decision import Decision
from h3plan.sources import cite

from . import rules
from .base import Context, LeverError, Option, Spec, Terms, resolve, VERIFY_ATTENTION_ERROR
from .step_cache import forwards_of

SUB = 32  # rows per pooled sub-block (h3plan/runtime/kernels/block_router.py SUB)


def _valid(v) -> bool:
    if v is None:
        return True
    keys = {"keep", "dense_forwards", "block_q", "block_k", "video_only", "steps"}
    return isinstance(v, dict) and set(v) == keys and 0.0 < v["keep"] <= 1.0


# Quality published for this kind of routing on released weights (docs/sources.md#sglang-subblock), as the evidence
# every lossy lever cites (h3plan/facts/evidence.py): SSIM 0.80-0.94 over its runs, the worst kept; no PSNR published.
PUBLISHED = (
    ev.QualityPoint.make("sparse_attention", "block_sparse",
                         {"keep": 0.25, "dense_forwards": 10, "video_only": True, "forwards": 49}, ("t2va",),
                         psnr_db=None, ssim=0.80, speedup=1.28, kind="published",
                         where="8xH200, SGLang's lossless frames of the same seed, SSIM 0.80-0.94 over its runs, "
                               "1.28-1.48x, 64 x 64 blocks",
                         source="docs/sources.md#sglang-subblock"),
)
DEFAULTS = MappingProxyType({k: v for k, v in PUBLISHED[0].knobs if k != "forwards"})
"""recipe.sparse's keep, dense_forwards and video_only where nothing sets them: the published point's knobs, so a plan
left at the defaults on that point's workflow and step count is covered by it. The one home of these defaults:
SPEC.recipe_defaults declares them, and planning/schema.py SparseBudget's fields read them from there."""


SPEC = Spec(
    name="sparse_attention",
    settings={"off": True, "block_sparse": False},
    summary="fewer attention FLOPs: a router keeps the best key blocks of each target-video query block and FA4's "
            "block-sparse forward runs them, after recipe.sparse.dense_forwards dense forwards, inside recipe.sparse's "
            "budget (lossy)",
    counter="sparse_attention",
    backends={"block_sparse": ("fa4",)},
    options=(Option("attention", "sparse_attention", _valid,
                    "None or dict(keep, dense_forwards, block_q, block_k, video_only, steps)", None),),
    kernels=("block_router",),
    terms={"block_sparse": Terms(sparse_blocks=True)},
    table_skips_off=True,
    verify=VERIFY_ATTENTION_ERROR,
    recipe_section="sparse",
    model_step=lambda model, decision, site: _model_step(model, decision, site),  # below
    recipe_defaults=DEFAULTS,
    config_problem=lambda sparse: config_problem(sparse),  # below
    budget_line=lambda d: budget_line(d),  # below
)


CALIBRATE = "action=calibrate calibrate.target=sparse_attention model.path=DIR measures it on your checkpoint"
UNMEASURED = ("h3plan has not measured this configuration's quality (seeded weights carry no trained attention "
              f"pattern): {CALIBRATE}")
EVIDENCE_REASONS = ("evidence (", "unmeasured:")
"""How the reason that states a plan's quality evidence starts (the summary's `sparse` line prints it)."""


def verdict(p: Mapping[str, Any], workflow: str | None = DEFAULT_TASK,
            points: tuple[ev.QualityPoint, ...] = PUBLISHED) -> ev.Verdict:
    """How the evidence (the published points, or `points`) at this plan's knobs stands against recipe.sparse's
    budget."""
    knobs = {"keep": p["keep"], "dense_forwards": p["dense_forwards"], "video_only": p["video_only"],
             "forwards": p["forwards"]}
    pts = [e for e in points if e.applies(SPEC.name, "block_sparse", knobs, workflow)]
    return ev.verdict(pts, ev.Budget.of({"psnr_db_min": p["psnr_db_min"], "ssim_min": p["ssim_min"]}))


def points(ctx: Context) -> tuple[ev.QualityPoint, ...]:
    """The published points, and the calibrated ones of recipe.sparse.evidence (EvidenceError: one line)."""
    return ev.with_calibrated(PUBLISHED, _sparse(ctx).get("evidence"), SPEC.name, "recipe.sparse.evidence",
                              (ctx.model or {}).get("path"))


def judge(ctx: Context) -> ev.Verdict:
    return verdict(params(ctx, "block_sparse"), _workflow(ctx), points(ctx))


def _workflow(ctx: Context) -> str:
    return str(ctx.request.get("task") or DEFAULT_TASK)


def config_problem(sparse: Mapping[str, Any]) -> tuple[str, str] | None:
    """(key, why) for a recipe.sparse value the schema's types let through, else None."""
    if sparse.get("unmeasured") and sparse["psnr_db_min"] is None and sparse["ssim_min"] is None:
        return ("recipe.sparse.unmeasured",
                "runs block_sparse without evidence inside a budget: set recipe.sparse's budget too")
    if not 0.0 < sparse["keep"] <= 1.0:
        return (f"recipe.sparse.keep={sparse['keep']}",
                "must be in (0, 1]: the fraction of key blocks a routed query block keeps")
    d = sparse["dense_forwards"]
    if not isinstance(d, int) or isinstance(d, bool) or d < 0:
        return (f"recipe.sparse.dense_forwards={d}",
                "must be an integer >= 0 (the first forwards of a generation, dense)")
    return None


def budget_line(d: Decision) -> tuple[str, str]:
    """The summary's line for block_sparse: the blocks and forwards it keeps, and the evidence it has, if any."""
    said = next((r for r in d.reasons if r.startswith(("evidence", "unmeasured"))), "")
    return "sparse", (f"{SPEC.name}={d.setting}: keep {d.param('keep'):g} of the key blocks on "
                      f"{d.param('sparse_forwards')} of {d.param('forwards')} forwards; {said}")


def _sparse(ctx: Context) -> Mapping[str, Any]:
    return ctx.recipe.get("sparse") or {}


def _budget(ctx: Context) -> bool:
    s = _sparse(ctx)
    return s.get("psnr_db_min") is not None or s.get("ssim_min") is not None


def _forwards(ctx: Context) -> tuple[int, int]:
    steps = request_steps(ctx.request, ctx.pipeline or pipeline_defaults())
    return steps, forwards_of(steps, schedule_facts(ctx.pipeline)["video_shift"])


def _block(ctx: Context) -> list[int] | None:
    b = ctx.hardware["fa4"].get("block_sparse")
    return None if b is None else [int(b[0]), int(b[1])]


def router_points(hw: Mapping[str, Any]) -> list[dict]:
    """The router's measured points on this GPU (hardware.fa4.block_sparse_router), by pooled-score GFLOP."""
    return sorted((hw.get("fa4") or {}).get("block_sparse_router") or (), key=lambda p: p["gflop"])


def work(seq_len: int, video_rows: int, keep: float, block_q: int, block_k: int, video_only: bool = True) -> dict:
    """The block counts of one sparse attention call: routed query blocks, key blocks kept per routed block, and the
    fraction of the dense call's block work it computes (rows x kept key blocks over rows x all key blocks)."""
    S, start = seq_len, seq_len - video_rows
    M, N = -(-S // block_q), -(-S // block_k)
    kb = min(N, max(1, math.ceil(keep * N - 1e-9)))
    lead = -(-start // block_k)  # key blocks holding a row before the video
    q0 = start if video_only else 0
    total = routed = 0
    for i in range(M):
        rows = min(block_q, S - i * block_q)
        if i * block_q >= q0 and kb < N:
            diag = {j for j in range(i * block_q // block_k, min(N, -(-(i + 1) * block_q // block_k)))}
            kept = max(kb, lead + len({j for j in diag if j >= lead}))
            routed += 1
        else:
            kept = N
        total += rows * kept
    return {"query_blocks": M, "key_blocks": N, "routed_query_blocks": routed, "kept_key_blocks": kb,
            "work_fraction": round(total / (S * N), 4)}


def _video_rows(ctx: Context) -> int | None:
    v = ctx.request.get("video_rows")
    return None if v is None else int(v)


def policy(ctx: Context, s: str) -> list[str]:
    """block_sparse needs the recipe's sparse budget; with one it is the recipe's own lossy choice."""
    if s == "off" or _budget(ctx):
        return []
    kind = "lossless" if ctx.lossless_only else f"budget {ctx.recipe['budget']['psnr_db_min']} dB (kernel levers only)"
    return [f"recipe {ctx.recipe['name']} ({kind}) sets no sparse attention budget and sparse_attention={s} drops key "
            "blocks (lossy): set recipe.sparse={ssim_min:...} (and/or psnr_db_min)"]


def blockers(ctx: Context, s: str) -> list[str]:
    if s == "off":
        return []
    out = _structural(ctx)
    return out if out or not _budget(ctx) else _unbacked(ctx)


def _unbacked(ctx: Context) -> list[str]:
    """Why the evidence does not back block_sparse under recipe.sparse's budget (empty: it does)."""
    v = judge(ctx)
    if v.status == "misses":
        assert v.point is not None
        return [f"its evidence misses recipe.sparse ({'; '.join(v.misses)}): {v.point.cite()}"]
    if v.status == "unmeasured" and not _sparse(ctx).get("unmeasured"):
        return [f"unmeasured: {_no_point(ctx)}; {CALIBRATE} (recipe.sparse.evidence=FILE), or run it without "
                "evidence with recipe.sparse.unmeasured=true"]
    return []


def _structural(ctx: Context) -> list[str]:
    """What rules block_sparse out whatever its quality: ring attention, the attention backend, the GPU, a request
    whose forwards are all dense."""
    out = []
    if ctx.ring > 1:
        out.append(f"parallel.ring={ctx.ring}: each ring step attends one range of key blocks, so no call sees a query "
                   "block's whole key set to route (block-sparse attention runs at ring 1)")
    if rules.fp8_attention(ctx):
        out.append("the FP8 attention is cuDNN's SDPA, which takes no block mask, and FA4's FP8 forward is SM100-only: "
                   "with recipe=fp8 set levers.attention=fa4 (FP8 GEMMs, BF16 block-sparse attention)")
    if _block(ctx) is None:
        out.append(f"{ctx.hw} has no FA4 block-sparse forward (hardware.fa4.block_sparse is null)")
    steps, n = _forwards(ctx)
    d = int(_sparse(ctx).get("dense_forwards", DEFAULTS["dense_forwards"]))
    if d >= n:
        out.append(f"recipe.sparse.dense_forwards={d} covers every one of the request's {n} forwards "
                   f"(num_inference_steps={steps}): nothing would run sparse")
    return out


def _no_point(ctx: Context) -> str:
    p, pub = params(ctx, "block_sparse"), PUBLISHED[0]
    rows = "video only" if pub.knob("video_only") else "every query block"
    return (f"no published or calibrated quality for keep {p['keep']:g} with {p['dense_forwards']} of {p['forwards']} "
            f"forwards dense (video only: {p['video_only']}) on {_workflow(ctx)}; the published point is keep "
            f"{pub.knob('keep'):g}, {pub.knob('dense_forwards')} of {pub.knob('forwards')} dense, {rows}, "
            f"{', '.join(pub.workflows)} ({cite('sglang-subblock')})")


def params(ctx: Context, s: str) -> dict:
    if s == "off":
        return {}
    c, (steps, n) = _sparse(ctx), _forwards(ctx)
    bq, bk = _block(ctx) or [128, 128]
    k = {key: c.get(key, v) for key, v in DEFAULTS.items()}
    keep, d, video_only = float(k["keep"]), int(k["dense_forwards"]), bool(k["video_only"])
    p = {"keep": keep, "dense_forwards": d, "forwards": n, "sparse_forwards": max(n - d, 0), "steps": steps,
         "video_only": video_only, "block_q": bq, "block_k": bk, "psnr_db_min": c.get("psnr_db_min"),
         "ssim_min": c.get("ssim_min")}
    video = _video_rows(ctx)
    if video is not None:
        p.update(work(ctx.seq_len, video, keep, bq, bk, video_only), video_rows=video)
    return p


def explain(ctx: Context, s: str) -> list[str]:
    if s == "off":
        return ["every attention call dense"]
    p = params(ctx, s)
    rows = ("target-video query blocks" if p["video_only"]
            else "every query block (video_only=false: not the published setting)")
    what = (f"{p['block_q']} x {p['block_k']} blocks (hardware.fa4.block_sparse; {cite('fa4-block-sparse')}): "
            f"{rows} keep {p['keep']:g} of the key blocks (the text, condition, audio and diagonal blocks always) "
            f"on {p['sparse_forwards']} of {p['forwards']} forwards; the first {p['dense_forwards']} dense")
    if "work_fraction" in p:
        what += (f"; a sparse call routes {p['routed_query_blocks']} of {p['query_blocks']} query blocks and computes "
                 f"{p['work_fraction']:.0%} of the dense call's block work")
    else:
        what += ("; its work is not estimated: parallel.seq_len gives no video rows (the router finds them per call "
                 "from the token tags)")
    out = [what, f"budget recipe.sparse: {ev.Budget.of(p).text()} against the dense frames"]
    v = judge(ctx)
    if v.point is None:
        out.append(f"unmeasured: {_no_point(ctx)}; it runs because recipe.sparse.unmeasured=true, so no measurement "
                   "backs the budget")
    else:
        which = "calibrated on your checkpoint" if v.point.kind == "calibrated" else "published on released weights"
        judged = (f"meets recipe.sparse ({ev.Budget.of(p).text()})" if v.status == "meets"
                  else f"misses recipe.sparse ({'; '.join(v.misses)})")
        out.append(f"evidence ({which}): {v.point.cite()}: {judged}")
    return out + ([] if v.point is not None and v.point.kind == "calibrated" else [UNMEASURED])


def auto(ctx: Context):
    if not _budget(ctx):
        why = ("a lossless recipe keeps dense attention" if ctx.lossless_only
               else "the kernel levers' budget does not cover dropped key blocks")
        return "off", [f"no sparse attention budget (recipe.sparse.psnr_db_min / ssim_min): {why}"], {}
    ruled_out = _structural(ctx)
    if ruled_out:
        return "off", ["block_sparse cannot apply: " + "; ".join(ruled_out)], {}
    # the structural reasons were checked above; unmeasured knobs pass with recipe.sparse.unmeasured=true, as a forced
    # setting's do: recipe.sparse names block_sparse and its knobs, auto chooses neither
    blocked = _unbacked(ctx)
    if blocked:  # a budget the evidence does not back: refused, as step_cache refuses one
        raise LeverError(SPEC.name, "auto", [f"recipe.sparse ({ev.Budget.of(_sparse(ctx)).text()}): block_sparse at "
                                             f"keep {params(ctx, 'block_sparse')['keep']:g}: " + blocked[0]
                                             + "; lower the budget, or levers.sparse_attention=off (dense attention)"])
    return "block_sparse", explain(ctx, "block_sparse"), params(ctx, "block_sparse")


def decide(ctx: Context):
    return resolve(ctx, SPEC, auto=auto, blockers=blockers, params=params, explain=explain, policy=policy)


def values(decision) -> dict[str, Any]:
    """What the installed lever runs by (its install option's value)."""
    p = decision.param
    return {"keep": p("keep"), "dense_forwards": p("dense_forwards"), "block_q": p("block_q"), "block_k": p("block_k"),
            "video_only": p("video_only"), "steps": p("steps")}


def install(builder, decision) -> None:
    if decision.setting == "off":
        builder.skip(SPEC.name, decision.reasons[0])
        return
    builder.set(SPEC.name, "sparse_attention", values(decision))


def _model_step(model, decision, site) -> None:
    """The forward placement and the processors' state (h3plan/runtime/levers/sparse_attention.py, through the
    install's Site)."""
    site.runtime().install(model, values(decision), site)
