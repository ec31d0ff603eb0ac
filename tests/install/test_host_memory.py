"""The host-memory check of install/parking.to_host: a host copy that would leave less than HOST_RESERVE of the host's
available memory raises HostMemoryError (one line) before it allocates, and an install that meets it undoes what it
did. The GPU machine's case: a 128 GiB host holding the prompt's conditioner (about 62 GiB) beside what an fp8 plan
parks there was killed by the kernel, with no error."""

import pytest
import torch

from install_helpers import LEVERS, forward, plan, tiny_inputs, tiny_model

from h3plan.install import install, installed_plan, parking, uninstall
from h3plan.install.parking import HostMemoryError, host_available, to_host

GIB = 1 << 30


def test_host_available_reads_meminfo_and_the_cgroup_limit(tmp_path, monkeypatch):
    (tmp_path / "meminfo").write_text("MemTotal:  134217728 kB\nMemAvailable:   8388608 kB\nCached: 1 kB\n")
    monkeypatch.setattr(parking, "MEMINFO", str(tmp_path / "meminfo"))
    monkeypatch.setattr(parking, "CGROUP", str(tmp_path / "none"))
    assert host_available() == 8 * GIB
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.max").write_text(f"{6 * GIB}\n")
    (cg / "memory.current").write_text(f"{1 * GIB}\n")
    monkeypatch.setattr(parking, "CGROUP", str(cg))
    assert host_available() == 5 * GIB  # the container's limit leaves less than the host
    (cg / "memory.max").write_text("max\n")
    assert host_available() == 8 * GIB
    monkeypatch.setattr(parking, "MEMINFO", str(tmp_path / "missing"))
    monkeypatch.setattr(parking, "CGROUP", str(tmp_path / "none"))
    assert host_available() is None


def test_to_host_refuses_a_copy_the_host_cannot_take(monkeypatch):
    t = torch.ones(1024, dtype=torch.float32)
    monkeypatch.setattr(parking, "host_available", lambda: parking.HOST_RESERVE + 4095)
    with pytest.raises(HostMemoryError) as err:
        to_host(t, pin=False)
    msg = str(err.value)
    assert "\n" not in msg and "0.00 GiB host copy" in msg and "available" in msg
    assert not isinstance(err.value, RuntimeError), "the text encoder's pageable fallback must not catch it"
    monkeypatch.setattr(parking, "host_available", lambda: parking.HOST_RESERVE + 4096)
    assert torch.equal(to_host(t, pin=False), t)  # exactly enough
    monkeypatch.setattr(parking, "host_available", lambda: None)  # not Linux: no check
    assert torch.equal(to_host(t, pin=False), t)


def test_an_install_that_runs_the_host_short_undoes_itself(monkeypatch):
    """fp8 GEMMs from a bf16 checkpoint park the replaced linears on the host (CPU stands in for a device, as in
    test_install_quant): the host runs short part of the way through; install raises the one line and the model is
    as it was, and installs again once the host has room."""
    monkeypatch.setattr(parking, "STAY", ("meta",))
    model, fresh = tiny_model(), tiny_model()
    copies = []

    def available():
        copies.append(1)
        return parking.HOST_RESERVE + (1 << 40 if len(copies) <= 3 else 0)  # the 4th copy finds the host full

    monkeypatch.setattr(parking, "host_available", available)
    with pytest.raises(HostMemoryError, match="host copy"):
        install(model, plan(attention="sdpa", gemm_quant="fp8"), registry=LEVERS)
    assert len(copies) == 4
    fsd = fresh.state_dict()
    assert all(torch.equal(v, fsd[k]) for k, v in model.state_dict().items())
    assert installed_plan(model) is None and not any(type(m).__name__.startswith("FP8") for m in model.modules())
    assert getattr(model, "_diffusers_hook", None) is None
    monkeypatch.setattr(parking, "host_available", lambda: None)
    install(model, plan(attention="sdpa", gemm_quant="fp8"), registry=LEVERS)
    assert any(type(m).__name__.startswith("FP8") for m in model.modules())
    out = forward(model, tiny_inputs())
    assert all(torch.isfinite(o).all() for o in out)
    uninstall(model)
