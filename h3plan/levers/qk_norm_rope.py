"""Per-head RMSNorm + partial RoPE for Q and K in one kernel (+ Ulysses destination-major pack at
degree > 1); fused_fp8 also casts Q, K, V to e4m3 with the fp8_scales decision's scales.

auto: fused_fp8 with cuDNN FP8 attention when the rows per rank reach the hardware's
step_fusions_min_rows_per_rank (the TRT-LLM seed (docs/sources.md#trtllm-seed) turns the FP8 scale fusion off at U8
19k); otherwise fused, which keeps eager's BF16 rounding (exact, telefuser seed (docs/sources.md#telefuser-seed)).
"""

from __future__ import annotations

from ..sources import cite
from . import rules
from .base import Context, default_install, one_of, Option, resolve, Spec, Terms


SPEC = Spec(
    name="qk_norm_rope",
    settings={"eager": True, "fused": True, "fused_fp8": False},
    summary="per-head RMSNorm + partial RoPE of Q and K in one kernel (+ FP8 cast: fused_fp8, lossy)",
    counter="qk_norm_rope",
    backends={"fused_fp8": ("cudnn_fp8",)},
    options=(Option("attention", "qk_norm_rope", *one_of("eager", "fused", "fused_fp8"), default="eager",
                    swap=lambda v: (".norm_q/norm_k+rope", "eager", v) if v != "eager" else None,
                    describe=lambda v: f"qk_norm_rope={v}"),),
    kernels=("qk_norm_rope", "qk_norm_rope_fp8"),
    column="qk_rope",
    terms={"fused": Terms(qk_fused=True), "fused_fp8": Terms(qk_fused=True, qkv_fp8=True)},
)


def step_fusions_on(ctx: Context) -> tuple[bool, str]:
    rows, thr = ctx.rows_per_rank, ctx.tuning["step_fusions_min_rows_per_rank"]
    on = rows >= thr
    why = (f"{rows:,} rows per rank {'>=' if on else '<'} {thr:,} (hardware.tuning.step_fusions_min_rows_per_rank, "
           f"midway between {cite('trtllm-seed')} turning the step fusions off at Ulysses 8 and 19k tokens, 2,375 "
           "rows, and on at Ulysses 4 and 19k, 4,750)")
    return on, why


def auto(ctx: Context):
    pack = " with the Ulysses destination-major pack" if ctx.degree > 1 else ""
    exact = (f"per-head RMSNorm + partial RoPE{pack} in one kernel, eager's BF16 rounding kept "
             f"({cite('telefuser-seed')}: bit-exact)")
    if rules.attention(ctx) == "cudnn_fp8":
        on, why = step_fusions_on(ctx)
        if on:
            return "fused_fp8", [f"QK-norm, RoPE and the FP8 cast in one kernel with {rules.fp8_scales(ctx)} "
                                 f"scales{pack}, as {cite('trtllm-seed')} runs it at Ulysses 1 and 4", why,
                                 ctx.budget_text()], params(ctx, "fused_fp8")
        return ("fused", [f"FP8 scale fusion off: {why}; the attention backend casts to FP8", exact],
                params(ctx, "fused"))
    return "fused", [exact], params(ctx, "fused")


def params(ctx: Context, s: str) -> dict:
    if s == "eager":
        return {}
    p = {"rope_channels": 2 * 3 * ctx.model["diffusers_config"]["rope_freq_dim"], "ulysses_pack": ctx.degree > 1}
    if s == "fused_fp8":
        p["scales"] = rules.fp8_scales(ctx)
    return p


def decide(ctx: Context):
    return resolve(ctx, SPEC, auto=auto, params=params)


install = default_install(SPEC)
