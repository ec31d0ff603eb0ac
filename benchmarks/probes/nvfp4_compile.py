"""Offline GPU compile of every NVFP4 kernel variant at H3 widths (no GPU needed): registers and spills per variant.

    python benchmarks/probes/nvfp4_compile.py [OUT_DIR] [--arch 90 100] [--sweep]

Compiles runtime/kernels/nvfp4.py's cast and runtime/kernels/nvfp4_producers.py's modulation (exact / fp32, with and
without the residual fold; static quantize pass, dynamic amax and quantize passes) and SwiGLU kernels through Triton to
cubin for each arch with triton's own ptxas, at the planned launch layout (runtime/kernels/nvfp4.py TUNED) or, with
--sweep, at every SWEEP layout, and prints `ptxas --verbose`'s registers and spill bytes and the SASS
thread-instructions per row element (`sass_counts`; where LLVM unrolls a chunk loop, the amax passes', it
over-counts). Exit 1 if any variant fails to compile. With OUT_DIR it writes nvfp4-compile.json there. Must run without
TRITON_INTERPRET (the interpreter replaces the jit functions).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("nvfp4_compile.py: unset TRITON_INTERPRET (the interpreter replaces the jit functions)")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia import compiler as nv  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from h3plan.actions.bench.ops import nvfp4 as n4  # noqa: E402
from h3plan.actions.bench.ops import nvfp4_producers as npd  # noqa: E402
from h3plan.actions.bench.ops import rmsnorm  # noqa: E402

VEC, cuda_rms_iters = rmsnorm.VEC, rmsnorm.cuda_rms_iters

HIDDEN, INNER, FFN = 5376, 7168, 14336
OUTS = {"packed_ptr": "*u8", "sf_ptr": "*u8", "amax_ptr": "*fp32", "g_ptr": "*fp32", "rstd_ptr": "*fp32", "M": "i32",
        "n_col_tiles": "i32"}
TYPES = {"x_ptr": "*bf16", "xw_ptr": "*i32", "w_ptr": "*i32", "scale_ptr": "*i32", "shift_ptr": "*i32",
         "idx_ptr": "*i64", "h_ptr": "*i32", "gate_ptr": "*i32", "y_ptr": "*i32", "S": "i32", "scale_stride": "i32",
         "shift_stride": "i32", "gate_stride": "i32", "eps": "fp32", **OUTS}


def variants(configs=None):
    """(name, jit function, constexprs, warps, row width) for every launch the public functions make at H3 widths:
    at runtime/kernels/nvfp4.py's planned layout (TUNED), or at every SWEEP candidate (configs="sweep")."""
    def layouts(kind, n):
        for cfg in (n4.SWEEP[kind] if configs == "sweep" else [n4.launch_config(kind, n)]):
            with n4.tuned(kind, n, cfg):
                _rows, opts = n4.launch_opts(kind, n)
            opts.pop("enable_fp_fusion")
            yield n4.config_name(cfg), opts.pop("num_warps"), opts

    for cfg, warps, opts in layouts("cast", INNER):
        for amax in (False, True):
            yield (f"cast_nvfp4 N={INNER} {cfg} {'amax' if amax else 'quantize'}", n4._cast_kernel,
                   dict(N=INNER, KIND=0, AMAX_ONLY=amax, HW=True, **opts), warps, INNER)
    for fold in (False, True):
        for cfg, warps, opts in layouts("fold" if fold else "modulation", HIDDEN):
            for mode in ("exact", "fp32"):
                # static: one quantize pass (RSTD 0, the fold in it); dynamic: the amax pass (the fold, RSTD 1),
                # then the quantize pass (RSTD 2)
                for amax, rstd in ((False, 0), (True, 1), (False, 2)):
                    yield (f"modulate_nvfp4 {mode}{' fold' if fold else ''} {cfg} "
                           f"{'amax' if amax else 'quantize'}{' static' if rstd == 0 else ''}",
                           npd._modulate_nvfp4_kernel,
                           dict(N=HIDDEN, HAS_W=True, EXACT=mode == "exact", AMAX_ONLY=amax, FOLD=fold and rstd < 2,
                                RSTD=rstd, NITER=cuda_rms_iters(triton.cdiv(HIDDEN, VEC) * VEC), KIND=0,
                                X2=n4.BF16X2, IEEE_RSQRT=False, HW=True, **opts), warps, HIDDEN)
    for cfg, warps, opts in layouts("swiglu", FFN):
        for amax in (False, True):
            yield (f"swiglu_nvfp4 F={FFN} {cfg} {'amax' if amax else 'quantize'}", npd._swiglu_nvfp4_kernel,
                   dict(F=FFN, KIND=0, X2=n4.BF16X2, AMAX_ONLY=amax, IS_BF16=True, HW=True, LIBDEVICE_EXP=False,
                        **opts), warps, FFN)


