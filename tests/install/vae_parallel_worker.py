"""Worker of test_vae_parallel.py: one gloo rank decoding the tiny VAE with vae_parallel installed.

One world of three ranks (diffusers' import is most of a rank's time): every case runs over the whole
world (degree 3) and over the group of ranks 0 and 1 (degree 2). Every rank builds the same seeded VAE,
decodes each case with diffusers alone (the reference), then with ParallelDecode installed, and writes
{degree: {case: {bitwise, counters, reasons, last, ...}}} to rank<r>.json.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

TILE = (16, 16, 8, 8)  # px: 24 x 32 px frames -> 2 x 3 tiles, 24 x 24 -> 2 x 2
CASES = {  # name: (latent shape, autocast dtype or None, use_slicing)
    "fp32": ((1, 4, 4, 6, 6), None, False),       # 2 chunks x 2 x 2 tiles = 8 items, padded token
    "fp16": ((1, 4, 6, 6, 8), torch.float16, False),  # 3 chunks x 2 x 3 = 18 items
    "slicing": ((2, 4, 4, 6, 6), None, True),     # two decodes of 8 items
}


def _decode(vae, z, autocast):
    with torch.no_grad(), torch.autocast("cpu", dtype=autocast or torch.float16, enabled=autocast is not None):
        return vae.decode(z).sample


def _latent(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def worker(rank, world, port, outdir):
    sys.path.insert(0, os.path.dirname(__file__))
    torch.set_num_threads(1)  # three ranks on a small CPU; the reference decodes in the same process
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        groups = {world: dist.group.WORLD, 2: dist.new_group([0, 1])}  # every rank makes every group
        out = {degree: _cases(group, rank) for degree, group in groups.items() if rank < degree}
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
    finally:
        dist.destroy_process_group()


def _cases(group, rank):
    from test_install_vae import tiny_vae

    from h3plan.install.vae.graph import GraphedDecoder
    from h3plan.install.vae.parallel import install_parallel
    from h3plan.runtime.counters import counters, fallback_reasons, reset_counters

    vae = tiny_vae()
    vae.enable_tiling(*TILE)
    res = {}

    def run(name, z, autocast=None):
        ref = _decode(vae, z, autocast)
        undo = install_parallel(vae, group, check_inputs=True)
        pd = vae.__dict__["_decode"]
        reset_counters()
        try:
            out = _decode(vae, z, autocast)
        finally:
            undo()
        last = pd.last or {}
        res[name] = {"bitwise": bool(out.dtype == ref.dtype and torch.equal(out, ref)), "counters": counters(),
                     "reasons": fallback_reasons(), "items": last.get("items"), "dtype": last.get("dtype"),
                     "shares": last.get("shares"), "restored": "_decode" not in vae.__dict__}

    for name, (shape, autocast, slicing) in CASES.items():
        vae.use_slicing = slicing
        run(name, _latent(shape, 1), autocast)
    vae.use_slicing = False

    gd = GraphedDecoder(vae.decoder, vae.decoder.forward)  # on the CPU every call falls back, counted
    vae.decoder.forward = gd
    run("graphed", _latent(CASES["fp32"][0], 1))
    res["graphed"]["forward_kept"] = vae.decoder.__dict__.get("forward") is gd
    del vae.decoder.__dict__["forward"]

    run("different", _latent(CASES["fp32"][0], 10 + rank))  # every rank its own latent: each decodes it alone
    vae.disable_tiling()
    run("tiling_off", _latent(CASES["fp32"][0], 1))
    return res
