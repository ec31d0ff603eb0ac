"""vae_parallel over NCCL (>= 2 GPUs): one AutoencoderKLMiniMaxH3 decode at the released config (36 decoder
blocks, dim 2048; seeded fp32 weights, broadcast from rank 0) spread over the ranks, FP16 autocast, no_grad,
against the one-GPU diffusers decode on the same rank.

Contract: rtol=0, atol=0. Every decoder call is the one-GPU call on the same input (same kernels on the
same GPU model), the gather moves bytes, and the stitching is diffusers' own `_decode`. With the plan's
VAE levers (vae_ops fused + vae_graphs on, bitwise eager by tests/gpu/test_install_vae_gpu.py) too.
Latents are small so the check is quick: [1, 24, 4, 24, 42] is one chunk of 2 x 4 tiles, [1, 24, 12, 24, 42]
two chunks (16 work items; the second chunk's frames cross-fade into the first).

    torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_vae_parallel_nccl.py -q -s -p no:cacheprovider

or plainly with pytest, which spawns one process per GPU (two here, at most four).
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
from nccl_launch import N_GPU, NEEDS_2_GPUS, run_check, torchrun_world
from scripts import load_script

pytestmark = [pytest.mark.gpu, NEEDS_2_GPUS]
LATENTS = {"one-chunk": (1, 24, 4, 24, 42), "two-chunks": (1, 24, 12, 24, 42)}
PLANS = {"diffusers-ops": None, "plan-fused-graphs": "hardware=sm90 recipe=bf16 levers.vae_ops=fused "
                                                     "levers.vae_graphs=on"}
CASES = {f"{lat}-{plan}": (lat, spec) for lat in LATENTS for plan, spec in PLANS.items()}


def _bench():
    return load_script("benchmarks/vae.py")


def check_case(name):
    from h3plan.install import counters, fallback_reasons, install, reset_counters, uninstall
    from h3plan.install.vae.parallel import LEVER, REPLAY, install_parallel

    lat, plan_spec = CASES[name]
    bench = _bench()
    rank, world = dist.get_rank(), dist.get_world_size()
    vae = bench.build_vae(bench.vae_config("h3"), device="cuda", seed=0)
    for t in (*vae.parameters(), *vae.buffers()):
        dist.broadcast(t.data, 0)  # the same weights on every rank, whatever each rank's RNG did
    z = torch.randn(LATENTS[lat], generator=torch.Generator().manual_seed(1)).cuda()
    run = bench.Decoder(vae, z)
    ref = run()  # diffusers alone, this GPU
    if plan_spec:
        install(vae, bench.resolve_plan(plan_spec, "h3"))
    undo = install_parallel(vae, dist.group.WORLD)
    try:
        run()  # warm-up (vae_graphs captures here)
        reset_counters()
        out = run()
        c, why = counters(), fallback_reasons()
        last = vae.__dict__["_decode"].last
    finally:
        undo()
        uninstall(vae)
    gathered = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(gathered, out.contiguous())
    same = torch.equal(out, ref)
    same_ranks = all(torch.equal(g, gathered[0]) for g in gathered)
    print(f"[vae-parallel] rank {rank}/{world} {name}: {last['items']} items, shares {last['shares']}, gather "
          f"buffer {last['buffer_bytes'] / 2**20:.0f} MiB; bitwise vs one GPU {same}, ranks agree {same_ranks}; "
          f"counters {c} {why or ''}", flush=True)
    assert c[f"{LEVER}.fused"] == 1 and c[f"{REPLAY}.fused"] == last["items"], (c, why)
    assert not {k for k in c if k.startswith(LEVER) and k.endswith(".fallback")}, (c, why)
    if plan_spec:
        lo, hi = last["shares"][rank]
        assert c.get("vae_graphs.fused", 0) == hi - lo, c  # this rank's decoder calls replay graphs; the stitch none
    assert same, f"rank {rank} {name}: max abs diff {(out.float() - ref.float()).abs().max().item()}"
    assert same_ranks


CHECKS = {name: functools.partial(check_case, name) for name in CASES}


@pytest.fixture(scope="module")
def torchrun_group():
    yield torchrun_world()


@pytest.mark.parametrize("name", list(CASES))
def test_vae_parallel_nccl_bitwise(name, torchrun_group):
    run_check(CHECKS, name, min(N_GPU, 4))
