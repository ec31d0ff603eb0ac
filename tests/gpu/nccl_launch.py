"""Launching NCCL checks for the multi-GPU tests: under torchrun (one pytest process per GPU, the
process group made once) or from a plain pytest process, which spawns one process per rank on
tcp://127.0.0.1 for every check. A check is a function of no arguments run on every rank."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Callable, Mapping

import pytest
import torch
import torch.distributed as dist

N_GPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
TORCHRUN = "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ
NEEDS_2_GPUS = pytest.mark.skipif(N_GPU < 2 and not TORCHRUN,
                                  reason=f"needs >= 2 CUDA GPUs for NCCL Ulysses (found {N_GPU})")


def init(rank, world_size, init_method="env://"):
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=120))


def _spawned(rank, world_size, port, checks, name):
    init(rank, world_size, f"tcp://127.0.0.1:{port}")
    try:
        checks[name]()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def torchrun_world(allowed: tuple[int, ...] | None = None):
    """Under torchrun: the initialised world group (skips a world size outside `allowed`); else None."""
    if not TORCHRUN:
        return None
    if not dist.is_initialized():
        init(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    if dist.get_world_size() < 2:
        pytest.skip("torchrun world size 1: needs >= 2 processes")
    if allowed and dist.get_world_size() not in allowed:
        pytest.skip(f"world size {dist.get_world_size()} not in {allowed}")
    return dist.group.WORLD


def run_check(checks: Mapping[str, Callable[[], None]], name: str, world: int) -> None:
    """Run checks[name] on every rank: in this process under torchrun, else in `world` spawned processes."""
    if TORCHRUN:
        checks[name]()
        dist.barrier()
        return
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_spawned, args=(world, port, checks, name), nprocs=world)
