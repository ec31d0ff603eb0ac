"""H200 probe of the NVFP4 producers: time, fraction of copy bandwidth and bits of every producer at H3 width.

    PYTHONPATH=. python benchmarks/probes/nvfp4_producers.py [OUT_DIR] [--rows 19000] [--configs cast=2,4,8 ...]

For each producer (kernels/nvfp4_producers.py rmsnorm_modulate_nvfp4, gated_residual_modulate_nvfp4,
swiglu_nvfp4; kernels/nvfp4.py cast_nvfp4) in static (a given global scale: one pass) and dynamic mode (amax pass,
then the quantize pass), at every candidate warps count (kernels/nvfp4.py WARPS): the packed codes, swizzled
scales, g (and the fold's h') compared byte for byte with the reference chain on the GPU (`<op>_ref`: the bf16
reference, then `cast_nvfp4_ref`), on inputs holding zero, -0, tiny, saturating blocks and every e2m1 tie
(tests/gpu/test_nvfp4_gpu.py `special_blocks`), then the median time (20 launches, L2 flushed) and its
fraction of copy bandwidth over the bytes one pass must move (inputs read once, codes + scales written; the
fold also writes h'). Dynamic mode reads its inputs twice, so its fraction is bounded by one pass's bytes over
two passes' (about 0.56 for the cast and modulation, 0.53 for SwiGLU, 0.77 for the fold).

Candidates (`--configs kind=c1,c2`, defaults CANDIDATES): warps, with the suffix "f" the fp32 arithmetic instead of
the bf16x2 instructions (kernels/nvfp4.py BF16X2). The best bit-exact candidate is the record's `ms` (`best_warps`:
its name); `ms_by_warps` and `bytes_differing_by_warps` hold all of them. Writes OUT_DIR/nvfp4-producers-h200.json (the schema of tests/gpu/test_nvfp4_gpu.py's report) and exits 1
if any candidate wrote a byte that differs from the reference. Kernels are compiled first in parallel worker
processes (the Triton cache), so the run stays near a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
import multiprocessing as mp

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cuda_timing import median_ms  # noqa: E402
from h3plan.kernels import gated_residual as gr  # noqa: E402
from h3plan.kernels import modulation as mm  # noqa: E402
from h3plan.kernels import nvfp4 as n4  # noqa: E402
from h3plan.kernels import nvfp4_producers as npd  # noqa: E402
from h3plan.kernels import swiglu as sw  # noqa: E402

HIDDEN, FFN, INNER, EPS = 5376, 14336, 7168, 1e-5
STATIC = 0.004  # a static global scale (a checkpoint's input_scale), as the GPU suite's
TARGET = 0.7
OUT_BYTES = 0.5 + 1 / 16  # per element: half a byte of codes, 1/16 of a scale byte
# candidate configs per launch kind: warps, "f" for the fp32 arithmetic instead of the bf16x2 instructions (nvfp4.BF16X2)
CANDIDATES = {"modulation": ("4", "2", "8", "4f"), "fold": ("4", "2", "8", "4f"), "swiglu": ("8", "4", "8f"),
              "cast": ("4", "2", "8")}
# name, launch kind (kernels/nvfp4.py WARPS key), width, input bytes per element, extra output bytes per element
OPS = [("rmsnorm_modulate_nvfp4", "modulation", HIDDEN, 2, 0), ("gated_residual_modulate_nvfp4", "fold", HIDDEN, 4, 2),
       ("swiglu_nvfp4", "swiglu", FFN, 4, 0), ("cast_nvfp4", "cast", INNER, 2, 0)]


def ndiff(got, want) -> int:
    from test_nvfp4_gpu import ndiff as bytes_differing  # bytes of the outputs that differ (bitwise)

    return bytes_differing(got, want)


def inputs(rows: int):
    """The producers' inputs at H3 width (tests/gpu/test_nvfp4_gpu.py's, with the block's tables as strided views of
    one (rows, 6 * HIDDEN) AdaLN output and a norm weight away from 1)."""
    from test_kernels_block_gpu import TIMESTEPS, activations, index_for
    from test_nvfp4_gpu import special_blocks

    g = torch.Generator(device="cuda").manual_seed(0)
    tables = (0.3 * torch.randn(3 * TIMESTEPS, 6 * HIDDEN, device="cuda", generator=g)).bfloat16()
    shift, scale, gate = (tables[:, i * HIDDEN:(i + 1) * HIDDEN] for i in range(3))
    w = (1 + 0.1 * torch.randn(HIDDEN, device="cuda", generator=g)).bfloat16()
    h = activations((1, rows, 2 * FFN), 2)
    special_blocks(h[..., :FFN])  # the hidden half: the gate half's silu scales it
    return dict(x=special_blocks(activations((1, rows, HIDDEN), 1)), y=activations((1, rows, HIDDEN), 4), h=h,
                o=special_blocks(activations((1, rows, INNER), 3)), idx=index_for(rows), w=w, scale=scale,
                shift=shift, gate=gate)


def calls(t):
    """name -> (kernel(g), reference(g), torch chain(g)): the unfused chain the kernel replaces, for its time."""
    x, y, h, o, idx, w, scale, shift, gate = (t[k] for k in ("x", "y", "h", "o", "idx", "w", "scale", "shift", "gate"))
    return {
        "rmsnorm_modulate_nvfp4": (
            lambda g: npd.rmsnorm_modulate_nvfp4(x, w, scale, shift, idx, EPS, "exact", g),
            lambda g: npd.rmsnorm_modulate_nvfp4_ref(x, w, scale, shift, idx, EPS, "exact", g),
            lambda g: n4.cast_nvfp4_ref(mm.rmsnorm_modulate(x, w, scale, shift, idx, EPS), g)),
        "gated_residual_modulate_nvfp4": (
            lambda g: npd.gated_residual_modulate_nvfp4(x, gate, y, w, scale, shift, idx, EPS, "exact", g),
            lambda g: npd.gated_residual_modulate_nvfp4_ref(x, gate, y, w, scale, shift, idx, EPS, "exact", g),
            lambda g: n4.cast_nvfp4_ref(mm.rmsnorm_modulate(gr.gated_residual(x, gate, idx, y), w, scale, shift, idx,
                                                            EPS), g)),
        "swiglu_nvfp4": (lambda g: npd.swiglu_nvfp4(h, g), lambda g: npd.swiglu_nvfp4_ref(h, g),
                         lambda g: n4.cast_nvfp4_ref(sw.swiglu(h), g)),
        "cast_nvfp4": (lambda g: n4.cast_nvfp4(o, g), lambda g: n4.cast_nvfp4_ref(o, g),
                       lambda g: n4.cast_nvfp4_ref(o, g)),
    }


def ms(fn, reps=20):
    """Median of `reps` timed calls, each after a 256 MiB write that flushes the L2 (tests/gpu/test_nvfp4_gpu.py's)."""
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    return median_ms(fn, warmup=3, iters=reps, before=flush.zero_)


def copy_tbps() -> float:
    src = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / (ms(lambda: dst.copy_(src)) * 1e-3) / 1e12


class config:
    """A candidate in force: its warps in kernels/nvfp4.py WARPS and its arithmetic in BF16X2."""

    def __init__(self, kind: str, width: int, cand: str):
        self.key, self.warps, self.x2 = (kind, width), int(cand.rstrip("f")), not cand.endswith("f")

    def __enter__(self):
        self.planned = dict(n4.WARPS)
        n4.WARPS[self.key], n4.BF16X2 = self.warps, self.x2

    def __exit__(self, *exc):
        n4.WARPS.clear()
        n4.WARPS.update(self.planned)
        n4.BF16X2 = True


def _warm(rows: int, name: str, kind: str, width: int, cand: str) -> str:
    """Worker: compile one (op, candidate) in both modes on a few rows whose count specializes like `rows` (mod 16)."""
    fn = calls(inputs(128 + rows % 16))[name][0]
    with torch.no_grad(), config(kind, width, cand):
        fn(torch.tensor([STATIC], device="cuda"))
        fn(None)
    torch.cuda.synchronize()
    return f"{name} {cand}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default=os.environ.get("OUT"))
    p.add_argument("--rows", type=int, default=19000)
    p.add_argument("--configs", nargs="*", default=[],
                   help="kind=c1,c2,... (kinds: modulation fold swiglu cast; c: warps, 'f' suffix: no bf16x2)")
    p.add_argument("--ops", nargs="*", default=[o[0] for o in OPS])
    p.add_argument("--jobs", type=int, default=12, help="parallel compile workers (0: compile in the timed process)")
    args = p.parse_args(argv)
    cand = dict(CANDIDATES)
    for spec in args.configs:
        k, v = spec.split("=")
        cand[k] = tuple(v.split(","))
    ops = [o for o in OPS if o[0] in args.ops]
    if args.jobs:
        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as ex:
            jobs = [ex.submit(_warm, args.rows, name, kind, n, c) for name, kind, n, _i, _e in ops for c in cand[kind]]
            for j in jobs:
                print(f"[probe] compiled {j.result()}", flush=True)

    copy = copy_tbps()
    S = args.rows
    fns = calls(inputs(S))
    records, bad = [], 0
    with torch.no_grad():
        for name, kind, width, inb, extra in ops:
            kernel, ref, chain = fns[name]
            n = S * width
            for mode, g in (("static", torch.tensor([STATIC], device="cuda")), ("dynamic", None)):
                want = ref(g)
                by_warps, diff = {}, {}
                for c in cand[kind]:
                    with config(kind, width, c):
                        diff[c] = ndiff(kernel(g), want)  # asserts shapes and dtypes
                        by_warps[c] = ms(lambda: kernel(g))
                exact = {w: t for w, t in by_warps.items() if diff[w] == 0}
                bad += sum(d > 0 for d in diff.values())  # every candidate must be exact, the fastest reported
                best = min(exact or by_warps, key=(exact or by_warps).get)
                t, chain_ms = by_warps[best], ms(lambda: chain(g))
                frac = n * (inb + extra + OUT_BYTES) / (t * 1e-3) / 1e12 / copy
                records.append(dict(op=name, mode=mode, rows=S, elements=n, ms=t, best_warps=best, ms_by_warps=by_warps,
                                    bytes_differing_by_warps=diff, bit_exact=bool(exact) and len(exact) == len(diff),
                                    fraction_of_copy=frac, torch_chain_ms=chain_ms,
                                    speedup_vs_torch_chain=chain_ms / t, target=TARGET, meets_target=frac >= TARGET))
                print(f"[probe] {name} {mode}: {t:.4f} ms at {best} warps = {frac:.2f} of copy ({copy:.2f} TB/s); "
                      f"by warps {({w: round(v, 4) for w, v in by_warps.items()})}; bytes differing {diff}; "
                      f"torch chain {chain_ms:.3f} ms", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "nvfp4-producers-h200.json")
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_tbps": copy,
                       "candidates": {k: list(v) for k, v in cand.items()}, "records": records}, f, indent=1)
        print(f"[probe] wrote {path}")
    if bad:
        print(f"[probe] NOT BIT-EXACT: {bad} (op, mode, warps) candidates wrote bytes that differ from the reference")
        return 1
    print("[probe] every candidate bit-exact against the reference chain")
    return 0


if __name__ == "__main__":
    sys.exit(main())