def compile_one(fn, consts, warps, arch, n):
    params = list(inspect.signature(fn.fn).parameters)
    types = dict(TYPES, x_ptr="*bf16" if fn is npd._modulate_nvfp4_kernel else "*i32")  # the others read words only
    sig = {p: ("constexpr" if p in consts else types[p]) for p in params}
    # what the launch's specialization tells the compiler: 16-byte aligned tensors, row strides of H3 widths
    aligned = [(i,) for i, p in enumerate(params)
               if p not in consts and (sig[p].startswith("*") or p.endswith("_stride"))]
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs={k: [["tt.divisibility", 16]] for k in aligned})
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps, "enable_fp_fusion": False})
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    ptxas = nv.get_ptxas(arch)
    ptxas = getattr(ptxas, "path", ptxas)
    sm = f"sm_{arch}a"
    cubin = f.name[:-4] + ".cubin"
    out = subprocess.run([ptxas, f"-arch={sm}", "--verbose", f.name, "-o", cubin], capture_output=True, text=True)
    os.unlink(f.name)
    text = out.stdout + out.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    r = dict(registers=int(regs.group(1)) if regs else None, spill_stores=int(spill.group(1)) if spill else None,
             spill_loads=int(spill.group(2)) if spill else None, shared=k.metadata.shared)
    r.update(sass_counts(cubin, os.path.dirname(ptxas), warps * 32 / (consts["ROWS"] * n), consts["NFULL"]))
    return r


def sass_counts(cubin: str, bindir: str, threads_per_element: float, trips: int) -> dict:
    """SASS instructions of the kernel, and thread-instructions issued per row element: instructions x threads /
    elements a program owns, each loop's body (a backward branch's span: the launches' chunk loops) counted `trips`
    times (the loop's trip count, NFULL). The ALU cost the H200's issue rate must cover; an upper bound where a
    forward branch (the division's slow path) is not taken."""
    nvdisasm = os.path.join(bindir, "nvdisasm")
    if not os.path.exists(cubin):
        return {}
    dis = subprocess.run([nvdisasm, cubin], capture_output=True, text=True).stdout if os.path.exists(nvdisasm) else ""
    os.unlink(cubin)
    if not dis:
        return {}
    n, labels, issued = 0, {}, 0
    for line in dis.splitlines():
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = n
        elif re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?[A-Z]", line):
            n += 1
            back = re.search(r"BRA\W.*?(\.L_x_\d+)", line)
            if back and back.group(1) in labels and n - labels[back.group(1)] > 1:  # a loop (not the trap's
                # branch to itself after EXIT): its body again for each further trip
                issued += (n - labels[back.group(1)]) * max(trips - 1, 0)
    return dict(sass_instructions=n, thread_instructions_per_element=round((n + issued) * threads_per_element, 1))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?")
    p.add_argument("--arch", type=int, nargs="+", default=[90, 100])
    p.add_argument("--sweep", action="store_true", help="every runtime/kernels/nvfp4.py SWEEP candidate, not the "
                                                        "planned one")
    args = p.parse_args(argv)
    records, failed = [], 0
    for arch in args.arch:
        for name, fn, consts, warps, n in variants("sweep" if args.sweep else None):
            try:
                r = dict(kernel=name, arch=arch, warps=warps, **compile_one(fn, consts, warps, arch, n))
            except Exception as exc:  # report every failing variant, then exit 1
                r = dict(kernel=name, arch=arch, warps=warps, error=f"{type(exc).__name__}: {exc}"[:500])
                failed += 1
            records.append(r)
            print(json.dumps(r), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "nvfp4-compile.json"), "w") as f:
            json.dump(records, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
