"""The kernel op a lever names (`SPEC.kernels`) -> its public function and its `<op>_check`, imported.

Levers sit below the runtime and name their ops only; this table is where an op meets its Triton kernel, through
plain imports an IDE and a type checker follow. Each entry reads its module's attributes when an install asks
(`kernel(op)`), not when this module is imported: a function or check patched on its module (a test's refusing
guard, a probe's variant) is the one installed. tests/install/test_kernel_table.py holds the table to the levers'
ops, both ways.
"""

from __future__ import annotations

from typing import Callable

from h3plan.runtime.kernels import (block_router, fp8_producers, gated_residual, modulation, nvfp4, nvfp4_producers,
                                    qk_fp8_lean, qk_norm_rope, swiglu, vae)

Pair = tuple[Callable, Callable]  # (public fn, check fn: None when it takes the call, else the reason it refuses)

KERNELS: dict[str, Callable[[], Pair]] = {
    "modulation": lambda: (modulation.rmsnorm_modulate, modulation.rmsnorm_modulate_check),
    "gated_residual": lambda: (gated_residual.gated_residual, gated_residual.gated_residual_check),
    "swiglu": lambda: (swiglu.swiglu, swiglu.swiglu_check),
    "qk_norm_rope": lambda: (qk_norm_rope.qk_norm_rope, qk_norm_rope.qk_norm_rope_check),
    # the lean FP8 cast: the bits of a two-pass norm + RoPE + cast in fewer instructions (0.95 vs 1.21 ms dynamic at
    # 19,000 on the H200, bit-identical: benchmarks/results/probes/fp8-producers-h200.json)
    "qk_norm_rope_fp8": lambda: (qk_fp8_lean.qk_norm_rope_fp8_lean, qk_fp8_lean.qk_norm_rope_fp8_lean_check),
    "rmsnorm_modulate_fp8": lambda: (fp8_producers.rmsnorm_modulate_fp8, fp8_producers.rmsnorm_modulate_fp8_check),
    "swiglu_fp8": lambda: (fp8_producers.swiglu_fp8, fp8_producers.swiglu_fp8_check),
    "cast_rows_fp8": lambda: (fp8_producers.cast_rows_fp8, fp8_producers.cast_rows_fp8_check),
    "rmsnorm_modulate_nvfp4": lambda: (nvfp4_producers.rmsnorm_modulate_nvfp4,
                                       nvfp4_producers.rmsnorm_modulate_nvfp4_check),
    "gated_residual_modulate_nvfp4": lambda: (nvfp4_producers.gated_residual_modulate_nvfp4,
                                              nvfp4_producers.gated_residual_modulate_nvfp4_check),
    "swiglu_nvfp4": lambda: (nvfp4_producers.swiglu_nvfp4, nvfp4_producers.swiglu_nvfp4_check),
    "cast_nvfp4": lambda: (nvfp4.cast_nvfp4, nvfp4.cast_nvfp4_check),
    "vae_qk_norm_rope": lambda: (vae.vae_qk_norm_rope, vae.vae_qk_norm_rope_check),
    "vae_swiglu": lambda: (swiglu.swiglu, swiglu.vae_swiglu_check),
    "vae_scaled_residual": lambda: (vae.scaled_residual, vae.scaled_residual_check),
    "block_router": lambda: (block_router.block_router, block_router.block_router_check),
}


def kernel(op: str) -> Pair:
    """(public fn, check fn) of a kernel op a lever names."""
    return KERNELS[op]()


__all__ = ["KERNELS", "Pair", "kernel"]
