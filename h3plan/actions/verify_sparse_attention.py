"""action=verify's sparse_attention check: the first block's attention output on verify's seeded inputs, dense against
block-sparse at several keep fractions, the router's kernels against their torch reference.

q, k, v are the first block's, as diffusers' processor builds them (to_q/k/v, per-head RMSNorm, RoPE) from the
block's input in an eager forward. The target-video rows come from the inputs' token tags as the installed hook finds
them. For each keep fraction (the plan's among them) the router's mask (torch reference) is applied with the torch
reference attention and its relative error against the dense output printed: over the routed rows and over all rows.
Seeded weights carry no trained attention pattern: these numbers are not a quality claim (the line says so); the
quality on a checkpoint is action=calibrate calibrate.target=sparse_attention's. Checked: the router's kernels (where
they run: a GPU, or Triton's interpreter) keep exactly the reference's blocks at the plan's keep.
"""

from __future__ import annotations

KEEPS = (0.5, 0.25, 0.1)


class _Captured(Exception):
    """Raised by the capture hook: nothing after the first block's attention input is needed."""


def _qkv(model, inputs):
    import torch
    from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

    attn = model.transformer_blocks[0].attn
    seen = {}

    def grab(mod, args):
        seen["h"], seen["rope"] = args[0], args[1]
        raise _Captured

    handle = attn.register_forward_pre_hook(grab)
    try:
        with torch.no_grad():
            model(**inputs)
    except _Captured:
        pass
    finally:
        handle.remove()
    h, rope = seen["h"], seen["rope"]
    with torch.no_grad():
        q, k, v = (lin(h).unflatten(-1, (attn.heads, -1)) for lin in (attn.to_q, attn.to_k, attn.to_v))
        q, k = attn.norm_q(q), attn.norm_k(k)
        if rope is not None:
            q, k = _apply_rotary_emb(q, *rope), _apply_rotary_emb(k, *rope)
    return q, k, v


def check(model, inputs, decision, rep) -> None:
    """Add the sparse_attention lines to verify's Report `rep` (see the module docstring)."""
    import torch

    from h3plan.install import of_lever
    from h3plan.runtime.attention.block_sparse import block_sparse_ref
    from h3plan.runtime.kernels.block_router import (block_mask_ref, block_router, block_router_check, block_router_ref,
                                                     mask_to_blocks)

    p = decision.param
    bq, bk, keep, video_only = int(p("block_q")), int(p("block_k")), float(p("keep")), bool(p("video_only"))
    name = f"{decision.lever}={decision.setting}"
    q, k, v = _qkv(model, inputs)
    st = of_lever(decision.lever).SparseState({"keep": keep, "dense_forwards": 0, "block_q": bq, "block_k": bk,
                                               "video_only": video_only}, {})
    vs = st.boundary(inputs["token_tags"], inputs["timestep_indices"])
    start = int(vs) if video_only else 0
    S = q.shape[1]
    routed_rows = max(0, S - (-(-start // bq)) * bq)
    if routed_rows == 0:
        rep.line(name, f"{S} rows, target video from row {int(vs)}: no query block of {bq} rows is all target video, "
                       "nothing to route (verify.seq_len sets more rows)", ok=True)
        return
    full = torch.ones((q.shape[0], q.shape[2], -(-S // bq), -(-S // bk)), dtype=torch.bool, device=q.device)
    dense = block_sparse_ref(q, k, v, *mask_to_blocks(full), bq, bk).float()
    r0 = S - routed_rows
    parts = []
    for f in sorted({*KEEPS, keep}, reverse=True):
        mask = block_mask_ref(q, k, int(vs), f, block_q=bq, block_k=bk, video_only=video_only)
        out = block_sparse_ref(q, k, v, *mask_to_blocks(mask), bq, bk).float()
        rel = lambda a, b: float((a - b).norm() / b.norm().clamp(min=1e-30))  # noqa: E731
        parts.append(f"keep {f:g}: {rel(out[:, r0:], dense[:, r0:]):.3e} on the routed rows, {rel(out, dense):.3e} all")
    say = ("attention-output error against dense, first block, seeded weights (not a quality claim: "
           "action=calibrate calibrate.target=sparse_attention measures a checkpoint's frames): " + "; ".join(parts))
    why = block_router_check(q, k, vs, keep, bq, bk)
    if why is not None:
        rep.line(name, say + f"; router kernels not run here ({why})", ok=True)
        return
    got = block_router(q, k, vs, keep, block_q=bq, block_k=bk, video_only=video_only)
    want = block_router_ref(q, k, vs, keep, block_q=bq, block_k=bk, video_only=video_only)
    same = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(got, want))
    rep.line(name, say + ("; router kernels keep the reference's blocks" if same else
                          "; router kernels DIFFER from the reference's blocks"), ok=same)
