"""Probe (one H200): do the fp8 plan's two hardware paths keep their bits when Ulysses splits the work,
given the same scales? (What tests/gpu/test_install_ulysses_nccl.py needs for fp8 plans at degree U.)

1. torch._scaled_mm, rowwise scales (the FP8 linears), at S rows against its row shards for U = 2, 4
   and a ragged S (19,001 over 2 and 4), for the block's four GEMM shapes.
2. cuDNN FP8 attention (h3plan's cudnn_fp8 backend) on 56 heads against the same call on head shards
   of 28 and 14 heads (the per-rank heads at degree 2 and 4), same codes and descales.
"""
import json
import os
import sys

import torch

from h3plan.facts.attention import get_backend
from h3plan.facts.sizes import shard_len

E4M3 = torch.float8_e4m3fn
OUT = sys.argv[1] if len(sys.argv) > 1 else "."
SHAPES = {"to_q/k/v": (5376, 7168), "to_out": (7168, 5376), "ff.proj": (5376, 28672), "ff.out": (14336, 5376)}


def bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.uint8)


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "gemm": [], "attention": []}
    for name, (k, n) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5)
        ws = w.abs().amax(dim=1) / 448.0
        w8, sb = (w / ws[:, None]).to(E4M3), ws.view(1, -1).contiguous()
        for S in (37820, 19001):
            x = torch.randn(S, k, device="cuda", generator=g).to(torch.bfloat16)
            s = 448.0 / x.abs().amax().float()
            x8 = (x.float() * s).clamp(-448, 448).to(E4M3)
            sa = (1.0 / s).expand(S, 1).contiguous()
            full = torch._scaled_mm(x8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
            for U in (2, 4):
                L = shard_len(S, U)
                rec = {"gemm": name, "S": S, "U": U, "bitwise": True}
                for r in range(U):
                    a, b = r * L, min(S, (r + 1) * L)
                    try:  # fresh allocations, like a rank's own activations
                        part = torch._scaled_mm(x8[a:b].clone(), w8.t(), scale_a=sa[a:b].clone(), scale_b=sb,
                                                out_dtype=torch.bfloat16)
                        rec["bitwise"] &= bool(torch.equal(bits(part), bits(full[a:b])))
                    except RuntimeError as exc:
                        rec["bitwise"] = None
                        rec.setdefault("errors", []).append(f"rows {b - a}: {str(exc)[:160]}")
                res["gemm"].append(rec)
                print("gemm", rec, flush=True)
            del x, x8, full
        del w, w8
    be = get_backend("cudnn_fp8")
    for S in (37820, 19001):
        q, k, v = (torch.randn(1, S, 56, 128, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
        sc = [448.0 / t.abs().amax().float() for t in (q, k, v)]
        q8, k8, v8 = ((t.float() * s).to(E4M3) for t, s in zip((q, k, v), sc))
        d = torch.stack([1.0 / s for s in sc]).float()
        why = be.unavailable_reason(q8, k8, v8)
        if why:
            res["attention"].append({"S": S, "error": why})
            continue
        full = be(q8, k8, v8, descales=d)
        for H in (28, 14):
            same = True
            for h0 in range(0, 56, H):
                sl = [t[:, :, h0:h0 + H].contiguous() for t in (q8, k8, v8)]
                part = be(*sl, descales=d)
                same &= bool(torch.equal(bits(part), bits(full[:, :, h0:h0 + H])))
            res["attention"].append({"S": S, "heads_per_call": H, "bitwise": same})
            print("attention", res["attention"][-1], flush=True)
    with open(os.path.join(OUT, "fp8-splits-h200.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
