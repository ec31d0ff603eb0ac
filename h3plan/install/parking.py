"""Tensors a plan does not compute with while installed, parked in host memory until uninstall.

gemm_quant quantises the block linears at install (a BF16 checkpoint under an FP8 or NVFP4 plan) and keeps
the replaced nn.Linear modules for uninstall. Left on the device they would hold 2 bytes per weight beside
the quantised copies (about 37 GB for the 50-layer transformer). Nothing reads them while the plan is
installed (the quantised modules hold their own weights; a bias they share keeps its device storage alive
through the quantised module, so only what is no longer referenced there is freed), so `park` moves every
parameter of those modules to host memory and `unpark` copies the same bits back into the same Parameter
objects on their devices. Host copies are pinned when the tensor is on CUDA (the copy back is a DMA); a
module already on the CPU, or on the meta device, is left where it is (nothing to free), unless `pin_host`:
then a CPU tensor is copied into pinned memory too (adaln_table into a model loaded on the host and installed
to CUDA with install(..., device=): misses stream from there as from a device-loaded model's parked weights),
and unpark copies it back into pageable memory, as it was.

`to_host` is the one way the installer makes a host copy of a tensor (parked weights, the VAE cast's originals,
the text encoder's host masters), so it is also where the host's memory is checked: a copy that would leave less than
`HOST_RESERVE` of the host's available memory (Linux /proc/meminfo MemAvailable) raises `HostMemoryError` before it
allocates, and install undoes what it did. Without the check such an install runs the host out of memory and the
kernel kills the process (no error the user can read): the prompt's Qwen3-VL conditioner kept on the host (about
62 GiB) and the AdaLN linears and bf16 block linears an fp8 plan parks there are more than a 128 GiB host holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


STAY = ("cpu", "meta")  # device types whose tensors stay put: nothing to free there
HOST_RESERVE = 4 << 30  # bytes of the host's available memory a copy must leave (the process, its libraries, pages)
MEMINFO = "/proc/meminfo"


class HostMemoryError(MemoryError):
    """A host copy the host's available memory cannot take (not a RuntimeError: nothing falls back to another kind of
    host memory, which would take the same bytes)."""


CGROUP = "/sys/fs/cgroup"  # cgroup v2: a container's limit (memory.max) and use (memory.current)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def host_available() -> int | None:
    """The host memory this process can still take, in bytes: MemAvailable, or less where a cgroup limit leaves less;
    None where the system says neither (not Linux)."""
    out = []
    for line in (_read(MEMINFO) or "").splitlines():
        if line.startswith("MemAvailable:") and line.split()[1:2] and line.split()[1].isdigit():
            out.append(int(line.split()[1]) * 1024)
    limit, used = _read(f"{CGROUP}/memory.max"), _read(f"{CGROUP}/memory.current")
    if limit and used and limit.strip().isdigit() and used.strip().isdigit():
        out.append(int(limit) - int(used))
    return min(out) if out else None


def _check_host(nbytes: int) -> None:
    free = host_available()
    if free is not None and nbytes + HOST_RESERVE > free:
        raise HostMemoryError(
            f"h3plan install: a {nbytes / 2**30:.2f} GiB host copy (what the plan keeps on the host until uninstall: "
            f"parked weights, the VAE's float32 originals, the text encoder's host masters) would leave under "
            f"{HOST_RESERVE / 2**30:.0f} GiB of the host's {free / 2**30:.1f} GiB available; install undid what it "
            f"did. The plan's memory lines say what it parks: free host memory (the text encoder kept on the host "
            f"is the largest part), or load a checkpoint already in the plan's precision (nothing to park)")


def to_host(t: torch.Tensor, pin: bool | None = None) -> torch.Tensor:
    """A copy of t in host memory, never t itself: pinned when `pin` (None: when t is on CUDA, so the copy back is
    a DMA), else pageable. RuntimeError where the host cannot lock the memory; HostMemoryError where the copy would
    leave less than HOST_RESERVE of the host's available memory."""
    _check_host(t.numel() * t.element_size())
    if pin is None:
        pin = t.device.type == "cuda"
    if not pin:
        return torch.empty_like(t, device="cpu").copy_(t)
    host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
    host.copy_(t)
    return host


@dataclass
class Parked:
    params: list  # (Parameter, its device) whose data now lives on the host
    nbytes: int  # the device bytes moved (weights and biases)
    pinned: int = 0  # the bytes of host tensors copied into pinned memory (pin_host)

    def unpark(self) -> None:
        for p, device in self.params:
            if device.type == "cpu":  # pinned by pin_host: back into pageable memory
                p.data = to_host(p.data, pin=False)
            else:
                p.data = p.data.to(device, non_blocking=False)
        self.params = []


def park(modules, pin_host: bool = False) -> Parked:
    """Move every parameter of `modules` that lives on an accelerator to host memory; pin_host: copy the ones
    in pageable host memory into pinned memory too."""
    out, nbytes, pinned = [], 0, 0
    for m in modules:
        for p in m.parameters(recurse=True):
            size = p.numel() * p.element_size()
            if p.device.type == "cpu" and pin_host and not p.is_pinned():
                p.data = to_host(p.data, pin=True)
                out.append((p, p.device))
                pinned += size
                continue
            if p.device.type in STAY:
                continue
            device = p.device
            p.data = to_host(p.data)
            out.append((p, device))
            nbytes += size
    return Parked(out, nbytes, pinned)
