"""Probe (H200): do the block's BF16 GEMMs give the same bits, and the same speed, through torch's
cuBLASLt path (torch.backends.cuda.preferred_blas_library("cublaslt")) as through its default? A lossless
plan may only use a GEMM path that keeps eager's bits. Shapes: the H3 block's linears at S = 37,820."""
import torch
import torch.nn.functional as F
from _cuda_timing import median_ms

S = 37820
SHAPES = {"to_q/k/v": (5376, 7168), "to_out": (7168, 5376), "ff.proj": (5376, 28672), "ff.out": (14336, 5376)}


g = torch.Generator(device="cuda").manual_seed(0)
default = torch.backends.cuda.preferred_blas_library()
print("default blas library:", default)
for name, (k, n) in SHAPES.items():
    x = torch.randn(1, S, k, device="cuda", generator=g, dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).bfloat16()
    b = torch.randn(n, device="cuda", generator=g).bfloat16()
    res = {}
    for lib in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(lib)
        y = F.linear(x, w, b)
        ms = median_ms(lambda: F.linear(x, w, b))
        res[lib] = (y, ms)
    torch.backends.cuda.preferred_blas_library(default)
    same = torch.equal(res["cublas"][0], res["cublaslt"][0])
    print(f"{name:10s} {S}x{k} @ {k}x{n}: cublas {res['cublas'][1]:.3f} ms, cublaslt {res['cublaslt'][1]:.3f} ms "
          f"({res['cublas'][1] / res['cublaslt'][1]:.3f}x), bitwise equal {same}", flush=True)
    del x, w, b, res
