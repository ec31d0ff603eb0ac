"""The library internals a script under benchmarks/ times, patches or rebuilds, named here once: the kernels (each
module with its `<op>_ref`), the cuDNN backend, the VAE install's precision cast and parallel decode, the hardware
facts, the memory model, a plan made from decisions: exactly what benchmarks/ imports from here. A rename fails
tests/docs/test_apparatus.py (it imports this module) on a CPU instead of a probe in a GPU session. Imports torch and
Triton.
"""

from h3plan.facts import hardware
from h3plan.runtime.schedule import timestep_vectors
from h3plan.install.vae import parallel as vae_parallel
from h3plan.install.vae.weights import DTYPES as VAE_DTYPES
from h3plan.install.vae.weights import PrecisionCast
from h3plan.planner import make_plan
from h3plan.planning import memory
from h3plan.runtime.attention import block_sparse, cudnn, get_backend
from h3plan.runtime.kernels import _rmsnorm as rmsnorm
from h3plan.runtime.kernels import (block_router, fp8, fp8_producers, gated_residual, modulation, nvfp4,
                                    nvfp4_producers,
                                    qk_fp8_lean, qk_norm_rope, swiglu, ulysses_merge, vae)
from h3plan.runtime.quant import fp8_rowwise

__all__ = ["hardware", "get_backend", "vae_parallel", "VAE_DTYPES", "PrecisionCast", "make_plan", "memory", "cudnn",
           "rmsnorm", "fp8", "fp8_producers", "gated_residual", "modulation", "nvfp4", "nvfp4_producers",
           "qk_fp8_lean", "qk_norm_rope", "swiglu", "ulysses_merge", "vae", "fp8_rowwise", "block_router",
           "block_sparse",
           "timestep_vectors"]
