"""install(..., device=): a model that rests on the host moved to the device at install, a tensor at a time.

An 80 GB card cannot hold the released pipeline as loaded (the bf16 transformer with its 24 GiB of AdaLN
linears and the float32 VAE: 72.7 GiB), only as installed. So the user loads it on the host (diffusers'
from_pretrained does by default) and passes `device=`: the installer moves every parameter and buffer the plan
computes with to the device before the levers install (`Placement.move`), except the tensors a lever replaces
or parks, which never go to the device whole: the AdaLN linears (adaln_table: each linear's weights streamed to
the device for its entries, then parked in pinned host memory), the block linears quantised at install
(gemm_quant: each one streamed, quantised on the device, its bf16 original left on the host) and the VAE
tensors vae_precision casts (each streamed and cast on the device, the float32 original left on the host). The
device then never holds more than the installed footprint plus one such tensor being staged.

Moves keep the Parameter and buffer objects (`t.data = t.data.to(device)`) where torch can swap a tensor's data
(cpu <-> cuda), as nn.Module.to does, so a state_dict taken before install still names the same tensors; where
it cannot (other device types, torch's `lazy` in the CPU tests) the module gets a new tensor, as nn.Module.to
does too, and uninstall puts the original objects back. `restore()` (uninstall) moves every one back to the
device it came from, bit for bit: a host-loaded model rests on the host again after uninstall. A tensor a call
left in a moved module's plain attributes on the device (`torch.nn.utils.weight_norm` recomputes `weight` on each
forward and keeps it as an attribute: the audio VAE's convolutions) goes back to the host with it; those that were
on the device before install stay.

`target(device)` checks the argument and `check(model, device, name)` the model's placement: each is one
InstallError line. Torch's own devices only; the CPU test suite moves to torch's `lazy` device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from h3plan.errors import InstallError
from h3plan.runtime.kernels import _common

from .hooks import effect


def target(device) -> torch.device | None:
    """The install device `device` names (an int is a CUDA index); None: install where the model is."""
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise InstallError(f"install device={device!r}: pass a torch device (\"cuda\", \"cuda:1\", torch.device) or a "
                           "CUDA index")
    try:
        dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise InstallError(f"install device={device!r} is not a torch device ({str(e).splitlines()[0]})") from None
    if dev.type == "meta":
        raise InstallError("install device='meta': meta tensors hold no values; install to the device the model "
                           "runs on")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InstallError(f"install device={str(dev)!r}: no CUDA device here (torch.cuda.is_available() is False)")
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if not 0 <= index < torch.cuda.device_count():
            raise InstallError(f"install device={str(dev)!r}: this process sees {torch.cuda.device_count()} CUDA "
                               "device(s)")
        dev = torch.device("cuda", index)
    return dev


def same(a: torch.device, b: torch.device) -> bool:
    """a is the device b (an index-less device is index 0 of its type, as torch places tensors)."""
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def tensors(module):
    """(qualified name, tensor) of every parameter and buffer, each tensor once."""
    seen = set()
    for name, t in (list(module.named_parameters(remove_duplicate=False))
                    + list(module.named_buffers(remove_duplicate=False))):
        if t is not None and id(t) not in seen:
            seen.add(id(t))
            yield name, t


def nbytes(module) -> int:
    return sum(t.numel() * t.element_size() for _, t in tensors(module))


def check(module, device: torch.device, name: str) -> None:
    """One InstallError unless every tensor of `module` rests on the host or on `device` already."""
    for fqn, t in tensors(module):
        if t.device.type != "cpu" and not same(t.device, device):
            raise InstallError(f"{name}.{fqn} is on {t.device}, the install device is {device}: load the model on the "
                               f"host (or on {device}) and install again")


@dataclass
class Placement:
    """The tensors an install moved, each with the device it came from."""

    device: torch.device
    moved: list = field(default_factory=list)  # (tensor now, device before, None | (original tensor, its slots))
    modules: list = field(default_factory=list)  # (module moved, ids of its attribute tensors on the device then)

    def move(self, module, keep=frozenset()) -> int:
        """Move every parameter and buffer of `module` not on the device, except the tensors in `keep` (ids);
        returns the bytes moved. One tensor at a time: the host copy is freed as its device copy lands."""
        nbytes = 0
        self.modules.append((module, {id(t) for _, _, t in _attribute_tensors(module) if same(t.device, self.device)}))
        for t, where in _slots(module).values():
            if id(t) not in keep:
                nbytes += self.move_tensor(t, where)
        return nbytes

    def move_tensor(self, t: torch.Tensor, where) -> int:
        """One tensor to the device, as nn.Module.to moves it: the same object where torch can swap its data
        (cpu <-> cuda), else a new one in every slot `where` names ((module, "_parameters" | "_buffers", name))."""
        if same(t.device, self.device):
            return 0
        with torch.no_grad():
            new = t.data.to(self.device)
            if torch._has_compatible_shallow_copy_type(t, new):
                before, t.data = t.device, new
                self.moved.append((t, before, None))
            else:
                now = (torch.nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter)
                       else new)
                for mod, kind, name in where:
                    getattr(mod, kind)[name] = now
                before, t.data = t.device, torch.empty(0, dtype=t.dtype, device=t.device)  # the host copy freed
                self.moved.append((now, before, (t, where)))
        return new.numel() * new.element_size()

    def current(self, t: torch.Tensor) -> torch.Tensor:
        """The tensor that stands for `t` since the move (t itself unless it was replaced)."""
        return next((now for now, _, orig in self.moved if orig is not None and orig[0] is t), t)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t, _, _ in self.moved)

    def restore(self) -> None:
        with torch.no_grad():
            for now, before, orig in reversed(self.moved):
                if orig is None:
                    now.data = now.data.to(before)
                    continue
                t, where = orig
                t.data = now.data.to(before)
                for mod, kind, name in where:
                    getattr(mod, kind)[name] = t
            host = next((before for _, before, _ in self.moved), torch.device("cpu"))
            for module, kept in self.modules:
                for mod, name, t in _attribute_tensors(module):
                    if same(t.device, self.device) and id(t) not in kept:
                        mod.__dict__[name] = t.to(host)
        self.moved, self.modules = [], []


def _attribute_tensors(module):
    """(module, name, tensor) of every tensor held in a plain attribute (module.__dict__, not a parameter or buffer)."""
    for mod in module.modules():
        for name, t in list(mod.__dict__.items()):
            if isinstance(t, torch.Tensor):
                yield mod, name, t


def _slots(module) -> dict[int, tuple]:
    """id -> (tensor, [(module, "_parameters" | "_buffers", name)]) for every parameter and buffer of `module`."""
    out: dict[int, tuple] = {}
    for mod in module.modules():
        for kind in ("_parameters", "_buffers"):
            for name, t in getattr(mod, kind).items():
                if t is not None:
                    out.setdefault(id(t), (t, []))[1].append((mod, kind, name))
    return out


def slots_of(module, tensors_: list) -> list[tuple]:
    """(tensor, its slots) for each of `tensors_` in `module` (Placement.move_tensor's `where`)."""
    found = _slots(module)
    return [found[id(t)] for t in tensors_]


def stage(linear: torch.nn.Linear, device: torch.device) -> torch.nn.Linear:
    """An nn.Linear on `device` holding copies of `linear`'s weight and bias (the original stays where it is)."""
    w, b = linear.weight, linear.bias
    out = torch.nn.Linear(linear.in_features, linear.out_features, bias=b is not None, device="meta", dtype=w.dtype)
    out.weight = torch.nn.Parameter(w.detach().to(device), requires_grad=w.requires_grad)
    if b is not None:
        out.bias = torch.nn.Parameter(b.detach().to(device), requires_grad=b.requires_grad)
    return out


def place(model, state, device: torch.device, streamed) -> None:
    """install(..., device=): every tensor of `model` but `streamed` (a lever stages those itself) to the device."""
    placement = Placement(device)
    state.placement = placement
    effect(model, "placement", state, placement.restore)  # uninstall moves every tensor back (its last hook off)
    placement.move(model, {id(t) for t in streamed})
    state.report.placement = {"device": str(device), "moved": placement.nbytes, "tensors": len(placement.moved)}


def on_host(state, what: str, nbytes: int) -> None:
    """Record what a device install left on the host (report.placement)."""
    if state.placement is not None and nbytes:
        state.report.placement.setdefault("host", {})[what] = nbytes


def note(model, state) -> None:
    """The report's placement note: what moved, what stayed on the host."""
    p = state.report.placement
    host = p.get("host", {})
    left = sum(t.numel() * t.element_size() for _, t in tensors(model) if t.device.type == "cpu")
    listed = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in host.items()) or "nothing"
    state.report.notes.append(
        f"placement: {p['moved'] / 2**30:.2f} GiB ({p['tensors']} tensors) moved from the host to {p['device']}; on "
        f"the host: {listed} ({left / 2**30:.2f} GiB of them in state_dict()); uninstall moves everything back to the "
        "host")


