"""Ulysses attention over gloo with 2, 3 and 4 processes (CPU): bitwise equality with single-process
attention for every padding mode, chunked overlap, FP8 codes, prefix in place, packed input, the amax
hook, byte counts and the error lines. Each world size is spawned once and runs every case of
ulysses_cases.py; one pytest item per (world size, case) reports that case on every rank.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile

import pytest
from gloo_spawn import spawn

import ulysses_cases as C

WORLDS = (2, 3, 4)
TIMEOUT_S = 240


@functools.lru_cache(maxsize=None)
def _results(world_size: int):
    """Spawn `world_size` gloo workers once; {rank: {case: "ok" | "skip: ..." | "FAIL ..."}}."""
    outdir = tempfile.mkdtemp(prefix=f"ulysses_u{world_size}_")
    spawn(C.worker, world_size, outdir, timeout_s=TIMEOUT_S)
    out = {}
    for r in range(world_size):
        with open(os.path.join(outdir, f"rank{r}.json")) as f:
            out[r] = json.load(f)
    return out


PARAMS = [pytest.param(u, name, id=f"U{u}-{name}")
          for name, (worlds, _) in C.CASES.items() for u in WORLDS if u in worlds]


@pytest.mark.slow  # multi-process gloo worlds
@pytest.mark.parametrize("world_size,name", PARAMS)
def test_ulysses_case(world_size, name):
    res = _results(world_size)
    per_rank = {r: res[r].get(name, "FAIL: not run") for r in res}
    fails = {r: m for r, m in per_rank.items() if m.startswith("FAIL")}
    assert not fails, fails
    skips = {m for m in per_rank.values() if m.startswith("skip")}
    if skips:
        pytest.skip("; ".join(sorted(skips)))
    assert all(m == "ok" for m in per_rank.values()), per_rank
