"""Test setup: on a machine without a CUDA GPU, Triton kernels run in the CPU interpreter and the
GPU suite (marker `gpu`) is skipped with that reason; a run whose `-m` deselects `gpu` there (both CI lanes)
does not import tests/gpu at all (torch._dynamo and the NCCL helpers: seconds of collection for nothing).
Session fixtures share what several test files would each rebuild (the 48 preset plans)."""

import os
from pathlib import Path

import pytest

try:
    import torch

    HAS_TORCH, HAS_CUDA = True, torch.cuda.is_available()
except ImportError:  # the planner tests need no torch
    HAS_TORCH = HAS_CUDA = False

if not HAS_CUDA:
    # Must be set before triton is first imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _cores_per_worker() -> int | None:
    """A pytest-xdist worker's share of the cores (at least one); None outside xdist or where OMP_NUM_THREADS says.
    torch's intra-op pool takes every core in each worker by default: two workers on two cores (the fast lane) would
    run four busy threads on two cores and lose time to the contention."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or "OMP_NUM_THREADS" in os.environ:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, int(workers)))


_SHARE = _cores_per_worker()
if HAS_TORCH and _SHARE is not None:
    torch.set_num_threads(min(torch.get_num_threads(), _SHARE))


TESTS = Path(__file__).resolve().parent


def _deselects_gpu(config) -> bool:
    """`-m` is a plain conjunction with `not gpu` among its terms (e.g. "not gpu and not slow"): no test
    marked gpu can run."""
    expr = " ".join((config.getoption("markexpr") or "").split())
    return "(" not in expr and " or " not in expr and "not gpu" in expr.split(" and ")


def pytest_ignore_collect(collection_path, config):
    # every test under tests/gpu is marked gpu (module pytestmark)
    if not HAS_CUDA and collection_path == TESTS / "gpu" and _deselects_gpu(config):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run the GPU suite on the H200: see tests/gpu/README.md)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


GRID = (("sm90", "sm100", "sm103", "sm107"), ("bf16", "fp8", "nvfp4"), ("u1", "u2", "u4", "u8"))


@pytest.fixture(scope="session")
def preset_plans():
    """Every hardware x recipe x Ulysses preset of GRID through the public h3plan.resolve_config, in GRID order:
    (hw, recipe, parallel) -> its Plan, for the combinations that plan (tests/docs reads their texts)."""
    import itertools

    import h3plan
    from h3plan.errors import H3PlanError

    out = {}
    for hw, recipe, par in itertools.product(*GRID):
        try:
            out[hw, recipe, par] = h3plan.resolve_config(hardware=hw, recipe=recipe, parallel=par)
        except H3PlanError:
            continue
    return out
