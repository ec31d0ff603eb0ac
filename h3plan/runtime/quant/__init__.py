"""Checkpoint quantization of the transformer blocks' linears (the `gemm_quant` lever).

Only the six block linears are quantised; the AdaLN projections (`adaln_proj`), norms, input/output
heads (`proj_in`, `proj_out`, audio heads), the timestep MLP and the token refiner keep diffusers'
dtypes. FP8: h3plan.runtime.quant.fp8 (GEMM where hardware.gemm.fp8, CPU emulation). NVFP4:
h3plan.runtime.quant.nvfp4 (GEMM where hardware.gemm.nvfp4, never run on hardware; emulated elsewhere).
"""

from __future__ import annotations

from h3plan.errors import InstallError, UsageError
from h3plan.facts.blocks import BLOCK_LINEARS


def quantized_linear(linear, fmt: str, params: dict | None = None):
    """The quantised replacement of one nn.Linear. params (fp8): scaling 'channel'|'tensor', fast_accum."""
    params = dict(params or {})
    if fmt == "fp8":
        from .fp8 import FP8Linear

        return FP8Linear.from_linear(linear, scaling=params.get("scaling", "channel"),
                                     fast_accum=bool(params.get("fast_accum", False)))
    if fmt == "nvfp4":
        from .nvfp4 import NVFP4Linear

        return NVFP4Linear.from_linear(linear)
    raise ValueError(f"unknown linear format {fmt!r} (fp8 | nvfp4)")


def load_fp8_checkpoint(model, state_dict) -> list[str]:
    """Swap each block linear of a MiniMaxH3Transformer3DModel for FP8Linear.from_quantized, from a
    pre-quantised checkpoint's `<fqn>.weight` (e4m3) and `<fqn>.weight_scale` (dequantisation scale, 1 or
    N values; `<fqn>.bias` if any). Returns the swapped fqns. A later install of a gemm_quant=fp8 plan
    keeps these modules (uninstall does not turn them back into nn.Linear: they were loaded, not installed).
    """
    from .fp8 import FP8Linear

    done = []
    for i, block in enumerate(model.transformer_blocks):
        for path in BLOCK_LINEARS:
            fqn = f"transformer_blocks.{i}.{path}"
            if f"{fqn}.weight_scale" not in state_dict:
                raise KeyError(f"{fqn}.weight_scale missing: not an FP8 checkpoint of this model")
            parent_path, _, name = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            old = getattr(parent, name)
            new = FP8Linear.from_quantized(state_dict[f"{fqn}.weight"].to(old.weight.device),
                                           state_dict[f"{fqn}.weight_scale"], state_dict.get(f"{fqn}.bias"))
            if (new.out_features, new.in_features) != (old.out_features, old.in_features):
                raise ValueError(f"{fqn}: checkpoint weight {tuple(new.weight.shape)} does not fit "
                                 f"({old.out_features}, {old.in_features})")
            setattr(parent, name, new)
            done.append(fqn)
    return done


NVFP4_KEYS = ("weight", "weight_scale", "weight_scale_2", "input_scale")  # a ModelOpt NVFP4 linear (+ bias)


def read_state_dict(source) -> dict:
    """A state dict, or one read from a .safetensors file (safetensors) or a torch.save file (weights only)."""
    import os

    if isinstance(source, dict):
        return source
    path = os.fspath(source)
    if not os.path.isfile(path):
        raise UsageError(f"checkpoint {path}: no such file")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(path)
        import torch

        return torch.load(path, map_location="cpu", weights_only=True)
    except ImportError:
        raise UsageError(f"checkpoint {path}: reading .safetensors needs the safetensors package") from None
    except Exception as exc:
        raise UsageError(f"checkpoint {path}: cannot read it ({type(exc).__name__}: {exc})") from None


def _nvfp4_linear(fqn: str, sd: dict, old):
    """NVFP4Linear from one ModelOpt NVFP4 linear's tensors; InstallError naming the first malformed tensor."""
    import torch

    from h3plan.runtime.kernels.nvfp4 import BLOCK, E4M3

    from .nvfp4 import NVFP4Linear

    N, K = old.out_features, old.in_features
    want = {"weight": (torch.uint8, (N, K // 2)), "weight_scale": (E4M3, (N, K // BLOCK)),
            "weight_scale_2": (torch.float32, ()), "input_scale": (torch.float32, ())}
    got = {}
    for key, (dtype, shape) in want.items():
        t = sd.get(f"{fqn}.{key}")
        if not isinstance(t, torch.Tensor):
            raise InstallError(f"NVFP4 checkpoint: {fqn}.{key} missing (a ModelOpt NVFP4 linear has "
                               f"{', '.join(NVFP4_KEYS)})")
        scalar = shape == () and t.numel() == 1
        if t.dtype != dtype or not (scalar or tuple(t.shape) == shape):
            raise InstallError(f"NVFP4 checkpoint: {fqn}.{key} is {t.dtype} {tuple(t.shape)}, expected {dtype} "
                               f"{shape or '1 element'} for a ({N}, {K}) linear")
        if scalar and not (torch.isfinite(t).all() and (t > 0).all()):
            raise InstallError(f"NVFP4 checkpoint: {fqn}.{key} = {t.reshape(-1)[0].item()!r} is not finite and > 0")
        got[key] = t
    if K % (2 * BLOCK):
        raise InstallError(f"NVFP4 checkpoint: {fqn} has K={K}, not a multiple of {2 * BLOCK}")
    bias = sd.get(f"{fqn}.bias")
    if (bias is None) != (old.bias is None) or (bias is not None and tuple(bias.shape) != (N,)):
        raise InstallError(f"NVFP4 checkpoint: {fqn}.bias {'missing' if bias is None else tuple(bias.shape)}, the "
                           f"model's linear has {'no bias' if old.bias is None else f'a bias of {N}'}")
    dev = old.weight.device
    return NVFP4Linear(got["weight"].to(dev), got["weight_scale"].to(dev), got["weight_scale_2"].to(dev),
                       None if bias is None else bias.to(dev, old.bias.dtype), got["input_scale"].to(dev))


def load_nvfp4_checkpoint(model, source) -> list[str]:
    """Swap each block linear of a MiniMaxH3Transformer3DModel for an NVFP4Linear read from a ModelOpt NVFP4
    export: per linear `<fqn>.weight` (uint8 (N, K/2), packed e2m1), `.weight_scale` (e4m3 (N, K/16)),
    `.weight_scale_2` (fp32, 1 element), `.input_scale` (fp32, 1 element: the activation's static global scale),
    `.bias` if the model's linear has one. source: a state dict or a .safetensors / torch.save file. Every tensor
    is checked before any module is swapped; a malformed checkpoint raises InstallError (one line). Returns the
    swapped fqns. A later install of a gemm_quant=nvfp4 plan keeps these modules."""
    sd = read_state_dict(source)
    new = []
    for i, block in enumerate(model.transformer_blocks):
        for path in BLOCK_LINEARS:
            parent_path, _, name = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            fqn = f"transformer_blocks.{i}.{path}"
            new.append((parent, name, fqn, _nvfp4_linear(fqn, sd, getattr(parent, name))))
    for parent, name, _, lin in new:
        setattr(parent, name, lin)
    return [fqn for _, _, fqn, _ in new]


__all__ = ["BLOCK_LINEARS", "NVFP4_KEYS", "quantized_linear", "load_fp8_checkpoint", "load_nvfp4_checkpoint",
           "read_state_dict"]
