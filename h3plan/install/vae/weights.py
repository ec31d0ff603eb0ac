"""vae_precision: the VAE cast to the planned decode dtype, as `from_pretrained(torch_dtype=...)` casts it.

Scope: every floating parameter and buffer of AutoencoderKLMiniMaxH3 whose dotted name has no component in
the class's `_keep_in_fp32_modules` (diffusers' loading rule, model_loading_utils: encoder, quant_conv,
norm1, norm2, norm_out, scale1, scale2 stay float32). The same Parameter objects stay registered; only their
data changes (computed on their own device), so `state_dict()`, `parameters()`, `vae.dtype` and
`save_pretrained` see the planned dtype while the plan is installed, exactly as for a VAE loaded in it.

The originals move to host memory (pinned when they were on CUDA) and are read only by `restore()`
(uninstall), which copies them back bit for bit: no call ever reads them, so every decode runs at the
device speed of the planned dtype, and no route falls back onto host memory.

Only a float32 VAE is cast (diffusers' released dtype). A VAE loaded in another dtype keeps it (the plan
says why: casting float16 weights to bfloat16 would round them twice, and an upcast would not give the
float32 checkpoint back); its decode is then the user's own, lossless against it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from h3plan.runtime.guards import GRAD_REASON

from h3plan.install.parking import to_host

logger = logging.getLogger("h3plan.install")
FP16 = torch.float16
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def keeps_fp32(model, name: str) -> bool:
    """diffusers' rule: a state-dict entry stays float32 when a `_keep_in_fp32_modules` name is one of its
    components."""
    keep = getattr(model, "_keep_in_fp32_modules", None) or ()
    parts = name.split(".")
    return any(k in parts for k in keep)


def castable(model) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of the floating parameters and buffers `torch_dtype` would cast."""
    out = [(n, p) for n, p in model.named_parameters()] + [(n, b) for n, b in model.named_buffers()]
    return [(n, t) for n, t in out if t.is_floating_point() and not keeps_fp32(model, n)]


ENCODE_MODULES = ("encoder", "quant_conv")  # what AutoencoderKLMiniMaxH3._encode_clip runs: quant_conv(encoder(x))


def encode_tensors(model) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of the floating parameters and buffers of the encode path (encoder, quant_conv): what
    vae_encode_precision casts. All of them are in `_keep_in_fp32_modules`, so the decode's cast never touches them."""
    out = [(f"{m}.{n}", t) for m in ENCODE_MODULES if isinstance(getattr(model, m, None), torch.nn.Module)
           for n, t in [*getattr(model, m).named_parameters(), *getattr(model, m).named_buffers()]]
    return [(n, t) for n, t in out if t.is_floating_point()]


def encode_blocker(model, dtype: torch.dtype) -> str | None:
    """Why the encode path is not cast to `dtype` (None: cast it)."""
    ts = encode_tensors(model)
    if not ts:
        return "the VAE has no encoder / quant_conv: nothing encodes"
    have, devices = {t.dtype for _, t in ts}, {t.device for _, t in ts}
    if have == {dtype}:
        return None
    if have != {torch.float32}:
        return (f"the encoder is {'/'.join(sorted(str(d).replace('torch.', '') for d in have))}, not float32 "
                "(diffusers loads it float32 under _keep_in_fp32_modules): it keeps that dtype")
    if len(devices) != 1 or next(iter(devices)).type == "meta":
        return f"encoder tensors on {sorted(map(str, devices))}: the cast needs them loaded on one device"
    return None


def blocker(model, dtype: torch.dtype) -> str | None:
    """Why the VAE is not cast to `dtype` (None: cast it)."""
    ts = castable(model)
    have = {t.dtype for _, t in ts}
    devices = {t.device for _, t in ts}
    if have == {dtype}:
        return None
    if have != {torch.float32}:
        return (f"the VAE was loaded in {'/'.join(sorted(str(d).replace('torch.', '') for d in have))}, not float32: "
                "it keeps that dtype (a cast from it would round twice, and an upcast would not give the float32 "
                "checkpoint back); its decode stays the one it was loaded for")
    if len(devices) != 1 or next(iter(devices)).type == "meta":
        return f"VAE tensors on {sorted(map(str, devices))}: the cast needs them loaded on one device"
    return None


@dataclass
class PrecisionCast:
    """The cast as installed: (tensor, its original on the host) per cast tensor."""

    dtype: torch.dtype
    slots: list  # (Parameter or buffer tensor, host original, device it was on)
    pinned: bool = False

    @classmethod
    def apply(cls, model, dtype: torch.dtype, move=None, tensors=None) -> "PrecisionCast":
        """move: t -> the tensor on the install device (install(..., device=) of a VAE loaded on the host streams
        each tensor there just before its cast, so the device never holds the float32 VAE whole). tensors: the
        (name, tensor) pairs to cast (None: castable(model), the decode's cast)."""
        cast = cls(dtype, [])
        try:
            with torch.no_grad():
                for _, t in (castable(model) if tensors is None else tensors):
                    if t.dtype == dtype:
                        continue
                    t = t if move is None else move(t)
                    pinned = t.device.type == "cuda"
                    host = to_host(t.detach(), pinned)
                    cast.pinned = cast.pinned or pinned
                    t.data = t.detach().to(dtype)  # the old device tensor is freed here
                    cast.slots.append((t, host, t.device))
        except BaseException:
            cast.restore()
            raise
        return cast

    @property
    def host_bytes(self) -> int:
        return sum(h.numel() * h.element_size() for _, h, _ in self.slots)

    @property
    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t, _, _ in self.slots)

    def restore(self) -> None:
        """Uninstall: the originals' bits and dtype back into the same tensors, on the device each is on now."""
        with torch.no_grad():
            for t, host, _ in self.slots:
                if t.dtype != self.dtype:
                    logger.warning("uninstall vae_precision: a tensor was cast to %s while installed; restoring the "
                                   "original", t.dtype)
                t.data = host.to(t.device)
        self.slots = []


def fp16_compute_reason(x, device: torch.device, weight_dtype: torch.dtype) -> str | None:
    """None when the decoder blocks compute this call in float16 on `device` with no autograd for x: FP16
    autocast is on, or autocast is off and the block linears are float16 (the VAE loaded in, or cast to,
    float16). The FP8 GEMMs (fp8.py) stand in for those float16 GEMMs only."""
    if not isinstance(x, torch.Tensor):
        return f"input is {type(x).__name__}, not a tensor"
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        if torch.get_autocast_dtype(dev) != FP16:
            return f"autocast dtype {torch.get_autocast_dtype(dev)} != float16"
    elif weight_dtype != FP16:
        return (f"the decoder block linears are {weight_dtype} and autocast is off: the decoder computes in "
                f"{weight_dtype}")
    if x.device != device:
        return f"input on {x.device}, weights on {device}"
    if torch.is_grad_enabled() and x.requires_grad:
        return GRAD_REASON
    return None
