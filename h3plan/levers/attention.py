"""Attention backend for the transformer blocks: sdpa, cudnn_bf16, fa4 (BF16) or cudnn_fp8.

auto: FP8 attention when the recipe asks for it, the policy allows lossy levers and cuDNN FP8 can run
on the hardware (version gate, output dtypes); otherwise the fastest BF16 backend of the hardware's
`attention_rank`. BF16 backends are exact given the backend (not bitwise equal to one another).
At parallel.ring > 1 no cudnn_fp8: the ring merges key blocks through their log-sum-exp, which FP8
attention does not return here (h3plan/parallel/lse.py).
"""

from __future__ import annotations

from ..sources import cite
from ..planning.hardware import cudnn_fp8_bf16_output, cudnn_fp8_version_problem
from .base import Context, Option, Spec, nearest_point, one_of, resolve

SPEC = Spec(
    name="attention",
    settings={"sdpa": True, "cudnn_bf16": True, "cudnn_fp8": False, "fa4": True},
    summary="attention backend of the transformer blocks (BF16 backends exact given the backend; cudnn_fp8 lossy)",
    reference=True,
    counter="attention",
    options=(Option("attention", "backend", *one_of("sdpa", "cudnn_bf16", "cudnn_fp8", "fa4"), default="sdpa"),),
)


def cudnn_fp8_problems(ctx: Context) -> list[str]:
    c = ctx.hardware["cudnn"]
    if not c["fp8"]:
        return [f"{ctx.hw} has no cuDNN FP8 attention (hardware.cudnn.fp8=false; {c['source']})"]
    why = cudnn_fp8_version_problem(ctx.hardware, c["version"]) if c["version"] is not None else None
    return [why] if why else []


def fp8_output_dtype(ctx: Context) -> str:
    """bf16 where the hardware and cuDNN allow it (Blackwell, >= 9.13), else fp8 (Hopper)."""
    return "bf16" if cudnn_fp8_bf16_output(ctx.hardware, None) else "fp8"


def blockers(ctx: Context, s: str) -> list[str]:
    hw = ctx.hardware
    if s == "cudnn_bf16" and not hw["cudnn"]["bf16"]:
        return [f"{ctx.hw} has no cuDNN BF16 attention ({hw['cudnn']['source']})"]
    if s == "fa4" and not hw["fa4"]["bf16"]:
        return [f"{ctx.hw} has no FA4 BF16 forward ({hw['fa4']['source']})"]
    if s == "cudnn_fp8":
        return cudnn_fp8_problems(ctx) + ring_problems(ctx)
    return []


def ring_problems(ctx: Context) -> list[str]:
    ring = ctx.ring
    if ring == 1:
        return []
    return [f"parallel.ring={ring}: the ring merges key blocks through their log-sum-exp and FP8 attention returns "
            "none here (h3plan/parallel/lse.py)"]


def _speeds(ctx: Context, backends) -> str:
    heads = ctx.shape["heads_per_rank"]
    parts = []
    for b in backends:
        p = nearest_point(ctx.hardware, ctx.seq_len, heads, b)
        if p is not None:
            parts.append(f"{b} {p[b]:g} at {p['seq_len']:,} x {p['heads']}")
    return "; ".join(parts)


def auto(ctx: Context):
    hw, name = ctx.hardware, ctx.recipe["name"]
    reasons = []
    if ctx.recipe["attention"] == "fp8":
        if ctx.lossless_only:
            reasons.append(f"recipe {name} asks for FP8 attention but its policy is lossless: BF16 attention")
        elif ring_problems(ctx):
            reasons.append(f"recipe {name} asks for FP8 attention but {ring_problems(ctx)[0]}: BF16 attention")
        else:
            problems = cudnn_fp8_problems(ctx)
            if not problems:
                speed = _speeds(ctx, ["cudnn_fp8", "fa4"])
                r = [f"recipe {name} asks for FP8 attention; cuDNN FP8 with FP8 Q/K/V ({hw['attention_rank']['fp8_source']})"]
                if speed:
                    r.append(f"measured TFLOP/s at the nearest shape: {speed}")
                return "cudnn_fp8", r + [ctx.budget_text()], params(ctx, "cudnn_fp8")
            reasons.append(f"recipe {name} asks for FP8 attention but cuDNN FP8 cannot run: {'; '.join(problems)}; "
                           f"BF16 attention instead, the fallback of {cite('trtllm-seed')}")
    else:
        reasons.append(f"recipe {name} asks for BF16 attention")
    order = [b for b in hw["attention_rank"]["order"] if not blockers(ctx, b)] + ["sdpa"]
    pick = order[0]
    reasons.append(f"{pick} is the fastest BF16 attention on {ctx.hw} (hardware.attention_rank: "
                   f"{' > '.join(hw['attention_rank']['order'])}; {hw['attention_rank']['source']})")
    speed = _speeds(ctx, hw["attention_rank"]["order"])
    if speed:
        reasons.append(f"measured TFLOP/s at the nearest shape: {speed}")
    return pick, reasons, params(ctx, pick)


def params(ctx: Context, s: str) -> dict:
    if s == "cudnn_fp8":
        return {"o_dtype": fp8_output_dtype(ctx), "requires": list(ctx.hardware["cudnn"]["fp8_requires"])}
    return {}


def explain(ctx: Context, s: str) -> list[str]:
    return [f"{s} is exact given the backend" if SPEC.settings[s] else ctx.budget_text()]


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, params=params, explain=explain)


def install(builder, decision) -> None:
    builder.set(SPEC.name, "backend", decision.setting)
