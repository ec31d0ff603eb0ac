"""H200 probe of the NVFP4 producers: time, fraction of copy bandwidth and bits of every producer at H3 width.

    PYTHONPATH=. python benchmarks/probes/nvfp4_producers.py [OUT_DIR] [--rows 19000] [--configs cast=r4w4c512,r1w2c0 ...]
    PYTHONPATH=. ncu --clock-control none --section SpeedOfLight ... python benchmarks/probes/nvfp4_producers.py --once

For each producer (runtime/kernels/nvfp4_producers.py rmsnorm_modulate_nvfp4, gated_residual_modulate_nvfp4,
swiglu_nvfp4; runtime/kernels/nvfp4.py cast_nvfp4) in static (a given global scale: one pass) and dynamic mode (amax
pass, then the quantize pass), at every candidate launch layout (runtime/kernels/nvfp4.py SWEEP: rows a program, warps,
chunk columns, named like r4w4c512; c0 the one-row layout's chunks; each with the next-chunk prefetch and without it,
suffix "n"), and the planned layout without the bf16x2 instructions (suffix "f"): the packed codes, swizzled
scales, g (and the fold's h') compared byte for byte with the reference chain on the GPU (`<op>_ref`: the bf16
reference, then `cast_nvfp4_ref`), on inputs holding zero, -0, tiny, saturating blocks and every e2m1 tie
(tests/gpu/test_nvfp4_gpu.py `special_blocks`), then the median time (20 launches, each after a 256 MiB read
that flushes the L2 and behind a GPU spin so the host has queued the call: the GPU's time, as inside the model's
forward; `host_bound_ms` is the best layout's time without the spin) and its fraction of copy bandwidth over the
bytes one pass must move (inputs read once, codes + scales written; the fold also writes h'). Why the spin: timed
with a flushing write and no spin (results/probes/nvfp4-producers-h200.json, nvfp4-session10/probe-*.json), the
~0.1-0.5 ms calls hold the host's dispatch and the write-back of the flush's dirty L2 lines, and the same kernels
differed by 1.6x between runs (nvfp4-session10/README.md; Nsight Compute's kernel times there). Behind a 400 us
spin (nvfp4-session11/probe-call2-*) the cast's times matched Nsight Compute's, the modulation's and the fold's
(whose host dispatch takes 0.55-0.92 ms) did not. With LEAD_US (nvfp4-session11/probe-call3-*, probe-call4-*) each
best time is within 2.5-8% of Nsight Compute's kernel time (the call's own small launches: the zero fill of the
scale buffer's padding, and g's copy). Dynamic mode reads its inputs twice, so
its fraction is bounded by one pass's bytes over two passes' (about 0.56 for the cast and modulation, 0.53 for
SwiGLU, 0.77 for the fold).

The best bit-exact candidate is the record's `ms` (`best`: its name); `ms_by_config` and
`bytes_differing_by_config` hold all of them. The last lines print the runtime/kernels/nvfp4.py TUNED table the results
select (the layout with the least static time per kind, the served mode: paste it over TUNED). Writes
OUT_DIR/nvfp4-producers-h200.json and exits 1 if any candidate wrote a byte that differs from the reference.
Kernels are compiled first in parallel worker processes (the Triton cache), so the run stays near two minutes.
"""  # noqa: E501

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
import multiprocessing as mp

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from h3plan.actions.bench import median_ms  # noqa: E402
from h3plan.actions.bench.ops import gated_residual as gr  # noqa: E402
from h3plan.actions.bench.ops import modulation as mm  # noqa: E402
from h3plan.actions.bench.ops import nvfp4 as n4  # noqa: E402
from h3plan.actions.bench.ops import nvfp4_producers as npd  # noqa: E402
from h3plan.actions.bench.ops import swiglu as sw  # noqa: E402

HIDDEN, FFN, INNER, EPS = 5376, 14336, 7168, 1e-5
STATIC = 0.004  # a static global scale (a checkpoint's input_scale), as the GPU suite's
TARGET = 0.7
LEAD_US = 1500  # the GPU spin ahead of each timed call (`ms`): longer than the host's dispatch of one producer call
# (0.55-0.92 ms for the modulation and the fold: a 400 us spin left their times host-bound,
# nvfp4-session11/probe-call2-*)
OUT_BYTES = 0.5 + 1 / 16  # per element: half a byte of codes, 1/16 of a scale byte
# name, launch kind (runtime/kernels/nvfp4.py TUNED key), width, input bytes per element, extra output bytes per element
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


