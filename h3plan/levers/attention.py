"""Attention backend for the transformer blocks: sdpa, cudnn_bf16, fa4 (BF16) or cudnn_fp8.

auto: FP8 attention when the recipe asks for it, the policy allows lossy levers and cuDNN FP8 can run
on the hardware (version gate, output dtypes); otherwise the fastest BF16 backend of the hardware's
`attention_rank`. BF16 backends are exact given the backend (not bitwise equal to one another).
At parallel.ring > 1 no cudnn_fp8: the ring merges key blocks through their log-sum-exp, which FP8
attention does not return here (h3plan/runtime/parallel/lse.py).
"""

from __future__ import annotations

from h3plan.facts.attention import BACKENDS, DEFAULT, FP8, select, supports
from ..sources import cite
from .base import Context, Option, Spec, Terms, nearest_point, one_of, resolve, VERIFY_REFERENCE

SPEC = Spec(
    name="attention",
    settings={name: b.lossless for name, b in BACKENDS.items()},
    summary="attention backend of the transformer blocks (BF16 backends exact given the backend; cudnn_fp8 lossy)",
    verify=VERIFY_REFERENCE,
    counter="attention",
    options=(Option("attention", "backend", *one_of(*BACKENDS), default=DEFAULT, describe=lambda v: f"backend={v}"),),
    column="attention",
    # an FP8 backend writes e4m3 (cuDNN FP8 on Hopper), cast to bf16 after
    terms={name: Terms(attention_backend=name, attention_out_bytes=1 if b.precision == "fp8" else 2)
           for name, b in BACKENDS.items()},
)


def fp8_problems(ctx: Context) -> list[str]:
    return list(supports(FP8, ctx.hardware, ctx.hw))


def fp8_output_dtype(ctx: Context) -> str:
    """bf16 where the hardware and cuDNN allow it (Blackwell, >= 9.13), else fp8 (Hopper)."""
    return params(ctx, FP8)["o_dtype"]


def blockers(ctx: Context, s: str) -> list[str]:
    return list(supports(s, ctx.hardware, ctx.hw) + ring_problems(ctx, s))


def ring_problems(ctx: Context, s: str = FP8) -> list[str]:
    ring, b = ctx.ring, BACKENDS[s]
    if ring == 1 or b.lse:
        return []
    return [f"parallel.ring={ring}: the ring merges key blocks through their log-sum-exp and {b.precision.upper()} "
            "attention returns none here (h3plan/runtime/parallel/lse.py)"]


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
            problems = fp8_problems(ctx)
            if not problems:
                speed = _speeds(ctx, [FP8, "fa4"])
                r = [f"recipe {name} asks for FP8 attention; cuDNN FP8 with FP8 Q/K/V "
                     f"({hw['attention_rank']['fp8_source']})"]
                if speed:
                    r.append(f"measured TFLOP/s at the nearest shape: {speed}")
                return FP8, r + [ctx.budget_text()], params(ctx, FP8)
            reasons.append(f"recipe {name} asks for FP8 attention but cuDNN FP8 cannot run: {'; '.join(problems)}; "
                           f"BF16 attention instead, the fallback of {cite('trtllm-seed')}")
    else:
        reasons.append(f"recipe {name} asks for BF16 attention")
    pick, _ = select(hw["attention_rank"]["order"], hw, ctx.hw)
    fastest, times = measured_fastest(ctx, [b for b in hw["attention_rank"]["order"] if not blockers(ctx, b)])
    if fastest is not None and fastest != pick:
        reasons.append(f"{fastest} is the fastest BF16 attention measured on {ctx.hw} at the plan's nearest shape: "
                       f"{times} (hardware.measured.attention; the rank {' > '.join(hw['attention_rank']['order'])} "
                       f"says {pick})")
        return fastest, reasons, params(ctx, fastest)
    reasons.append(f"{pick} is the fastest BF16 attention on {ctx.hw} (hardware.attention_rank: "
                   f"{' > '.join(hw['attention_rank']['order'])}; {hw['attention_rank']['source']})")
    if times:
        reasons.append(f"measured at the plan's nearest shape: {times}")
    speed = _speeds(ctx, hw["attention_rank"]["order"])
    if speed:
        reasons.append(f"measured TFLOP/s at the nearest shape: {speed}")
    return pick, reasons, params(ctx, pick)


def measured_fastest(ctx: Context, candidates: list[str]) -> tuple[str | None, str]:
    """The fastest of `candidates` at the measured point nearest the plan's per-rank shape among those that timed
    two or more of them, with each one's time per call at the plan's shape (4*S^2*H*D*B / TFLOP/s); (None, "")
    where no point compares two."""
    import math

    points = [p for p in ctx.hardware["measured"]["attention"] if sum(p.get(b) is not None for b in candidates) >= 2]
    if not points:
        return None, ""
    s, heads = ctx.seq_len, ctx.shape["heads_per_rank"]
    p = min(points, key=lambda p: (abs(math.log(p["seq_len"] / s)) + abs(math.log(p["heads"] / heads)),
                                   p["seq_len"], p["heads"]))
    flops = 4 * ctx.shape["batch"] * s**2 * heads * ctx.model["diffusers_config"]["attention_head_dim"]
    ms = {b: flops / (p[b] * 1e12) * 1e3 for b in candidates if p.get(b) is not None}
    best = min(ms, key=ms.get)
    return best, (", ".join(f"{b} {t:.1f} ms" for b, t in sorted(ms.items(), key=lambda kv: kv[1]))
                  + f" per call (TFLOP/s measured at {p['seq_len']:,} x {p['heads']} heads)")


def params(ctx: Context, s: str) -> dict:
    b = BACKENDS[s]
    return b.params(ctx.hardware) if b.params else {}


def explain(ctx: Context, s: str) -> list[str]:
    return [f"{s} is exact given the backend" if SPEC.settings[s] else ctx.budget_text()]


def decide(ctx: Context):
    return resolve(ctx, SPEC, blockers=blockers, auto=auto, params=params, explain=explain)


def install(builder, decision) -> None:
    builder.set(SPEC.name, "backend", decision.setting)
