"""vae_ops' fp16_weights: the ViT decoder blocks' linears hold float16 on the device, float32 masters on the host.

Scope: the six linears of one MiniMaxH3VideoTransformerBlock (vae_block.LINEARS), weights and biases.
`Fp16Weights.swap(linears)` replaces every one of those tensors that is not float16 by
`param.to(float16)`, computed on the parameter's own device: the very cast FP16 autocast makes on
every call. The same Parameter objects stay registered (only their data changes), so while installed
`state_dict()`, `parameters()` and `save_pretrained` see float16 there; `vae.dtype` (post_quant_conv's)
does not change. The originals move to host memory as masters: pinned when the device is CUDA (a
fallback's copy back is a DMA), plain CPU memory otherwise. `restore()` (uninstall) copies the masters
back into the same Parameters on their current device: the original dtype and bits.

Per call, `route(x, where)` settles which tensors the linears compute with, as one counted event:
- `fused`: FP16 autocast is on for x's device and x is on the weights' device: the float16 parameters
  themselves. Exact: autocast casts input, weight and bias to float16 and runs the same GEMM; its weight
  cast is the one the install made (a float16 tensor is not cast again).
- `fallback` with the reason: autocast off or at another dtype, x on another device, autograd recording
  for the input: the masters copied to the device for that call only, so the GEMM sees diffusers' own
  float32 tensors (one host-to-device copy of the linears per call: slow, exact).
- refused (InstallError): a parameter was replaced, moved, cast or edited since the swap (the masters
  no longer describe the model: uninstall, change the float32 originals, reinstall), or autograd is
  recording and the parameters require grad (a float16 device tensor cannot give their float32 grads).
Every path to these linears is routed: the plan block forward routes all six once per block call, and
each linear's instance forward (`guarded_linear_forward`, installed with the swap) routes any other
call (a custom attention processor, a hook, a direct call) once per linear call.
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from h3plan.errors import InstallError
from h3plan.runtime.counters import fallback as count_fallback, fused as count_fused
from h3plan.runtime.guards import GRAD_REASON

from .parking import host_copy

logger = logging.getLogger("h3plan.install")
COUNTER = "vae_ops.fp16_weights"
FP16 = torch.float16


@dataclass
class _Slot:
    module: torch.nn.Linear
    name: str  # "weight" | "bias"
    param: torch.nn.Parameter
    master: torch.Tensor | None  # host copy of the original; None: the tensor was float16 already, left alone
    ptr: int  # the float16 device data the parameter must still hold
    version: int



class Fp16Weights:
    """One block's linears as installed: float16 device parameters, float32 host masters (see the module doc)."""

    def __init__(self, fqn: str, slots: list[_Slot], device: torch.device, compute_dtype: torch.dtype, pinned: bool):
        self.fqn, self.slots, self.device, self.compute_dtype, self.pinned = fqn, slots, device, compute_dtype, pinned
        self.modules = list(dict.fromkeys(s.module for s in slots))

    @classmethod
    def swap(cls, fqn: str, linears: list[torch.nn.Linear]) -> "Fp16Weights":
        first = linears[0].weight
        # compute_dtype: what diffusers' get_parameter_dtype(attn.to_q) gives uninstalled
        w = cls(fqn, [], first.device, first.dtype, pinned=False)
        try:
            with torch.no_grad():
                for lin in linears:
                    for name in ("weight", "bias"):
                        p = getattr(lin, name)
                        if p is None:
                            continue
                        master = None
                        if p.dtype != FP16:
                            master, w.pinned = host_copy(p.detach())
                            p.data = p.detach().to(FP16)  # the old device tensor is freed here
                        w.slots.append(_Slot(lin, name, p, master, p.data_ptr(), p._version))
        except BaseException:
            w.restore()  # a failure half way (host memory?) leaves the block as it was
            raise
        w.modules = list(dict.fromkeys(s.module for s in w.slots))
        return w

    # ---------------------------------------------------------------- sizes
    @property
    def swapped(self) -> list[_Slot]:
        return [s for s in self.slots if s.master is not None]

    @property
    def host_bytes(self) -> int:
        return sum(s.master.numel() * s.master.element_size() for s in self.swapped)

    @property
    def saved_bytes(self) -> int:
        return self.host_bytes - sum(s.param.numel() * s.param.element_size() for s in self.swapped)

    # ---------------------------------------------------------------- guards
    def changed(self) -> str | None:
        for s in self.slots:
            p = s.module._parameters.get(s.name)
            if p is not s.param:
                return f"{self.fqn} {s.name} of a linear was replaced"
            if p.data_ptr() != s.ptr or p._version != s.version:
                return f"{self.fqn} linear {s.name} was moved, cast or edited in place ({p.dtype} on {p.device})"
        return None

    def verify(self) -> None:
        """InstallError unless the parameters still hold what the swap put there."""
        why = self.changed()
        if why:
            raise InstallError(f"vae_ops.fp16_weights: {why} while the plan is installed; its float32 master on the host "
                               "would be stale: uninstall (restores the originals), change those, and reinstall")

    def reason(self, x) -> str | None:
        """None: the float16 parameters compute this call exactly; else why the masters must."""
        return fp16_autocast_reason(x, self.device)

    def route(self, x, modules=None) -> tuple[dict, bool]:
        """({linear: (weight, bias)} for this call, fused?): one counted event; InstallError when refused."""
        self.verify()
        if torch.is_grad_enabled() and any(s.param.requires_grad for s in self.slots):
            raise InstallError(f"vae_ops.fp16_weights: autograd is recording and {self.fqn} linears require grad, but "
                               "their float32 originals are on the host while the plan is installed: decode under "
                               "torch.no_grad() (or requires_grad_(False)), or uninstall the plan")
        why = self.reason(x)
        mods = self.modules if modules is None else modules
        if why is None:
            count_fused(COUNTER)
            return {m: (m.weight, m.bias) for m in mods}, True
        count_fallback(COUNTER, why)
        return self.masters(mods), False

    def masters(self, modules) -> dict:
        """The original tensors of `modules` on the device, for one call."""
        out = {m: [m.weight, m.bias] for m in modules}
        for s in self.swapped:
            if s.module in out:
                out[s.module][0 if s.name == "weight" else 1] = s.master.to(s.param.device, non_blocking=self.pinned)
        return {m: tuple(v) for m, v in out.items()}

    # ---------------------------------------------------------------- install / uninstall
    def guard_linears(self) -> None:
        for m in self.modules:
            m._h3plan_fp16 = self
            m.forward = types.MethodType(guarded_linear_forward, m)

    def restore(self) -> None:
        """Uninstall: the original Parameters, forwards and bits (float16 edits made meanwhile are dropped, logged)."""
        why = self.changed()
        if why:
            logger.warning("uninstall %s: %s; restoring the float32 originals", self.fqn, why)
        with torch.no_grad():
            for s in self.slots:
                s.module._parameters[s.name] = s.param
                if s.master is not None:
                    s.param.data = s.master.to(s.param.device)
        for m in self.modules:
            for attr in ("forward", "_h3plan_fp16"):
                m.__dict__.pop(attr, None)


def fp16_autocast_reason(x, device: torch.device) -> str | None:
    """None when x is a tensor on `device` under FP16 autocast with no autograd for it: the call the
    block linears' float16 weights (and the FP8 GEMMs quantised from them, vae_fp8.py) stand in for."""
    if not isinstance(x, torch.Tensor):
        return f"input is {type(x).__name__}, not a tensor"
    dev = x.device.type
    if not torch.is_autocast_enabled(dev):
        return f"autocast is off on {dev}: float16 weights stand in for autocast's float16 casts only"
    if torch.get_autocast_dtype(dev) != FP16:
        return f"autocast dtype {torch.get_autocast_dtype(dev)} != float16"
    if x.device != device:
        return f"input on {x.device}, weights on {device}"
    if torch.is_grad_enabled() and x.requires_grad:
        return GRAD_REASON
    return None


def guarded_linear_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Instance forward of a swapped block linear: nn.Linear's math on the tensors `route` picks."""
    ((weight, bias),) = self._h3plan_fp16.route(x, [self])[0].values()
    return F.linear(x, weight, bias)


def is_guarded_linear(m) -> bool:
    return getattr(m.__dict__.get("forward"), "__func__", None) is guarded_linear_forward
