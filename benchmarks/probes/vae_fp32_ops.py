"""Are the VAE's fused ops bit-exact in the fp32 decode? On a GPU: vae_qk_norm_rope (both rsqrt numerics) and swiglu
on float32 inputs of the released decoder's shapes (2,053 tokens x 32 heads x 64; 2,053 x 2 x 8,192) against torch's
CUDA eager (the _ref functions, diffusers' processor expressions). Prints mismatch counts; writes JSON to argv[1]."""

import json
import sys

import torch

from h3plan.actions.bench.ops import qk_norm_rope as qm
from h3plan.actions.bench.ops import swiglu as sw
from h3plan.actions.bench.ops import vae

swiglu, swiglu_ref = sw.swiglu, sw.swiglu_ref
vae_qk_norm_rope, vae_qk_norm_rope_ref = vae.vae_qk_norm_rope, vae.vae_qk_norm_rope_ref

torch.manual_seed(0)
dev = "cuda"
B, S, H, D, R = 1, 2053, 32, 64, 48
q = (torch.randn(B, S, H, D, device=dev) * 3)
k = torch.randn(B, S, H, D, device=dev)
pos = torch.rand(B, S, 3, device=dev) * 2 - 1
inv = 1.0 / 100.0 ** torch.arange(0, 1, 6 / R, device=dev)
ang = (2.0 * torch.pi * pos[:, :, :, None] * inv).flatten(2, 3).tile(2).unsqueeze(2)
cos, sin = ang.cos(), ang.sin()
out = {}
ref = vae_qk_norm_rope_ref(q, k, cos, sin, 1e-5)
for rs in ("approx", "rn"):
    saved = dict(qm.NUMERICS)
    qm.NUMERICS["rsqrt"] = rs
    try:
        got = vae_qk_norm_rope(q, k, cos, sin, 1e-5)
    finally:
        qm.NUMERICS.clear()
        qm.NUMERICS.update(saved)
    out[f"qk_rsqrt_{rs}"] = [int((a != b).sum()) for a, b in zip(got, ref)]
# the norm alone: where does a difference start?
n_ref = torch.nn.functional.rms_norm(q, (D,), None, 1e-5)
out["norm_ref_vs_emulation"] = int((qm.emulate_cuda_rms_norm(q, None, 1e-5) != n_ref).sum())
x = torch.randn(S, 2 * 8192, device=dev) * 4
out["swiglu"] = int((swiglu(x) != swiglu_ref(x)).sum())
out["elements"] = {"qk": q.numel(), "swiglu": S * 8192}
print(json.dumps(out))
if len(sys.argv) > 1:
    open(sys.argv[1], "w").write(json.dumps(out, indent=1) + "\n")
