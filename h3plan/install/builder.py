"""The builder levers record their options on (docs/architecture.md, "Lever install protocol").

A lever's `install(builder, decision)` only records; `h3plan.install.installer` swaps modules once every
lever has spoken. Option keys and values are the contract between levers and installer: an unknown key,
a bad value or two levers disagreeing on one key raise ValueError at once, naming the levers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BACKENDS = ("sdpa", "cudnn_bf16", "cudnn_fp8", "fa4")

def _is_tile(v: Any) -> bool:
    return (isinstance(v, dict) and set(v) == {"tile_m", "tile_n", "mma_pv_is_rs", "intra_wg_overlap"}
            and all(isinstance(v[k], int) and not isinstance(v[k], bool) and v[k] > 0 for k in ("tile_m", "tile_n"))
            and all(isinstance(v[k], bool) for k in ("mma_pv_is_rs", "intra_wg_overlap")))


# key -> validator (value -> bool) with a description of the allowed values.
BLOCK_KEYS = {
    "modulation": (lambda v: v in ("eager", "exact", "fp32"), "'eager' | 'exact' | 'fp32'"),
    "gated_residual": (lambda v: isinstance(v, bool), "bool"),
    "swiglu": (lambda v: isinstance(v, bool), "bool"),
}
ATTENTION_KEYS = {
    "backend": (lambda v: v in BACKENDS, " | ".join(repr(b) for b in BACKENDS)),
    "fa4_2cta": (lambda v: isinstance(v, bool), "bool"),
    "fa4_tile": (lambda v: v is None or _is_tile(v), "None or dict(tile_m, tile_n: int; mma_pv_is_rs, intra_wg_overlap: bool)"),
    "qk_norm_rope": (lambda v: v in ("eager", "fused", "fused_fp8"), "'eager' | 'fused' | 'fused_fp8'"),
    "fp8_scales": (lambda v: v in ("off", "dynamic", "static"), "'off' | 'dynamic' | 'static'"),
    "scale_table": (lambda v: v is None or isinstance(v, str), "path or None"),
    "scale_margin": (lambda v: isinstance(v, (int, float)) and v > 0, "float > 0"),
    "ulysses_degree": (lambda v: isinstance(v, int) and v >= 1, "int >= 1"),
    "ulysses_padding": (lambda v: v in ("none", "padded", "fixed_valid", "valid_only"), "'none' | 'padded' | 'fixed_valid' | 'valid_only'"),
    "ulysses_chunks": (lambda v: isinstance(v, int) and v >= 1, "int >= 1"),
    "a2a_fp8_codes": (lambda v: isinstance(v, bool), "bool"),
    "prefix_inplace": (lambda v: isinstance(v, bool), "bool"),
}
VAE_KEYS = {
    "vae_ops": (lambda v: isinstance(v, bool), "bool"),
    "graphs": (lambda v: isinstance(v, bool), "bool"),
    "tile": (lambda v: v is None or isinstance(v, dict), "dict(height, width, frames, overlap) or None"),
}
QUANT_FORMATS = ("fp8", "nvfp4")


@dataclass
class Builder:
    """Options collected from the plan's levers, in plan order. `source[(kind, key)]` names the lever."""

    block: dict[str, Any] = field(default_factory=dict)
    attention: dict[str, Any] = field(default_factory=dict)
    vae: dict[str, Any] = field(default_factory=dict)
    quant: tuple[str, str, dict] | None = None  # (lever, fmt, params)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    source: dict[tuple[str, str], str] = field(default_factory=dict)

    def _set(self, kind: str, table: dict, keys: dict, lever: str, key: str, value: Any) -> None:
        if key not in keys:
            raise ValueError(f"lever {lever!r} set unknown {kind} option {key!r}; known: {sorted(keys)}")
        ok, allowed = keys[key]
        if not ok(value):
            raise ValueError(f"lever {lever!r} set {kind} option {key}={value!r}; allowed: {allowed}")
        if key in table and table[key] != value:
            other = self.source[(kind, key)]
            raise ValueError(f"levers {other!r} and {lever!r} disagree on {kind} option {key!r}: {table[key]!r} vs {value!r}")
        table[key] = value
        self.source[(kind, key)] = lever

    def set_block_option(self, lever: str, key: str, value: Any) -> None:
        self._set("block", self.block, BLOCK_KEYS, lever, key, value)

    def set_attention_option(self, lever: str, key: str, value: Any) -> None:
        self._set("attention", self.attention, ATTENTION_KEYS, lever, key, value)

    def set_vae_option(self, lever: str, key: str, value: Any) -> None:
        self._set("vae", self.vae, VAE_KEYS, lever, key, value)

    def quantize_linears(self, lever: str, fmt: str, params: dict | None = None) -> None:
        if fmt not in QUANT_FORMATS:
            raise ValueError(f"lever {lever!r} asked for linear format {fmt!r}; allowed: {QUANT_FORMATS}")
        new = (lever, fmt, dict(params or {}))
        if self.quant is not None and self.quant[1:] != new[1:]:
            raise ValueError(f"levers {self.quant[0]!r} and {lever!r} disagree on linear quantization: {self.quant[1:]} vs {new[1:]}")
        self.quant = new

    def skip(self, lever: str, reason: str) -> None:
        self.skipped.append((lever, str(reason)))

    def lever_of(self, kind: str, key: str) -> str:
        return self.source.get((kind, key), key)
