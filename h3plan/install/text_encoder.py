"""Where the pipeline's Qwen3-VL conditioner sits: the plan's `memory.text_encoder` decision carried out.

The plan decides the placement (the text_encoder lever, levers/text_encoder.py, in the memory estimate: `plan.
derived_value("text_encoder")`); the lever's install records it as the `text_encoder` option of the `pipeline` scope
(one of PLACED: its settings that place the conditioner), and `place(text_encoder, setting, device)` makes the
module do it and returns a TextEncoderPlacement whose `restore()` undoes it (every hook removed, every tensor back
where it was):
- resident: moved to `device` once, there for every call;
- offload_after: moved to `device` when the encode starts and back to the host when it ends, inside the call (the
  plan counts the move in the call's time);
- host: left on the host; its parts (the vision tower, each decoder layer, the final norm) are moved to `device` one
  at a time as the encode reaches them and back right after, so the device holds one part at a time (the plan's
  `host` estimate: one decoder layer + the encode's activations); the token lookup runs on the host (its 1.5 GiB
  table never moves, the looked-up rows do).
The moves are diffusers hooks named `h3plan.text_encoder` (install/hooks.py) whose forward moves up, runs the module's
and moves back in a `finally`: a move back to the host runs when the encode raises as well, so an encode that fails (out
of memory, a bad input) leaves no conditioner on the device for the next call.
Off the device (offload_after, host), every moved tensor has a host master that the device copies are made from:
pinned when `device` is CUDA, so going up is one DMA at the link's rate, and coming down only points the module back
at its masters (an encode reads the conditioner's weights and never writes them: nothing is copied back); a pageable
source moves at a fraction of the link's rate (README, "Measured on the H200"). Where pinning fails (the host cannot
lock that much memory) the masters stay pageable and the placement's line says why.
diffusers 0.42.1 runs the conditioner as `text_encoder.model(...)` after firing `text_encoder._hf_hook.pre_forward` by
hand (`get_qwen3vl_prompt_embeds`), and a ModularPipeline's `_execution_device` reads `_hf_hook.execution_device` of a
component that has one: off the device (offload_after, host), the conditioner carries a `_hf_hook` naming `device`
so the pipeline still runs on it, and the moves are hooks on `text_encoder.model` and its parts.
`install_pipeline` (pipeline.py) places a loaded `text_encoder` component by the plan; the pipeline bench places it
once for all its rows. Nothing here changes a number the conditioner computes
(tests/install/test_install_text_encoder.py: frames bitwise against the unplaced pipeline for every placement).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from h3plan.errors import InstallError
from h3plan.levers import MEMORY_SPECS, OPTIONS

from .hooks import attach, effect, remove_all
from .parking import to_host

LEVER, _OPTION = OPTIONS["text_encoder"]  # the lever and the pipeline option it records
PLACED = tuple(s for s in MEMORY_SPECS["text_encoder"].settings if _OPTION.check(s))  # its settings that place it
_STATE = "_h3plan_text_encoder"  # the TextEncoderPlacement a placed conditioner carries


class _ExecutionHook:
    """What diffusers reads of an offloaded component: `execution_device`, and `pre_forward` it fires by hand."""

    def __init__(self, device: torch.device):
        self.execution_device = device

    def pre_forward(self, module, *args, **kwargs):
        return args, kwargs


class _Masters:
    """Host masters of `modules`' parameters and buffers (the module docstring): `up(device)` gives each module device
    copies made from them, `down()` points it back at them. Tensors shared between modules get one master, and so do
    tensors shared between parts placed apart when they pass one `made` (a conditioner whose layers share weights)."""

    def __init__(self, modules: list[torch.nn.Module], pin: bool, made: dict[int, torch.Tensor] | None = None):
        self.slots: list[tuple[torch.nn.Module, str, bool, torch.Tensor]] = []  # (owner, name, is_param, master)
        self.why_not_pinned: str | None = None
        made = {} if made is None else made  # id(parameter or buffer) -> its master
        for module in modules:
            for owner in module.modules():
                for table, is_param in ((owner._parameters, True), (owner._buffers, False)):
                    for name, t in table.items():
                        if t is None:
                            continue
                        if id(t) not in made:
                            made[id(t)] = self._master(t, pin)
                        self.slots.append((owner, name, is_param, made[id(t)]))
        self.down()

    def _master(self, t: torch.Tensor, pin: bool) -> torch.Tensor:
        if pin and self.why_not_pinned is None:
            try:
                return to_host(t.detach(), pin=True)
            except RuntimeError as exc:  # the host could not lock the memory: pageable masters, said so
                self.why_not_pinned = f"pinning the host masters failed ({str(exc).splitlines()[0][:120]}); pageable"
        return t.detach().to("cpu")

    def _set(self, device: torch.device | None) -> None:
        for owner, name, is_param, master in self.slots:
            t = master if device is None else master.to(device, non_blocking=True)
            if is_param:
                param = owner._parameters[name]
                assert param is not None  # slots hold only the parameters that exist
                param.data = t
            else:
                owner._buffers[name] = t

    def up(self, device: torch.device) -> None:
        self._set(device)

    def down(self) -> None:
        self._set(None)


@dataclass
class TextEncoderPlacement:
    module: torch.nn.Module
    setting: str
    device: torch.device
    host: torch.device
    hooks: list = field(default_factory=list)
    """(module, hook name) of its hooks in registration order (install/hooks.py); `restore` removes them, last first."""
    moves: deque = field(default_factory=lambda: deque(maxlen=4096))
    """(part name, device) of the latest moves, what a test reads: bounded, since a server places once and calls
    without end (one `host` encode of 64 layers makes 132)."""
    hooked: bool = False
    masters: dict = field(default_factory=dict)
    """part name -> _Masters of what moves (offload_after: the whole conditioner; host: each streamed part)."""

    def attach(self, module: torch.nn.Module, fqn: str, name: str, part: torch.nn.Module) -> None:
        """A hook `h3plan.text_encoder` on `module`: `part` up to the device for its forward, back to the host after it,
        also when the forward raises (an encode that fails leaves nothing on the device)."""

        def moved(previous, *args, **kwargs):
            self._move(name, part, self.device)
            try:
                return previous(*args, **kwargs)
            finally:
                self._move(name, part, self.host)

        attach(module, fqn, LEVER, moved, self, replaces=False)

    def _move(self, name: str, part: torch.nn.Module, device: torch.device) -> None:
        m = self.masters.get(name)
        if m is None:
            part.to(device)
        elif device == self.host:
            m.down()
        else:
            m.up(device)
        self.moves.append((name, str(device)))

    @property
    def why_not_pinned(self) -> str | None:
        return next((m.why_not_pinned for m in self.masters.values() if m.why_not_pinned), None)

    def restore(self) -> None:
        """Every hook removed, the last first; the first, on the conditioner itself, puts it back on the device it was
        on before `place` (`_release`)."""
        remove_all(self)

    def _release(self) -> None:
        if self.hooked:
            self.module.__dict__.pop("_hf_hook", None)
        for m in self.masters.values():
            m.down()
        self.masters.clear()
        self.module.to(self.host)
        self.module.__dict__.pop(_STATE, None)

    @property
    def line(self) -> str:
        where = {"resident": f"on {self.device} for every call",
                 "offload_after": (f"moved to {self.device} for the encode and back to {self.host} after it, in "
                                   "the call"),
                 "host": f"on {self.host}, its parts moved to {self.device} one at a time for the encode"}[self.setting]
        pinned = ("" if self.setting == "resident" or self.device.type != "cuda" else
                  f"; host masters {'pageable: ' + self.why_not_pinned if self.why_not_pinned else 'pinned'}")
        return f"{self.setting} (the plan's memory.text_encoder): {where}{pinned}"


def _parts(module) -> list[tuple[str, torch.nn.Module]]:
    """The parts `host` streams: the vision tower, each decoder layer, the final norm (the token embedding stays on
    the host: its lookup runs there and only the looked-up rows go to the device)."""
    model = module.model
    lm = model.language_model
    return ([("visual", model.visual)] + [(f"layers.{i}", layer) for i, layer in enumerate(lm.layers)]
            + [("norm", lm.norm)])


def placed(module) -> TextEncoderPlacement | None:
    return module.__dict__.get(_STATE) if module is not None else None


def place(module, setting: str, device) -> TextEncoderPlacement:
    """Make the conditioner `module` (Qwen3VLForConditionalGeneration) sit as the plan says (module docstring).
    Placing an already placed conditioner is an InstallError: restore() it first."""
    if setting not in PLACED:
        raise InstallError(f"text encoder placement {setting!r}: one of {', '.join(PLACED)} (none: prompt_embeds "
                           "given, nothing to place)")
    if not hasattr(module, "model") or not hasattr(getattr(module, "model"), "language_model"):
        raise InstallError(f"text encoder: a Qwen3VLForConditionalGeneration is expected, got {type(module).__name__}")
    before = placed(module)
    if before is not None:
        raise InstallError(f"text encoder already placed ({before.setting}); restore() it first")
    device = torch.device(device)
    host = next(module.parameters()).device
    if setting != "resident" and host.type != "cpu":
        host = torch.device("cpu")
    p = TextEncoderPlacement(module, setting, device, host)
    effect(module, LEVER, p, p._release, fqn="text_encoder")
    if setting == "resident":
        p._move("text_encoder", module, device)
    elif setting == "offload_after":
        p.masters["text_encoder"] = _Masters([module], pin=device.type == "cuda")  # copied from where it is, then down
        p.moves.append(("text_encoder", str(host)))
        p.attach(module.model, "model", "text_encoder", module)
    else:
        parts = _parts(module)
        pin = device.type == "cuda"
        made: dict[int, torch.Tensor] = {}
        for name, part in parts:  # the masters first, copied from where the parts are (a device-built one: one DMA)
            p.masters[name] = _Masters([part], pin=pin and not any(m.why_not_pinned for m in p.masters.values()),
                                       made=made)  # a tensor two parts share: one master
        p._move("text_encoder", module, host)  # the rest: the token table, the rotary tables, the unused lm_head
        module.model.language_model.rotary_emb.to(device)  # its tables only (no weights)
        embed = module.model.language_model.embed_tokens  # the lookup runs on the host: its rows go, not the table

        def lookup(previous, *args, **kwargs):
            return previous(*(x.to(host) for x in args), **kwargs).to(device)

        attach(embed, "model.language_model.embed_tokens", LEVER, lookup, p, replaces=False)
        for name, part in parts:
            p.attach(part, name, name, part)
    if setting != "resident":
        module.__dict__["_hf_hook"] = _ExecutionHook(device)
        p.hooked = True
    module.__dict__[_STATE] = p
    return p


__all__ = ["place", "placed", "TextEncoderPlacement", "PLACED"]