def rests_on_host(model) -> bool:
    """A CUDA device is there but every tensor of `model` is on the host (install without device=)."""
    return torch.cuda.is_available() and all(t.device.type == "cpu" for _, t in tensors(model))


def cannot_run(model, plan) -> str | None:
    """Why the installed plan cannot run where `model` rests (install without device=), in one line; None where it
    can. On the host beside a CUDA device: it stays there (device= moves it). On a machine with no CUDA device the
    plan's kernels fall back per call, except Triton's in its CPU interpreter (TRITON_INTERPRET=1, the CPU tests)."""
    if not all(t.device.type == "cpu" for _, t in tensors(model)):
        return None
    if torch.cuda.is_available():
        return ("the model rests on the host and stays there: install(model, plan, device=\"cuda\") moves it to the "
                "GPU at install, a tensor at a time (what an 80 GB card needs)")
    if _common.INTERPRET:
        return None
    return (f"the plan is for {plan.get('hardware').get('name')} GPUs and this machine has no CUDA device: on the CPU "
            "every call of its kernels falls back to diffusers' own code (counted: h3plan.counters()), so the plan's "
            "speed does not apply here (TRITON_INTERPRET=1 runs its Triton kernels in the interpreter, for tests)")


__all__ = ["Placement", "cannot_run", "check", "nbytes", "note", "on_host", "place", "rests_on_host", "same",
           "slots_of", "stage", "target",
           "tensors"]
