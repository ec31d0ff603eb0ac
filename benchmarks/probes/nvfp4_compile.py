"""Offline GPU compile of every NVFP4 kernel variant at H3 widths (no GPU needed): registers and spills per variant.

    python benchmarks/probes/nvfp4_compile.py [OUT_DIR] [--arch 90 100]

Compiles kernels/nvfp4.py's cast and kernels/nvfp4_producers.py's modulation (exact / fp32, with and without
the residual fold, amax pass and quantize pass) and SwiGLU kernels through Triton to cubin for each arch with
triton's own ptxas, and prints `ptxas --verbose`'s registers and spill bytes. Exit 1 if any variant fails to
compile. With OUT_DIR it writes nvfp4-compile.json there. Must run without TRITON_INTERPRET (the interpreter
replaces the jit functions).
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

from h3plan.kernels import nvfp4 as n4  # noqa: E402
from h3plan.kernels import nvfp4_producers as npd  # noqa: E402
from h3plan.kernels._rmsnorm import VEC, cuda_rms_iters  # noqa: E402
from h3plan.kernels.nvfp4 import group_chunks as chunks  # noqa: E402  (the launches' chunks)

HIDDEN, INNER, FFN = 5376, 7168, 14336
OUTS = {"packed_ptr": "*u8", "sf_ptr": "*u8", "amax_ptr": "*fp32", "g_ptr": "*fp32", "n_col_tiles": "i32"}
TYPES = {"x_ptr": "*bf16", "xw_ptr": "*i32", "w_ptr": "*i32", "scale_ptr": "*i32", "shift_ptr": "*i32",
         "idx_ptr": "*i64", "h_ptr": "*i32", "gate_ptr": "*i32", "y_ptr": "*i32", "S": "i32", "scale_stride": "i32",
         "shift_stride": "i32", "gate_stride": "i32", "eps": "fp32", **OUTS}


def warps(kind: str, n: int) -> int:
    return n4.launch_opts(kind, n)["num_warps"]


def variants():
    """(name, jit function, constexprs, warps) for every launch the public functions make at H3 widths."""
    w = chunks(INNER)
    for amax in (False, True):
        yield (f"cast_nvfp4 N={INNER} {'amax' if amax else 'quantize'}", n4._cast_kernel,
               dict(N=INNER, W0=w[0], W1=w[1], W2=w[2], W3=w[3], KIND=0, AMAX_ONLY=amax, HW=True), warps("cast", INNER))
    w = chunks(HIDDEN)
    for mode in ("exact", "fp32"):
        for fold in (False, True):
            for amax in (False, True):
                yield (f"modulate_nvfp4 {mode}{' fold' if fold else ''} {'amax' if amax else 'quantize'}",
                       npd._modulate_nvfp4_kernel,
                       dict(N=HIDDEN, HAS_W=True, EXACT=mode == "exact", AMAX_ONLY=amax, FOLD=fold,
                            NITER=cuda_rms_iters(triton.cdiv(HIDDEN, VEC) * VEC), W0=w[0], W1=w[1], W2=w[2], W3=w[3],
                            KIND=0, X2=n4.BF16X2, IEEE_RSQRT=False, HW=True),
                       warps("fold" if fold else "modulation", HIDDEN))
    w = chunks(FFN)
    for amax in (False, True):
        yield (f"swiglu_nvfp4 F={FFN} {'amax' if amax else 'quantize'}", npd._swiglu_nvfp4_kernel,
               dict(F=FFN, W0=w[0], W1=w[1], W2=w[2], W3=w[3], KIND=0, X2=n4.BF16X2, AMAX_ONLY=amax, IS_BF16=True,
                    HW=True, LIBDEVICE_EXP=False), warps("swiglu", FFN))


def compile_one(fn, consts, warps, arch):
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
    out = subprocess.run([ptxas, f"-arch={sm}", "--verbose", f.name, "-o", os.devnull], capture_output=True, text=True)
    os.unlink(f.name)
    text = out.stdout + out.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return dict(registers=int(regs.group(1)) if regs else None, spill_stores=int(spill.group(1)) if spill else None,
                spill_loads=int(spill.group(2)) if spill else None, shared=k.metadata.shared)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?")
    p.add_argument("--arch", type=int, nargs="+", default=[90, 100])
    args = p.parse_args(argv)
    records, failed = [], 0
    for arch in args.arch:
        for name, fn, consts, warps in variants():
            try:
                r = dict(kernel=name, arch=arch, warps=warps, **compile_one(fn, consts, warps, arch))
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
