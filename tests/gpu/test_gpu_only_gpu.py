"""H200: what a GPU machine must never be told it lacks. The torch-free check that refuses GPU-only actions before
torch loads (h3plan/actions/gpu_only.py) finds this machine's GPU; an install of a plan into a model left on the host
beside it says so in one warning line (h3plan/install/placement.py cannot_run).

    python -m pytest tests/gpu/test_gpu_only_gpu.py -m gpu -q
"""

import logging

import pytest
import torch

import h3plan
from h3plan.actions import gpu_only

pytestmark = pytest.mark.gpu


def test_the_torch_free_check_finds_this_gpu():
    assert torch.cuda.is_available()
    assert not gpu_only.no_gpu_here()  # else action=verify/bench/calibrate/tune would be refused on a GPU machine


def test_a_model_on_the_host_beside_the_gpu_is_said_at_install(caplog):
    from h3plan.actions.inputs import build_model

    plan = h3plan.resolve_config(model="h3_tiny")
    model = build_model(plan.get("model")["diffusers_config"], blocks=1, device="cpu", dtype=torch.bfloat16, seed=0)
    with caplog.at_level(logging.WARNING, logger="h3plan.install"):
        report = h3plan.install(model, plan)
    try:
        (record,) = caplog.records
        assert record.getMessage().startswith("h3plan.install: the model rests on the host and stays there: "
                                              "install(model, plan, device=\"cuda\") moves it")
        assert report.warnings == [record.getMessage().partition(": ")[2]]
    finally:
        assert h3plan.uninstall(model)
