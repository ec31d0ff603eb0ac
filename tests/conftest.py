"""Test setup: on a machine without a CUDA GPU, Triton kernels run in the CPU interpreter and the
GPU suite (marker `gpu`) is skipped with that reason."""

import os

import pytest

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # the planner tests need no torch
    HAS_CUDA = False

if not HAS_CUDA:
    # Must be set before triton is first imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run the GPU suite on the H200: see tests/gpu/README.md)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
