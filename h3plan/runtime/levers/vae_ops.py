"""vae_ops' runtime (its plan: levers/vae_ops.py): the VAE decoder block's sites (runtime/vae_sites.py) through the
exact kernels of h3plan/runtime/kernels/vae.py and swiglu.py (SPEC.kernels, `vae_<op>`), each call behind the kernel's
check and counted under `vae_ops.<op>`: one per block call for the norm + RoPE and the SwiGLU, two for the scaled
residual. A refused call runs diffusers' expression, exact, at diffusers' speed; a block whose attention processor is
not diffusers' runs its attention module whole and counts the norm + RoPE's fallback with the reason.

At install, `settle` keeps the planned ops whose kernel takes the dtype the decode runs in (the block linears' dtype
after vae_precision's cast), so a planned decode never falls back per call; the others keep diffusers' expressions,
reported at install."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from h3plan.levers import counter
from h3plan.runtime.guards import count_route, run_guarded
from h3plan.runtime.kernels import swiglu, vae as kvae
from h3plan.runtime.kernels.table import kernel, ops as kernel_ops
from h3plan.runtime.vae_sites import VaeBlockSites, eager_activate, eager_norm_rope, scaled_residual

# op -> where in a decoder block the swap log puts it (after the block's fqn); the ops of levers/vae_ops.py OPS
WHERE = {"qk_norm_rope": ".attn.norm_q/norm_k+rope", "swiglu": ".ff.net.0 swiglu",
         "scaled_residual": " scaled residual"}
COUNTERS = {op: counter("ops", op) for op in WHERE}


def dtypes() -> dict[str, tuple]:
    """op -> the activation dtypes its kernel takes (declared beside each kernel, read at install)."""
    return {"qk_norm_rope": kvae.QK_DTYPES, "swiglu": swiglu.VAE_DTYPES, "scaled_residual": kvae.RESIDUAL_DTYPES}


def settle(options: Mapping[str, Any], dtype) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """(the options with the planned ops whose kernel takes `dtype`, (op, why) for each op left to diffusers)."""
    supported = dtypes()
    planned = options["ops"]
    ops = tuple(op for op in planned if dtype in supported[op])
    left = [(op, f"the decoder computes in {dtype} and the {op} kernel takes "
                 f"{'/'.join(str(d).replace('torch.', '') for d in supported[op])}: "
                 "diffusers' expression kept (no per-call fallback)") for op in planned if op not in ops]
    return {**options, "ops": ops}, left


def swaps(options: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(where after the block's fqn, old, new) for each fused op, logged once per decoder block."""
    return [(where, "eager", "fused") for op, where in WHERE.items() if op in options["ops"]]


def wrap(sites: VaeBlockSites, options: Mapping[str, Any], kernels: dict[str, Any]) -> VaeBlockSites:
    """The sites of the ops in options["ops"] through their kernels, which `kernels` takes (op -> (fn, check))."""
    ops = options["ops"]
    kernels.update({op: kernel(f"vae_{op}") for op in ops if f"vae_{op}" in kernel_ops()})
    if "qk_norm_rope" in ops:
        sites = replace(sites, norm_rope=_norm_rope(kernels), refused=_refused)
    if "swiglu" in ops:
        sites = replace(sites, activate=_activate(kernels))
    if "scaled_residual" in ops:
        sites = replace(sites, residual=_residual(kernels))
    return sites


def _refused(reason: str) -> None:
    count_route(COUNTERS["qk_norm_rope"], reason)


def _norm_rope(kernels):
    def norm_rope(attn, q, k, rotary_emb):
        fn, check = kernels["qk_norm_rope"]
        eps = attn.norm_q.eps

        def guard():
            if rotary_emb is None:
                return "no rotary embedding"
            if eps is None or attn.norm_k.eps != eps:
                return f"norm_q/norm_k eps {eps!r}/{attn.norm_k.eps!r}: the kernel takes one explicit eps"
            return check(q, k, rotary_emb[0], rotary_emb[1], eps)

        return run_guarded(COUNTERS["qk_norm_rope"], guard, lambda: fn(q, k, rotary_emb[0], rotary_emb[1], eps),
                           lambda: eager_norm_rope(attn, q, k, rotary_emb), (q, k))

    return norm_rope


def _activate(kernels):
    def activate(ff, proj):
        fn, check = kernels["swiglu"]
        return run_guarded(COUNTERS["swiglu"], lambda: check(proj), lambda: fn(proj),
                           lambda: eager_activate(ff, proj), (proj,))

    return activate


def _residual(kernels):
    def residual(h, y, scale):
        fn, check = kernels["scaled_residual"]
        return run_guarded(COUNTERS["scaled_residual"], lambda: check(h, y, scale), lambda: fn(h, y, scale),
                           lambda: scaled_residual(h, y, scale), (h, y, scale))

    return residual
