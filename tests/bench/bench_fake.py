"""A tiny fake result set for the bench report tests (no torch, no GPU): two plans, two lengths."""

from __future__ import annotations

from dataclasses import asdict

from h3plan.actions.bench import BlockRecord


def record(plan="sm90/bf16/u1", S=19000, blocks=1, eager=46.5, plan_ms=35.0, lossless=True, recipe="bf16",
           backend="fa4", bitwise=True, rel=3.1e-3, timing="cuda-events", device="NVIDIA H200", **extra):
    r = BlockRecord(S=S, blocks=blocks, plan=plan, eager_ms=eager, plan_ms=plan_ms,
                    speedup=eager / plan_ms if eager else None,
                    attention_ms=14.7, attention_backend=backend, bitwise_equal=bitwise, rel_error=rel,
                    recipe=recipe, lossless=lossless, device=device, timing=timing, attention_shape=[1, S, 56, 128],
                    attention_default_ms=18.4, attention_in_plan_ms=15.0, attention_standalone_ms=14.7,
                    attention_in_plan_fraction=14.7 / 15.0, counters={"attention.fused": 10})
    d = asdict(r)
    d.update(extra)
    return d


def records():
    return [
        record(),                                            # lossless 1.33x: met
        record(S=37820, eager=130.7, plan_ms=120.0),         # lossless 1.09x: not met
        record(blocks=4, eager=186.0, plan_ms=140.0),
        record(plan="sm90/fp8/u1", recipe="fp8", lossless=False, backend="cudnn_fp8", bitwise=None, rel=2.1e-2,
               plan_ms=29.0),                                # FP8 1.60x: met
        record(plan="sm90/fp8/u1", S=37820, recipe="fp8", lossless=False, backend="cudnn_fp8", bitwise=None,
               rel=2.4e-2, eager=130.7, plan_ms=95.0, attention_in_plan_fraction=0.90,  # 1.38x: not met
               attention_after_forward_ms=14.85, attention_in_plan_fraction_matched=0.99),
    ]
