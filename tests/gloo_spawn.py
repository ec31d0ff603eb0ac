"""Spawning gloo worker processes for the CPU multi-process tests (tests/parallel, tests/install).

`spawn(worker, world_size, outdir, *extra)` runs worker(rank, world_size, port, outdir, *extra) in
`world_size` processes on a fresh 127.0.0.1 port and waits up to `timeout_s`. A worker killed by a
signal (a process exit, not a Python exception) gets one more attempt on a new port: gloo's TCP
rendezvous has been seen to abort a rank once in a full CPU run ("terminate called without an active
exception", SIGABRT) and pass on its own. A worker that raises, or dies twice, fails the test.
"""

from __future__ import annotations

import socket
import time

import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessExitedException


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _once(worker, world_size, outdir, extra, timeout_s):
    ctx = mp.spawn(worker, args=(world_size, free_port(), outdir, *extra), nprocs=world_size, join=False)
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"gloo workers (world {world_size}) still running after {timeout_s} s")
    finally:
        for p in ctx.processes:  # only our own workers, by handle
            if p.is_alive():
                p.kill()


def spawn(worker, world_size: int, outdir: str, *extra, timeout_s: float = 240) -> None:
    try:
        _once(worker, world_size, outdir, extra, timeout_s)
    except ProcessExitedException as exc:
        if exc.signal_name is None:
            raise
        print(f"gloo_spawn: a worker died by {exc.signal_name}; one more attempt on a new port")
        _once(worker, world_size, outdir, extra, timeout_s)
