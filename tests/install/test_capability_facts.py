"""The runtime's per-call capability rules read the hardware YAML (conf/hardware/*.yaml), not constants in code:
the FP8 / NVFP4 GEMM rules (hardware.gemm.<kind>, facts/hardware.py `gemm_reason`) and FA4's head-dim limit
(hardware.fa4.head_dim_limit). Each rule is checked against the packaged facts, then against edited facts, which
move it."""

import copy

import pytest
import torch

from h3plan.facts import hardware as hw
from h3plan.runtime.attention import fa4


@pytest.fixture
def edited(monkeypatch):
    """edit(name, path, value): the packaged facts with one value changed, seen by every per-call rule."""
    real = hw.load
    changes = {}

    def load(name):
        f = copy.deepcopy(real(name))
        for (n, path), value in changes.items():
            if n == name:
                node = f
                *head, last = path.split(".")
                for key in head:
                    node = node[key]
                node[last] = value
        return f

    def edit(name, path, value):
        changes[(name, path)] = value
        hw.for_capability.cache_clear()

    monkeypatch.setattr(hw, "load", load)
    hw.for_capability.cache_clear()
    yield edit
    hw.for_capability.cache_clear()


def test_gemm_rules_follow_the_packaged_facts():
    assert [hw.gemm_reason("fp8", cc) for cc in ((9, 0), (10, 0), (10, 3), (10, 7))] == [None] * 4
    assert hw.gemm_reason("fp8", (8, 0)) == hw.gemm_reason("fp8", None) == "FP8 GEMM needs SM90+"
    assert hw.gemm_reason("nvfp4", (9, 0)) == hw.gemm_reason("nvfp4", None) == "NVFP4 GEMMs need SM100+"
    assert [hw.gemm_reason("nvfp4", cc) for cc in ((10, 0), (10, 3), (10, 7))] == [None] * 3


def test_gemm_rules_move_with_the_facts(edited):
    edited("sm100", "gemm.nvfp4", False)
    assert hw.gemm_reason("nvfp4", (10, 0)) == "NVFP4 GEMMs need SM103+"
    assert hw.gemm_reason("nvfp4", (10, 3)) is None
    edited("sm90", "gemm.fp8", False)
    assert hw.gemm_reason("fp8", (9, 0)) == "FP8 GEMM needs SM100+"


def _fa4_reason(monkeypatch, cc, head_dim):
    monkeypatch.setattr(fa4, "device_cc", lambda q: cc)
    return fa4._device_reason(torch.zeros(1, 4, 2, head_dim, dtype=torch.bfloat16))


def test_fa4_head_dim_limit_is_the_facts(monkeypatch, edited):
    assert _fa4_reason(monkeypatch, (9, 0), 256) is None
    assert _fa4_reason(monkeypatch, (10, 3), 256) == "FA4 on SM103 needs head_dim in [8, 128] divisible by 8, got 256"
    assert _fa4_reason(monkeypatch, (10, 3), 128) is None
    edited("sm90", "fa4.head_dim_limit", 64)
    assert _fa4_reason(monkeypatch, (9, 0), 128) == "FA4 on SM90 needs head_dim in [8, 64] divisible by 8, got 128"
