"""H200 probe: does the NVFP4 SwiGLU's time depend on how large its gates are? (session 11, issue 23)

    PYTHONPATH=. python benchmarks/probes/swiglu_gate_range.py [OUT_DIR]

nvfp4_producers.py feeds SwiGLU rows scaled by 2^k, k in [-4, 7] (tests/gpu/test_kernels_block_gpu.py
`activations`): gates down to about -500, where exp(-g) overflows and 1 + exp(-g) leaves the fast path of the IEEE
division (Nsight Compute saw 26.5 of 32 threads active a warp instruction). This times the planned SwiGLU kernel,
static pass, on that input and on the same normals with k in [-4, 3] (|gate| < ~40: no overflow), interleaved, GPU
time as nvfp4_producers.py `ms` takes it, and checks both bit-exact against the reference chain. Writes
OUT_DIR/swiglu-gate-range-h200.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nvfp4_producers as P  # noqa: E402
from h3plan.runtime.kernels import nvfp4_producers as npd  # noqa: E402


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT")
    S = 19000
    gs = torch.tensor([P.STATIC], device="cuda")
    from test_kernels_block_gpu import activations  # nvfp4_producers.py puts tests/gpu on the path

    shape = (1, S, 2 * P.FFN)
    inputs = {"k<=7 (the probe's)": activations(shape, 2), "k<=3": activations(shape, 2, kmax=3)}
    rec, bad = {}, 0
    with torch.no_grad():
        for name, h in inputs.items():
            bad += P.ndiff(npd.swiglu_nvfp4(h, gs), npd.swiglu_nvfp4_ref(h, gs))
        for rnd in range(3):  # interleaved rounds
            for name, h in inputs.items():
                rec.setdefault(name, []).append(P.ms(lambda: npd.swiglu_nvfp4(h, gs)))
    one = S * P.FFN * (4 + P.OUT_BYTES)
    copy = P.copy_tbps()
    res = {name: {"ms": min(v), "ms_rounds": v, "fraction_of_copy": one / (min(v) * 1e-3) / 1e12 / copy,
                  "gate_min": float(inputs[name][..., P.FFN:].min())} for name, v in rec.items()}
    for name, r in res.items():
        print(f"[swiglu] {name}: {r['ms']:.4f} ms = {r['fraction_of_copy']:.3f} of copy ({copy:.2f} TB/s); "
              f"rounds {[round(t, 4) for t in r['ms_rounds']]}; gate min {r['gate_min']:.0f}")
    print(f"[swiglu] bytes differing from the reference: {bad}")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "swiglu-gate-range-h200.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_tbps": copy, "rows": S, "records": res,
                       "bytes_differing": bad}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
