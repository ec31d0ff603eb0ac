"""Checkpoint quantization of the transformer blocks' linears (the `gemm_quant` lever).

Only the six block linears are quantised; the AdaLN projections (`adaln_proj`), norms, input/output
heads (`proj_in`, `proj_out`, audio heads), the timestep MLP and the token refiner keep diffusers'
dtypes. FP8: h3plan.quant.fp8 (SM89+ GEMM, CPU emulation). NVFP4: h3plan.quant.nvfp4 (SM100+ GEMM,
never run on hardware; emulated elsewhere).
"""

from __future__ import annotations

# Relative to a MiniMaxH3TransformerBlock.
BLOCK_LINEARS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")


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


__all__ = ["BLOCK_LINEARS", "quantized_linear", "load_fp8_checkpoint"]
