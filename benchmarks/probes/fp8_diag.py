"""Probe (H200): where do qk_norm_rope_fp8's e4m3 codes differ from the torch reference on the GPU?
Prints per-tensor mismatch counts and a few examples with the fp32 value before the cast, the kernel's
code, torch-CUDA's code and torch-CPU's code for the same fp32 value."""
import torch

import h3plan.runtime.kernels.qk_norm_rope as m

torch.manual_seed(0)
S, H, D = 4096, 56, 128
q, k, v = (torch.randn(1, S, H * D, device="cuda").bfloat16() for _ in range(3))
wq = (1 + 0.1 * torch.randn(D, device="cuda")).bfloat16()
wk = (1 + 0.1 * torch.randn(D, device="cuda")).bfloat16()
pos = torch.stack([torch.arange(S) // 256, (torch.arange(S) // 16) % 16, torch.arange(S) % 16], -1).float().cuda()
inv = 1.0 / (10000 ** (torch.arange(0, 32, 2, device="cuda").float() / 32))
f = (pos[:, :, None] * inv).flatten(1)
f = torch.cat([f, f], -1)
cos, sin = f.cos(), f.sin()
for label, kw in (("dynamic", {}), ("static", dict(scales=[60.0, 40.0, 0.01]))):
    got = m.qk_norm_rope_fp8(q, k, v, wq, wk, cos, sin, 1e-5, **kw)
    ref = m.qk_norm_rope_fp8_ref(q, k, v, wq, wk, cos, sin, 1e-5, **kw)
    qo, ko, vo = m.qk_norm_rope_ref(q, k, wq, wk, cos, sin, 1e-5, v=v)
    print(label, "descales kernel", got[3].tolist(), "ref", ref[3].tolist())
    for name, g, r, x, i in zip("qkv", got[:3], ref[:3], (qo, ko, vo), range(3)):
        bad = (g.view(torch.uint8) != r.view(torch.uint8)).flatten().nonzero().flatten()
        print(f"  {label} {name}: {bad.numel()} of {g.numel()} differ")
        if bad.numel():
            sc = 1.0 / ref[3][i]
            xs = x.flatten()[bad[:6]].float()
            z = (xs * sc).clamp(-448, 448)
            print("    x*scale      ", z.tolist())
            print("    kernel code  ", g.flatten()[bad[:6]].float().tolist())
            print("    torch cuda   ", z.to(torch.float8_e4m3fn).float().tolist())
            print("    torch cpu    ", z.cpu().to(torch.float8_e4m3fn).float().tolist())
            print("    ref code     ", r.flatten()[bad[:6]].float().tolist())
