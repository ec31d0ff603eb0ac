"""Kernel benchmark driver: every fused kernel against its eager reference, at MiniMax-H3 shapes.

    python benchmarks/fused_kernels.py            # H200: all cases -> benchmarks/results/kernels-h200.{json,md}
    python benchmarks/fused_kernels.py --only swiglu --out /tmp/r
    python benchmarks/fused_kernels.py --sweep    # also time each case's tuning variants -> kernels-h200-sweep.*
    python benchmarks/fused_kernels.py --smoke    # CPU, Triton interpreter, tiny shapes (a sanity run, no timing value)

Cases come from every module in benchmarks/cases/: each exposes `CASES` (H3 shapes), optionally
`SMOKE_CASES` (tiny shapes for --smoke) and `sweep_cases()` (the cases with tuning variants). A case is a
`benchmarks.cases.Case` or a dict with the same keys:

    kernel       str    name in the table
    shape        str    the shape that sets the work, as printed
    dtype        str    storage dtype
    make         fn(device) -> inputs (seeded)
    fused        fn(inputs) -> output of the kernel
    eager        fn(inputs) -> output of the eager reference
    bytes        int    fewest bytes the fused kernel must move (inputs read once, outputs written once)
    eager_bytes  int    bytes the eager sequence moves, its intermediates included
    exact        fn(out_fused, out_eager) -> bool, bit-identical
    note         str    optional, one line for the table
    variants     dict label -> fn(inputs), optional, timed only with --sweep

Timing (GPU): CUDA events around each call, median of --reps calls after --warmup calls, with a 256 MiB
buffer zeroed before every call so nothing is served from L2 (the H3 tensors are far larger than L2
anyway). Copy bandwidth is measured in the same run: a 2 GiB device-to-device copy, read + write bytes
over its median time. achieved_TBps = bytes / fused time; fraction_of_copy = achieved / copy.
Output: a JSON list of records {kernel, shape, dtype, eager_ms, fused_ms, bytes, eager_bytes,
achieved_TBps, copy_TBps, fraction_of_copy, bit_exact, speedup, note} and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="directory for the JSON and markdown")
    p.add_argument("--name", default=None, help="file stem (default kernels-h200, kernels-h200-sweep, kernels-smoke)")
    p.add_argument("--only", default=None, help="run only cases whose kernel name contains this")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    p.add_argument("--sweep", action="store_true", help="also time every case's tuning variants")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    return p.parse_args(argv)


def load_cases(smoke: bool, sweep: bool):
    import benchmarks.cases as pkg
    from benchmarks.cases import as_case

    out = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        try:
            m = importlib.import_module(f"benchmarks.cases.{info.name}")
        except Exception as e:  # e.g. a GPU-only dependency: fatal on the GPU, skipped in --smoke
            if not smoke:
                raise
            print(f"[bench] {info.name}: import failed ({type(e).__name__}: {e}), skipped in --smoke")
            continue
        if smoke:
            cs = getattr(m, "SMOKE_CASES", None)
            if cs is None:
                print(f"[bench] {info.name}: no SMOKE_CASES, skipped in --smoke")
                continue
        elif sweep and hasattr(m, "sweep_cases"):
            cs = m.sweep_cases()
        else:
            cs = m.CASES
        out += [as_case(c) for c in cs]
    return out


def make_timer(cuda: bool, reps: int, warmup: int):
    """fn -> median ms (h3plan.actions.bench's timer): on the GPU `reps` calls back to back after `warmup`, a 256 MiB
    buffer zeroed before each to flush L2; on the CPU (--smoke) one host-clock call."""
    import torch

    from h3plan.actions.bench import Clock, median_ms

    if not cuda:
        clock = Clock(torch, torch.device("cpu"))
        return lambda f: median_ms(f, 0, 1, clock=clock)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    return lambda f: median_ms(f, warmup, reps, before=flush.zero_)


def copy_bandwidth(device, timer, nbytes):
    """TB/s of a device-to-device copy of nbytes (read + write)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3) / 1e12


