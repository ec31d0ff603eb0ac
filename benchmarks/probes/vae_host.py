"""Probe (H200): host cost per call of the VAE decoder's fused ops, and what a CUDA graph would save.

At one decoder tile (S tokens, dim 2048, 32 x 64 heads, fp16 under autocast): per-call wall time of
2,000 calls issued back to back (the GPU work is a few microseconds, so the host sets the pace) for
each op's eager expression, its public kernel function (check + custom op + Triton launch), the
registered op alone, and its check alone; then one whole decoder block eager vs fused, and both
replayed from a CUDA graph. Usage: python vae_host.py [S]
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from vae import build_vae, resolve_plan, vae_config  # noqa: E402

from h3plan import install, uninstall  # noqa: E402
from h3plan.actions.bench import Clock, median_ms  # noqa: E402
from h3plan.actions.bench.ops import swiglu as ks  # noqa: E402
from h3plan.actions.bench.ops import vae as kv  # noqa: E402


def per_call_us(fn, n=2000):
    """Host-paced: the host clock around n calls issued back to back and the sync after them, per call."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    return Clock(torch, torch.device("cpu"))(lambda: ([fn() for _ in range(n)], torch.cuda.synchronize())) / n * 1e3


def main():
    S = int(sys.argv[1]) if len(sys.argv) > 1 else 1028
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(1, S, 2048, device=dev, generator=g)
    y = torch.randn(1, S, 2048, device=dev, generator=g).half()
    sc = torch.randn(2048, device=dev, generator=g)
    q, k = (torch.randn(1, S, 32, 64, device=dev, generator=g).half() for _ in range(2))
    cos, sin = (torch.rand(1, S, 1, 48, device=dev, generator=g) for _ in range(2))
    proj = torch.randn(1, S, 16384, device=dev, generator=g).half()
    rows = {
        "scaled_residual": (lambda: kv.scaled_residual_ref(h, y, sc), lambda: kv.scaled_residual(h, y, sc),
                            lambda: torch.ops.h3plan.scaled_residual(h, y, sc),
                            lambda: kv.scaled_residual_check(h, y, sc)),
        "vae_qk_norm_rope": (lambda: kv.vae_qk_norm_rope_ref(q, k, cos, sin, 1e-5),
                             lambda: kv.vae_qk_norm_rope(q, k, cos, sin, 1e-5),
                             lambda: torch.ops.h3plan.vae_qk_norm_rope(q, k, cos, sin, 1e-5),
                             lambda: kv.vae_qk_norm_rope_check(q, k, cos, sin, 1e-5)),
        "swiglu": (lambda: ks.swiglu_ref(proj) if hasattr(ks, "swiglu_ref") else None, lambda: ks.swiglu(proj),
                   lambda: torch.ops.h3plan.swiglu(proj), lambda: ks.swiglu_check(proj)),
    }
    print(f"S={S}: per-call microseconds (host-paced)")
    print(f"{'op':<18} {'eager':>8} {'public':>8} {'op only':>8} {'check':>8}")
    for name, fns in rows.items():
        print(f"{name:<18} " + " ".join(f"{per_call_us(f):8.1f}" for f in fns), flush=True)

    vae = build_vae(vae_config("h3"), device=dev)
    blk = vae.decoder.transformer_blocks[0] if hasattr(vae.decoder, "transformer_blocks") else None
    if blk is None:
        mods = [m for m in vae.modules() if type(m).__name__ == "MiniMaxH3VideoTransformerBlock"]
        blk = mods[0]
    x = torch.randn(1, S, 2048, device=dev, generator=g)
    rope = (cos, sin)
    plan = resolve_plan("hardware=sm90 recipe=bf16 levers.vae_ops=fused", "h3")
    for label, p in (("eager", None), ("fused", plan)):
        uninstall(vae)
        if p is not None:
            install(vae, p)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
            ms = per_call_us(lambda: blk(x, rope), n=300)
            gpu = median_ms(lambda: blk(x, rope), 0, 30) * 1e3
            try:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        blk(x, rope)
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = blk(x, rope)
                ref = blk(x, rope)
                graph.replay()
                torch.cuda.synchronize()
                same = torch.equal(out, ref)
                gms = per_call_us(graph.replay, n=300)
                gtxt = f"graph replay {gms:.1f} us/call, replay bitwise equal to a plain call: {same}"
            except Exception as exc:
                gtxt = f"graph capture failed: {type(exc).__name__}: {str(exc)[:200]}"
        print(f"block {label}: {ms:.1f} us/call host-paced, {gpu:.1f} us GPU (events); {gtxt}", flush=True)
    uninstall(vae)


if __name__ == "__main__":
    main()
