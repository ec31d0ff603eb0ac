"""`h3plan.plan_for(what_you_have, recipe=..., parallel=..., video=...)`: a plan for the model you hold.

The widths come from the components' own configs (h3plan/planning/checkpoint.py: a MiniMaxH3Transformer3DModel, an
AutoencoderKLMiniMaxH3, a pipeline holding them, or a local checkpoint folder); a component whose config is a
packaged option's (conf/model/h3_tiny.yaml ...) plans under that option's name. The hardware comes from the
device: its compute capability picks the packaged `hardware` group (conf/hardware/*.yaml
`compute_capability`), its total memory replaces `hardware.device.memory_gb`. `hardware=` plans for that
group instead and touches no device (what a CPU machine must do). Everything else is the packaged config
with `recipe`, `parallel`, `video` and `**overrides` (`**{"levers.attention": "sdpa"}`), as resolve_config.

A transformer alone or a VAE alone plans the memory of what it will install only (`memory.holds=transformer|vae`:
no decode for a lone transformer; no denoise, no audio VAE for a lone VAE), not a pipeline's.
"""

from __future__ import annotations

from typing import Any

from h3plan.errors import UsageError
from h3plan.facts import hardware as hw
from h3plan.planner import resolve
from h3plan.planning import checkpoint
from h3plan.planning.config import compose

SECTIONS = ("model", "vae")


def _known() -> str:
    return ", ".join(f"{n} {hw.load(n)['compute_capability']}" for n in hw.names())


def detect(device: str | None = None) -> tuple[str, dict[str, Any]]:
    """(hardware group, {memory_gb, source}) of a CUDA device (None: the current one); UsageError when there is
    no CUDA device or none of the packaged groups describes it."""
    hint = f"pass hardware=<group> to plan without one ({_known()})"
    try:
        import torch
    except ImportError:
        raise UsageError(f"h3plan.plan_for reads the hardware from a CUDA device and torch is not installed; "
                         f"{hint}") from None
    if not torch.cuda.is_available():
        raise UsageError(f"h3plan.plan_for reads the hardware from a CUDA device and this machine has none; {hint}")
    index = torch.device(device).index if device is not None else None
    index = torch.cuda.current_device() if index is None else index
    cc = tuple(torch.cuda.get_device_capability(index))
    props = torch.cuda.get_device_properties(index)
    facts = hw.for_capability(cc)
    if facts is None:
        raise UsageError(f"cuda:{index} ({props.name}) has compute capability {cc[0]}.{cc[1]}, which no packaged "
                         f"hardware config describes ({_known()}); pass hardware=<group> to plan for one of them")
    gb = round(props.total_memory / 1e9, 1)
    source = (f"memory_gb: torch.cuda.get_device_properties({index}).total_memory of {props.name} (h3plan.plan_for); "
              f"the rest: {facts['device']['source']}")
    return facts["name"], {"memory_gb": gb, "source": source}


def _refuse_read_keys(overrides: dict[str, Any], comps: checkpoint.Components) -> None:
    if "model.path" in overrides:
        raise UsageError(f"h3plan.plan_for reads the model you pass it; pass the folder itself instead of "
                         f"model.path={overrides['model.path']}")
    for key in overrides:
        section = key.split(".", 1)[0]
        if section in comps.configs and (key == section or key.startswith(f"{section}.diffusers_config")):
            raise UsageError(f"h3plan.plan_for reads {section}.diffusers_config from {comps.where[section]}; "
                             f"drop {key}={overrides[key]}")


def plan_for(obj, recipe: str | None = None, parallel: str | None = None, video: str | None = None, *,
             hardware: str | None = None, device: str | None = None, **overrides):
    """The Plan for `obj` (module docstring). device: the CUDA device to read (default: where obj's weights
    are, else the current device). Raises H3PlanError (one line) on anything it cannot read or plan."""
    comps = checkpoint.read(obj)
    _refuse_read_keys(overrides, comps)
    choices = {"hardware": hardware, "recipe": recipe, "parallel": parallel, "video": video}
    for section in SECTIONS:
        if section in comps.configs:
            choices[section] = checkpoint.packaged_match(section, comps.configs[section]) or "h3"
    detected = None
    if hardware is None:
        choices["hardware"], detected = detect(device or comps.device)
    held = [s for s in SECTIONS if s in comps.configs]
    if len(held) == 1 and "memory.holds" not in overrides:  # one component, not a pipeline or a checkpoint folder
        overrides = {**overrides, "memory.holds": {"model": "transformer", "vae": "vae"}[held[0]]}
    args = {**{k: v for k, v in choices.items() if v is not None}, **overrides}
    cfg = compose([f"{k}={v}" for k, v in args.items()])
    checkpoint.fill(cfg, comps)
    if comps.folder is not None and "model" in comps.configs:
        cfg.model.path = comps.folder
    if detected is not None and "hardware.device.memory_gb" not in overrides:  # the user's number wins
        for k, v in detected.items():
            cfg.hardware.device[k] = v
    return resolve(cfg)
