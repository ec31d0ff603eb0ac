"""Probe (H200): where does the VAE decode spend its time, eager and planned, and what bounds the plan?

    python benchmarks/probes/vae_profile.py [LATENT] [--plan "hardware=sm90 recipe=bf16"] [--out DIR]

One decode of LATENT (default 1x24x12x48x84: two chunks, 56 decoder calls at the released 256/64 tiles) in the
VAE's own dtype with no autocast, as diffusers' decode step runs it (benchmarks/vae.py's Decoder; the committed
results/probes/vae-profile-h200.log was profiled under FP16 autocast instead), timed (median of 3 after a warm-up) and
profiled once: diffusers eager at the plan's tile geometry, then the plan (its auto VAE levers: fused ops, CUDA graphs).
Per side: busy / span / idle, GPU time by category (GEMM, attention, conv, norms, h3plan's fused kernels, copies and
cats, other elementwise), the top kernels. `bound` = eager decode / (the plan's GEMM + attention time): the plan's
speedup if everything else cost nothing; the lossless plan keeps eager's GEMM and attention kernels (bitwise), so it
cannot pass it.
"""
import argparse
import json
import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))


from vae import Decoder, build_vae, parse_latent, resolve_plan, tiles_only, vae_config  # noqa: E402

from h3plan import counters, install, reset_counters, uninstall  # noqa: E402
from h3plan.actions.bench import category, profile_summary  # noqa: E402


# First match wins: a kernel name's lower-case text -> category.
CATEGORIES = (
    ("attention", ("sdpa", "fmha", "flash", "attention")),
    ("gemm", ("nvjet", "gemm", "xmma")),
    ("conv", ("conv", "implicit", "winograd", "fft")),
    ("norm", ("layer_norm", "rms_norm", "norm_kernel")),
    ("h3plan_fused", ("_qk_norm", "_swiglu", "_scaled_residual", "_rows", "_cast")),
    ("copy_cat", ("copy", "cat", "memset", "memcpy")),
    ("elementwise", ("elementwise", "reduce")),
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("latent", nargs="?", default="1x24x12x48x84")
    ap.add_argument("--plan", default="hardware=sm90 recipe=bf16", help="the plan spec (its auto VAE levers)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--name", default="vae-profile.json", help="the JSON file written under --out")
    a = ap.parse_args(argv)
    latent = parse_latent(a.latent)
    vae = build_vae(vae_config("h3"), device="cuda")
    z = torch.randn(latent, generator=torch.Generator().manual_seed(1)).to("cuda")
    run = Decoder(vae, z)
    plan = resolve_plan(a.plan, "h3")
    doc = {"latent": list(latent), "plan": a.plan, "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for label, p in (("eager", tiles_only(plan)), ("plan", plan)):
        uninstall(vae)
        install(vae, p)
        ms, _, peak = run.timed(1, 3)
        reset_counters()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        c = counters()
        s = profile_summary(prof, CATEGORIES)
        calls = s["top_kernels_ms"] and sum(n for k, (_, n) in s["top_kernels_ms"].items()
                                            if category(k, CATEGORIES) == "attention")
        doc[label] = {"decode_ms": ms, "peak_gib": peak, "counters": c, "decoder_block_calls": calls, **s}
        print(f"\n== {label}: decode {ms:.1f} ms (median of 3), peak {peak:.2f} GiB; profiled: busy {s['busy_ms']:.1f} "
              f"ms, span {s['span_ms']:.1f} ms, idle {s['idle_ms']:.1f} ms, {s['ops']} GPU ops", flush=True)
        print("   by category (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in s["by_category_ms"].items()))
        for k, (v, n) in s["top_kernels_ms"].items():
            print(f"   {v:9.2f} ms {n:6d}  {k}")
    uninstall(vae)
    pc = doc["plan"]["by_category_ms"]
    floor = pc.get("gemm", 0.0) + pc.get("attention", 0.0)
    doc["gemm_plus_attention_ms"] = floor
    doc["bound_if_rest_free"] = doc["eager"]["decode_ms"] / floor if floor else None
    doc["speedup"] = doc["eager"]["decode_ms"] / doc["plan"]["decode_ms"]
    print(f"\nspeedup {doc['speedup']:.2f}x; the plan's GEMM + attention {floor:.1f} ms: bound "
          f"{doc['bound_if_rest_free']:.2f}x if every other kernel and gap cost nothing (the GEMMs and attention keep "
          f"eager's kernels: bitwise)")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, a.name), "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