def ms(fn, reps=20, host=False):
    """Median of `reps` timed calls, each after a 256 MiB read that flushes the L2 (a read leaves clean lines: a
    flushing write leaves dirty ones that the timed kernel would write back) and a GPU spin that lets the host queue
    the call first (`median_ms` lead_us): the GPU time of the call's launches, as inside the model's forward.
    host=True: no spin, so the time also holds the host's dispatch whenever that is longer than the flush (a lone
    call from Python)."""
    flush = torch.ones(64 << 20, dtype=torch.int32, device="cuda")
    return median_ms(fn, warmup=3, iters=reps, before=lambda: flush.max(), lead_us=0 if host else LEAD_US)


def copy_tbps() -> float:
    src = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / (ms(lambda: dst.copy_(src)) * 1e-3) / 1e12


def candidates(kind: str, width: int) -> list[str]:
    """runtime/kernels/nvfp4.py SWEEP's layouts for the kind with the prefetch, then without it (suffix n), then the
    planned one without the bf16x2 instructions (suffix f)."""
    names = [n4.config_name((*c, p)) for p in (True, False) for c in n4.SWEEP[kind]]
    return names + [n4.config_name(n4.launch_config(kind, width), bf16x2=False)]


def parse(name: str) -> tuple[tuple[int, int, int, bool], bool]:
    """'r4w4c512' / 'r4w4c512n' / 'r4w4c512f' -> ((rows, warps, chunk, prefetch), bf16x2)."""
    m = re.fullmatch(r"r(\d+)w(\d+)c(\d+)(n?)(f?)", name)
    if not m:
        raise SystemExit(f"nvfp4_producers.py: bad config {name!r} (want like r4w4c512, suffix n: no prefetch, "
                         "f: no bf16x2)")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), not m.group(4)), not m.group(5)


def config(kind: str, width: int, name: str):
    """A candidate in force (runtime/kernels/nvfp4.py `tuned`)."""
    layout, x2 = parse(name)
    return n4.tuned(kind, width, layout, x2)


def _warm(rows: int, name: str, kind: str, width: int, cand: str) -> str:
    """Worker: compile one (op, candidate) in both modes on a few rows whose count specializes like `rows` (mod 16)."""
    fn = calls(inputs(128 + rows % 16))[name][0]
    with torch.no_grad(), config(kind, width, cand):
        fn(torch.tensor([STATIC], device="cuda"))
        fn(None)
    torch.cuda.synchronize()
    return f"{name} {cand}"


