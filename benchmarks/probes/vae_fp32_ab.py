"""The fp32 decode (diffusers' default) with and without each fused op, interleaved on one GPU: which of the
plan's exact fp32 routes is no slower than no plan. Latent [1, 24, 4, 48, 84] (28 decoder calls); writes JSON to
argv[1]."""

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import h3plan  # noqa: E402
from h3plan import install, uninstall  # noqa: E402
from h3plan.actions.bench import Clock, roles  # noqa: E402
from h3plan.actions.bench.ops import swiglu as ksw  # noqa: E402

spec = __import__("importlib.util").util.spec_from_file_location("bv", Path(__file__).resolve().parents[1] / "vae.py")
bv = __import__("importlib.util").util.module_from_spec(spec)
spec.loader.exec_module(bv)
vae = bv.build_vae(bv.vae_config("h3"), device="cuda", seed=0)
z = torch.randn(1, 24, 4, 48, 84, generator=torch.Generator().manual_seed(1)).cuda()
VARIANTS = {"eager": None, "graphs": {f"levers.{roles.VAE_OPS}": "eager"}, "graphs+residual": {},
            "graphs+residual+swiglu": {}}


def plan_of(name):
    return h3plan.resolve_config(hardware="sm90", recipe="bf16", **VARIANTS[name])


def decode():
    with torch.no_grad():
        torch.cuda.synchronize()
        return Clock().timed(lambda: vae.decode(z).sample)


times = {k: [] for k in VARIANTS}
ref = None
for rnd in range(3):
    for name in (list(VARIANTS) if rnd % 2 == 0 else list(VARIANTS)[::-1]):
        ksw.VAE_DTYPES = ksw.DTYPES + ((torch.float32,) if name.endswith("swiglu") else ())
        if VARIANTS[name] is not None:
            install(vae, plan_of(name))
        if rnd == 0:
            decode()
        ms, out = decode()
        uninstall(vae)
        ref = out if ref is None else ref
        times[name].append(ms)
        assert torch.equal(out, ref), name
res = {k: {"median_ms": statistics.median(v), "runs_ms": v} for k, v in times.items()}
for k, v in res.items():
    v["vs_eager"] = res["eager"]["median_ms"] / v["median_ms"]
print(json.dumps(res))
if len(sys.argv) > 1:
    Path(sys.argv[1]).write_text(json.dumps(res, indent=1) + "\n")
