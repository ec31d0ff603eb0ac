"""qk_norm_rope's runtime (its plan: levers/qk_norm_rope.py): the attention processor's norm + RoPE sites
(runtime/attention_sites.py) through the Triton kernels of h3plan/runtime/kernels/qk_norm_rope.py, each call behind the
kernel's check and counted under this lever's counter; a refused call runs diffusers' modules (`eager_norm_rope`),
or the FP8 cast's torch reference for codes on the Ulysses wire.

- fused: norm + RoPE in one kernel (exact), on whole heads (`norm_rope`), packed destination-major for Ulysses'
  all-to-all (`packed`), per destination in the projection exchange (`project`);
- fused_fp8: the same plus the e4m3 cast with per-tensor scales, codes straight into cudnn_fp8 (`codes`), or onto
  the Ulysses wire (`wire_codes`, with a2a_fp8_codes); with bf16 on the wire, the fused packing above.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

from h3plan.levers import counter
from h3plan.runtime.attention_sites import AttentionSites, eager_norm_rope
from h3plan.runtime.guards import count_route, run_guarded
from h3plan.runtime.kernels.qk_norm_rope import qk_norm_rope_fp8_ref
from h3plan.runtime.kernels.table import kernel

COUNTER = counter("qk_norm_rope")
NORM_REASON = "norm_q/norm_k differ in eps or lack an affine weight"


def option_problems(opts) -> list[str]:
    if opts.a2a_fp8_codes and opts.qk_norm_rope != "fused_fp8":
        return ["a2a_fp8_codes sends the codes of qk_norm_rope=fused_fp8"]
    return []


def call_check(check, *args, **kwargs):
    """Call a kernel's `<op>_check` with the keyword arguments its signature takes."""
    try:
        params = inspect.signature(check).parameters
    except (TypeError, ValueError):
        return check(*args, **kwargs)
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return check(*args, **kwargs)


def _fp8_guard(attn, check, q, k, v, rotary_emb, **kw):
    if rotary_emb is None:
        return "no rotary embedding passed"
    if attn.norm_q.eps != attn.norm_k.eps or attn.norm_q.weight is None or attn.norm_k.weight is None:
        return NORM_REASON
    return call_check(check, q, k, v, attn.norm_q.weight, attn.norm_k.weight, *rotary_emb, attn.norm_q.eps, **kw)


def _sites(kernels) -> dict[str, Any]:
    """The fused sites over the `qk_norm_rope` kernel."""

    def norm_rope(attn, q, k, rotary_emb):
        def eager():
            return eager_norm_rope(attn, q, k, rotary_emb)

        fn, check = kernels["qk_norm_rope"]
        wq, wk = attn.norm_q.weight, attn.norm_k.weight

        def guard():
            if rotary_emb is None:
                return "no rotary embedding passed"
            if attn.norm_q.eps != attn.norm_k.eps or attn.norm_q.eps is None or wq is None or wk is None:
                return NORM_REASON
            return check(q, k, wq, wk, *rotary_emb, attn.norm_q.eps)

        return run_guarded(COUNTER, guard, lambda: fn(q, k, wq, wk, *rotary_emb, attn.norm_q.eps), eager,
                           (q, k, wq, wk))

    def packed(attn, q, k, v, rotary_emb, U):
        fn, check = kernels["qk_norm_rope"]
        wq, wk, eps = attn.norm_q.weight, attn.norm_k.weight, attn.norm_q.eps

        def guard():
            if rotary_emb is None or attn.norm_q.eps != attn.norm_k.eps or wq is None or wk is None:
                return "no rotary embedding, or norm_q/norm_k differ in eps or lack a weight"
            return check(q, k, wq, wk, *rotary_emb, eps, v=v, ulysses_degree=U)

        return run_guarded(COUNTER, guard, lambda: fn(q, k, wq, wk, *rotary_emb, eps, v=v, ulysses_degree=U),
                           lambda: None, (q, k, wq, wk))

    def project_check(*args):
        _, check = kernels["qk_norm_rope"]
        try:
            return check(*args)
        except Exception as exc:  # a guard must never take the forward down
            return f"{type(exc).__name__} in the qk_norm_rope check: {exc}"

    def project(*args):
        return kernels["qk_norm_rope"][0](*args)

    def projected():
        count_route(COUNTER, None)

    return dict(norm_rope=norm_rope, packed=packed, project_check=project_check, project=project,
                projected=projected)


def _codes(kernels):
    def codes(attn, q, k, v, rotary_emb, scales):
        """Degree 1: norm + RoPE + e4m3 cast in one kernel."""
        fn, check = kernels["qk_norm_rope_fp8"]
        wq, wk, eps = attn.norm_q.weight, attn.norm_k.weight, attn.norm_q.eps

        def eager():
            return (*eager_norm_rope(attn, q, k, rotary_emb), v, None)

        return run_guarded(COUNTER, lambda: _fp8_guard(attn, check, q, k, v, rotary_emb, scales=scales),
                           lambda: fn(q, k, v, wq, wk, *rotary_emb, eps, scales=scales), eager, (q, k, v, wq, wk))

    def wire_codes(attn, q, k, v, rotary_emb, **kw):
        """Ulysses: the codes packed for the all-to-all; refused: the cast's torch reference."""
        fn, check = kernels["qk_norm_rope_fp8"]
        wq, wk, eps = attn.norm_q.weight, attn.norm_k.weight, attn.norm_q.eps
        return run_guarded(COUNTER, lambda: _fp8_guard(attn, check, q, k, v, rotary_emb, **kw),
                           lambda: fn(q, k, v, wq, wk, *rotary_emb, eps, **kw),
                           lambda: qk_norm_rope_fp8_ref(q, k, v, wq, wk, *rotary_emb, eps, **kw), (q, k, v, wq, wk))

    return codes, wire_codes


def wrap(sites: AttentionSites, opts, kernels: dict) -> AttentionSites:
    """fused: the bf16 sites through `qk_norm_rope`; fused_fp8: the codes through `qk_norm_rope_fp8` (on the wire with
    a2a_fp8_codes), and the packing through `qk_norm_rope` where bf16 travels the Ulysses wire (cudnn_fp8 casts after
    it)."""
    mode = opts.qk_norm_rope
    if mode == "fused":
        kernels["qk_norm_rope"] = kernel("qk_norm_rope")
        return replace(sites, **_sites(kernels))
    if mode != "fused_fp8":
        return sites
    kernels["qk_norm_rope_fp8"] = kernel("qk_norm_rope_fp8")
    codes, wire_codes = _codes(kernels)
    if opts.ulysses_degree > 1 and not opts.a2a_fp8_codes:
        kernels["qk_norm_rope"] = kernel("qk_norm_rope")
        packed = _sites(kernels)
        return replace(sites, codes=codes, packed=packed["packed"], project_check=packed["project_check"],
                       project=packed["project"], projected=packed["projected"])
    return replace(sites, codes=codes, wire_codes=wire_codes if opts.a2a_fp8_codes else None)