def tuned_table(totals: dict, widths: dict) -> dict:
    """{(kind, width): (rows, warps, chunk, prefetch)}: per kind the bf16x2 layout, bit-exact in both modes, with the
    least static time (totals: [static ms, dynamic ms] per candidate). Static is the served mode (a ModelOpt
    checkpoint's input_scale: runtime/levers/nvfp4_producer_quant.py); the dynamic mode runs the same layout."""
    table = {}
    for kind, by_cfg in totals.items():
        both = {c: v[0] for c, v in by_cfg.items() if len(v) == 2 and parse(c)[1]}
        if both:
            table[(kind, widths[kind])] = parse(min(both, key=both.get))[0]
    return table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default=os.environ.get("OUT"))
    p.add_argument("--rows", type=int, default=19000)
    p.add_argument("--configs", nargs="*", default=[],
                   help="kind=c1,c2,... (kinds: modulation fold swiglu cast; c like r4w4c512, 'f' suffix: no bf16x2)")
    p.add_argument("--ops", nargs="*", default=[o[0] for o in OPS])
    p.add_argument("--jobs", type=int, default=12, help="parallel compile workers (0: compile in the timed process)")
    p.add_argument("--once", action="store_true",
                   help="each op once in each mode at its planned layout (or the first of --configs for its kind), "
                   "nothing timed: run under a profiler (ncu)")
    args = p.parse_args(argv)
    cand = {kind: candidates(kind, width) for _name, kind, width, _i, _e in OPS}
    for spec in args.configs:
        k, v = spec.split("=")
        cand[k] = v.split(",")
        for c in cand[k]:
            parse(c)  # refuses a malformed name before any GPU work
    if args.once:  # at the planned layout, or the first of --configs for the kind
        print(f"[probe] kernels from {n4.__file__}", flush=True)
        fns = calls(inputs(args.rows))
        with torch.no_grad():
            for name, kind, width, _i, _e in [o for o in OPS if o[0] in args.ops]:
                first = cand[kind][0] if any(c.startswith(kind + "=") for c in args.configs) else None
                with config(kind, width, first or n4.config_name(n4.launch_config(kind, width))):
                    for g in (torch.tensor([STATIC], device="cuda"), None):
                        fns[name][0](g)
        torch.cuda.synchronize()
        return 0
    ops = [o for o in OPS if o[0] in args.ops]
    if args.jobs:
        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as ex:
            jobs = [ex.submit(_warm, args.rows, name, kind, n, c) for name, kind, n, _i, _e in ops for c in cand[kind]]
            for j in jobs:
                print(f"[probe] compiled {j.result()}", flush=True)

    copy = copy_tbps()
    S = args.rows
    fns = calls(inputs(S))
    records, bad, totals = [], 0, {}
    with torch.no_grad():
        for name, kind, width, inb, extra in ops:
            kernel, ref, chain = fns[name]
            n = S * width
            for mode, g in (("static", torch.tensor([STATIC], device="cuda")), ("dynamic", None)):
                want = ref(g)
                by_cfg, diff = {}, {}
                for c in cand[kind]:
                    with config(kind, width, c):
                        diff[c] = ndiff(kernel(g), want)  # asserts shapes and dtypes
                        by_cfg[c] = ms(lambda: kernel(g))
                    if diff[c] == 0:
                        totals.setdefault(kind, {}).setdefault(c, []).append(by_cfg[c])
                exact = {w: t for w, t in by_cfg.items() if diff[w] == 0}
                bad += sum(d > 0 for d in diff.values())  # every candidate must be exact, the fastest reported
                best = min(exact or by_cfg, key=(exact or by_cfg).get)
                t, chain_ms = by_cfg[best], ms(lambda: chain(g))
                with config(kind, width, best):
                    host_ms = ms(lambda: kernel(g), host=True)
                one = n * (inb + extra + OUT_BYTES)  # bytes one pass must move
                frac = one / (t * 1e-3) / 1e12 / copy
                records.append(dict(op=name, mode=mode, rows=S, elements=n, bytes_one_pass=one, ms=t, best=best,
                                    planned=n4.config_name(n4.launch_config(kind, width)), ms_by_config=by_cfg,
                                    fraction_of_copy_by_config={c: one / (v * 1e-3) / 1e12 / copy
                                                                for c, v in by_cfg.items()},
                                    bytes_differing_by_config=diff, bit_exact=bool(exact) and len(exact) == len(diff),
                                    fraction_of_copy=frac, host_bound_ms=host_ms, torch_chain_ms=chain_ms,
                                    speedup_vs_torch_chain=chain_ms / t, target=TARGET, meets_target=frac >= TARGET))
                ranked = sorted(by_cfg, key=by_cfg.get)
                by_rank = {c: (round(by_cfg[c], 4), round(one / (by_cfg[c] * 1e-3) / 1e12 / copy, 2)) for c in ranked}
                print(f"[probe] {name} {mode}: {t:.4f} ms at {best} = {frac:.2f} of copy ({copy:.2f} TB/s, "
                      f"{one / 1e6:.0f} MB a pass); by config (fastest first) {by_rank}; "
                      f"bytes differing {({c: d for c, d in diff.items() if d})}; torch chain {chain_ms:.3f} ms; "
                      f"{host_ms:.4f} ms with the host's dispatch",
                      flush=True)
    table = tuned_table(totals, {kind: width for _n, kind, width, _i, _e in ops})
    print(f"[probe] selected (least static ms, bit-exact in both modes, bf16x2): TUNED = {table}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "nvfp4-producers-h200.json")
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_tbps": copy,
                       "candidates": {k: list(v) for k, v in cand.items()}, "records": records,
                       "selected_tuned": {f"{k[0]},{k[1]}": list(v) for k, v in table.items()}}, f, indent=1)
        print(f"[probe] wrote {path}")
    if bad:
        print(f"[probe] NOT BIT-EXACT: {bad} (op, mode, config) candidates wrote bytes that differ from the reference")
        return 1
    print("[probe] every candidate bit-exact against the reference chain")
    return 0


if __name__ == "__main__":
    sys.exit(main())
