"""The installer at Ulysses degree 2 over gloo (CPU, Triton interpreter): each rank runs the block stack on
its sequence shard (install/shard.py) and attention through h3plan.parallel.ulysses; the gathered
outputs equal the single-process eager forward.

Contract: bitwise on these shapes (rtol=0, atol=0): every op is per row or per head, and the shards
only change how many rows a call sees. S = 47 makes the last shard padded (47 = 24 + 23).
"""

import json
import os
import socket
import tempfile
import time

import pytest
import torch.multiprocessing as mp

import install_ulysses_worker as W

TIMEOUT_S = 300


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ulysses_degree_2_matches_single_process():
    outdir = tempfile.mkdtemp(prefix="h3plan_install_u2_")
    ctx = mp.spawn(W.worker, args=(2, _port(), outdir, 47), nprocs=2, join=False)
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                raise TimeoutError("gloo workers still running")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    for rank in (0, 1):
        with open(os.path.join(outdir, f"rank{rank}.json")) as f:
            res = json.load(f)
        for case, r in res.items():
            assert r["bitwise"], (rank, case, r)
            c = r["counters"]
            assert c["attention.fused"] == 2 and c["modulation.fused"] == 4, (rank, case, c)
            assert c.get("qk_norm_rope.fused", 0) == (2 if case.endswith("fused") else 0), (rank, case, c)