def run_case(c, device, timer, copy_tbps, sweep):
    inputs = c.make(device)
    out_f, out_e = c.fused(inputs), c.eager(inputs)
    records = [_record(c, c.kernel, c.exact(out_f, out_e), timer(lambda: c.fused(inputs)),
                       timer(lambda: c.eager(inputs)), copy_tbps)]
    del out_f
    if sweep:
        for label, fn in c.variants.items():
            try:
                ok = c.exact(fn(inputs), out_e)
                records.append(_record(c, f"{c.kernel}[{label}]", ok, timer(lambda: fn(inputs)),
                                       records[0]["eager_ms"], copy_tbps))
            except Exception as e:  # a variant that does not compile is reported, not fatal
                print(f"[bench] {c.kernel}[{label}]: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    return records


def _record(c, kernel, bit_exact, fused_ms, eager_ms, copy_tbps):
    achieved = c.bytes / (fused_ms * 1e-3) / 1e12
    return {"kernel": kernel, "shape": c.shape, "dtype": c.dtype, "eager_ms": round(eager_ms, 4),
            "fused_ms": round(fused_ms, 4), "bytes": int(c.bytes), "eager_bytes": int(c.eager_bytes),
            "achieved_TBps": round(achieved, 3), "copy_TBps": round(copy_tbps, 3),
            "fraction_of_copy": round(achieved / copy_tbps, 3), "bit_exact": bool(bit_exact),
            "speedup": round(eager_ms / fused_ms, 2), "note": c.note}


def write(records, out_dir, name, header):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(records, indent=1) + "\n")
    cols = ["kernel", "shape", "dtype", "eager_ms", "fused_ms", "speedup", "bytes", "eager_bytes",
            "achieved_TBps", "fraction_of_copy", "bit_exact", "note"]
    lines = [f"# {name}", "", header, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in records:
        lines.append("| " + " | ".join(str(r[k]) for k in cols) + " |")
    lines += ["", "bytes: fewest bytes the fused kernel must move; eager_bytes: what the eager sequence moves, "
              "intermediates included; fraction_of_copy = (bytes / fused time) / copy bandwidth of the same run."]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    return out / f"{name}.json"


def main(argv=None):
    a = _args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import torch

    cuda = torch.cuda.is_available() and not a.smoke
    if not cuda:
        if not a.smoke:
            raise SystemExit("no CUDA device: run with --smoke for a CPU sanity run")
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels import triton
    device = "cuda" if cuda else "cpu"
    timer = make_timer(cuda, a.reps, a.warmup)
    copy_tbps = copy_bandwidth(device, timer, (2 << 30) if cuda else (1 << 20))
    name = a.name or ("kernels-smoke" if a.smoke else "kernels-h200-sweep" if a.sweep else "kernels-h200")
    records = []
    for c in load_cases(a.smoke, a.sweep):
        if a.only and a.only not in c.kernel:
            continue
        for r in run_case(c, device, timer, copy_tbps, a.sweep):
            print(f"[bench] {r['kernel']:<44} {r['shape']:<16} eager {r['eager_ms']:9.4f} ms  fused "
                  f"{r['fused_ms']:9.4f} ms  {r['achieved_TBps']:6.3f} TB/s = {r['fraction_of_copy']:.3f} of copy  "
                  f"exact={r['bit_exact']}", flush=True)
            records.append(r)
        if cuda:
            torch.cuda.empty_cache()
    dev = torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter; timings meaningless)"
    import triton

    header = (f"device: {dev}; torch {torch.__version__}; triton {triton.__version__}; "
              f"copy bandwidth {copy_tbps:.3f} TB/s; median of {a.reps if cuda else 1} calls")
    path = write(records, a.out, name, header)
    print(f"[bench] wrote {path} and {path.with_suffix('.md')}")
    return records


if __name__ == "__main__":
    main()
