"""Probe (H200): where does a block spend its time, and what bound does that put on a plan's speedup?

    python benchmarks/probes/block_profile.py [--out DIR] SPEC...     SPEC = recipe:S[:override,...]
    e.g. fp8:37820 fp8:19000 bf16:37820 fp8:37820:levers.fp8_act_quant=row

For each SPEC: diffusers' eager block and the installed plan (one real-width block, the bench's inputs), each
profiled over one forward after three warm-ups. Printed: GPU busy time and span, the largest idle gaps, the
top kernels, and the busy time by category (attention, GEMM, FP8 quantisation, h3plan's fused kernels,
torch elementwise/copies). `bound` = eager block / (the plan's attention + GEMM time): the speedup the plan
would reach if everything else cost nothing, at the rates these kernels ran. JSON to DIR/block-profile.json.
"""
import argparse
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import h3plan
from h3plan.actions.bench import (build_model, capture_block_inputs, median_ms, packed_inputs, profile_summary,
                                  run_stack)


# First match wins: a kernel name's lower-case text -> category.
CATEGORIES = (
    ("communication", ("ncclDevKernel", "ncclKernel")),
    ("attention", ("sdpa", "fmha", "flash", "attention")),
    ("gemm", ("nvjet", "gemm", "xmma")),
    ("torch_elementwise", ("at::native", "memset", "memcpy", "elementwise", "copy")),
    ("fp8_quant", ("cast", "amax", "fp8", "quant", "scale")),
    ("h3plan_fused", ("_kernel",)),
)


def profiled(blocks, x) -> dict:
    return profiled_call(lambda: run_stack(blocks, *x))


def profiled_call(fn) -> dict:
    """fn() profiled once after three warm-ups: busy time by category, top kernels, largest gaps."""
    with torch.no_grad():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    out = profile_summary(prof, CATEGORIES)
    out["top_kernels_ms"] = {k: v[0] for k, v in out["top_kernels_ms"].items()}
    return out


def profile_spec(spec: str) -> dict:
    recipe, S, *over = spec.split(":")
    S = int(S)
    overrides = [o for part in over for o in part.split(",") if o]
    plan = h3plan.resolve_config(hardware="sm90", recipe=recipe, parallel="u1", **{"parallel.seq_len": S},
                                 **dict(o.split("=", 1) for o in overrides))
    cfg = plan.get("model")["diffusers_config"]
    model = build_model(cfg, blocks=1, device="cuda")
    x = capture_block_inputs(torch, model, packed_inputs(cfg, S, device="cuda"))
    eager = profiled(model.transformer_blocks, x)
    h3plan.install(model, plan)
    planned = profiled(model.transformer_blocks, x)
    h3plan.uninstall(model)
    del model
    torch.cuda.empty_cache()
    floor = planned["by_category_ms"].get("attention", 0.0) + planned["by_category_ms"].get("gemm", 0.0)
    rec = {"spec": spec, "recipe": recipe, "S": S, "overrides": overrides, "eager": eager, "plan": planned,
           "speedup_busy": eager["busy_ms"] / planned["busy_ms"], "attention_plus_gemm_ms": floor,
           "bound_if_rest_free": eager["busy_ms"] / floor if floor else None}
    print(f"\n== {spec}: eager busy {eager['busy_ms']:.2f} ms; plan busy {planned['busy_ms']:.2f} ms, span "
          f"{planned['span_ms']:.2f} ms ({planned['ops']} GPU ops); speedup (busy) {rec['speedup_busy']:.3f}x; "
          f"attention+GEMM {floor:.2f} ms -> bound {rec['bound_if_rest_free']:.3f}x")
    for side in ("eager", "plan"):
        cats = ", ".join(f"{k} {v:.2f}" for k, v in rec[side]["by_category_ms"].items())
        print(f"  {side:5s} by category (ms): {cats}")
    for name, ms in planned["top_kernels_ms"].items():
        print(f"  plan {ms:8.3f} ms  {name}")
    for g, a, b in planned["largest_gaps_ms"][:4]:
        print(f"  plan gap {g:.3f} ms after {a} before {b}")
    return rec


def profile_forward(spec: str, layers: int) -> dict:
    """The installed plan's whole transformer forward (`layers` blocks, the model's own forward with its embeddings,
    AdaLN and output head), profiled once after three warm-ups, and timed by CUDA events over three more: is the
    GPU ever idle inside a forward, which a one-block profile cannot tell (its host runs only one block ahead)?"""
    recipe, S, *over = spec.split(":")
    S = int(S)
    overrides = [o for part in over for o in part.split(",") if o]
    plan = h3plan.resolve_config(hardware="sm90", recipe=recipe, parallel="u1", **{"parallel.seq_len": S},
                                 **dict(o.split("=", 1) for o in overrides))
    cfg = plan.get("model")["diffusers_config"]
    model = build_model(cfg, blocks=layers, device="cuda")
    x = packed_inputs(cfg, S, device="cuda")
    h3plan.install(model, plan)
    h3plan.reset_counters()
    rec = profiled_call(lambda: model(**x))
    counts = dict(h3plan.counters())
    with torch.no_grad():
        forward_ms = median_ms(lambda: model(**x), 0, 3)
    h3plan.uninstall(model)
    model.to("meta")  # free its device memory before the next spec builds
    torch.cuda.empty_cache()
    rec.update(spec=spec, layers=layers, forward_ms=forward_ms, counters=counts)
    print(f"\n== forward {spec} x{layers}: {rec['forward_ms']:.1f} ms (CUDA events, median of 3); profiled busy "
          f"{rec['busy_ms']:.1f} ms, span {rec['span_ms']:.1f} ms, idle {rec['idle_ms']:.2f} ms ({rec['ops']} GPU ops)")
    print("  by category (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in rec["by_category_ms"].items()))
    for g, a_, b_ in rec["largest_gaps_ms"]:
        print(f"  gap {g:.3f} ms after {a_} before {b_}")
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="*", default=["bf16:37820", "fp8:19000", "fp8:37820"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--forward", type=int, default=0, metavar="LAYERS",
                    help="profile the plan's whole forward of LAYERS blocks instead (block-profile-forward.json)")
    a = ap.parse_args(argv)
    if a.forward:
        recs = [profile_forward(s, a.forward) for s in a.specs]
    else:
        recs = [profile_spec(s) for s in a.specs]
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": recs}
        name = "block-profile-forward.json" if a.forward else "block-profile.json"
        with open(os.path.join(a.out, name), "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
