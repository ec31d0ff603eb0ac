"""Block attention that also returns its log-sum-exp, and the fp32 merge of partial results.

Ring attention (ring.py) needs, per key/value block, the block's softmax output *and* its
log-sum-exp, so the blocks can be merged into the softmax over all keys. The contract of a block
function `attn(q, k, v) -> (out, lse)`, non-causal, unmasked, scale 1/sqrt(D):

    q (B, Lq, h, D); k, v (B, Lk, h, D), Lk >= 1, any strides with a unit last stride
    out (B, Lq, h, D), any float dtype: softmax(q k^T / sqrt(D)) v over these Lk keys
    lse (B, h, Lq) fp32, natural log: logsumexp_j(q . k_j / sqrt(D))

Backends here (`LSE_BACKENDS`; `lse_reason(name, q)` says why one cannot run on q):

- `reference`: `attention_with_lse`, torch on any device, fp32 math and an fp32 output; query rows in
  chunks so the fp32 score matrix stays under `max_score_bytes`. The CPU oracle and the CPU path.
- every attention backend's own, as its declaration names it (h3plan.facts.attention.BACKENDS: `lse`, `lse_impl`,
  its per-call check `<fn>_reason` beside it): `sdpa_flash` and `sdpa_cudnn` (torch's flash and cuDNN
  kernels, h3plan/runtime/attention/sdpa.py) for sdpa and cudnn_bf16, `fa4` (h3plan/runtime/attention/fa4.py). Output in
  q's dtype; CUDA, bf16/fp16 (checked here). cuDNN through cudnn-frontend can emit the same statistic
  (`sdpa(..., generate_stats=True)`), not wired; FP8 attention with LSE is not covered (cudnn_fp8 has none).

Merge (`LseMerge`): running fp32 accumulator `acc` (B, Lq, h, D) and running `lse` (B, h, Lq);
adding a block (o_t, lse_t):  new = logaddexp(lse, lse_t);  acc = acc*exp(lse-new) + o_t*exp(lse_t-new).
Both weights are <= 1, so nothing overflows however large the logits are. The result equals the
softmax over the union of the blocks up to fp32 rounding in a different summation order than a
single kernel: about 1e-7 relative for fp32 block outputs. A bf16 block output (FA4, SDPA) is one
bf16 rounding per block before the merge: see ring_plan.NUMERICS for the error that adds.
"""

from __future__ import annotations

import torch

from h3plan.facts.attention import BACKENDS
from h3plan.runtime.attention import load
from h3plan.errors import UsageError

MAX_SCORE_BYTES = 256 << 20


def attention_with_lse(q, k, v, *, scale: float | None = None, max_score_bytes: int = MAX_SCORE_BYTES):
    """Reference block attention in fp32: returns (out (B, Lq, h, D) fp32, lse (B, h, Lq) fp32)."""
    B, Lq, h, D = q.shape
    Lk = k.shape[1]
    scale = D ** -0.5 if scale is None else scale
    kf = k.float().transpose(1, 2)  # (B, h, Lk, D)
    vf = v.float().transpose(1, 2)
    out = torch.empty((B, h, Lq, D), dtype=torch.float32, device=q.device)
    lse = torch.empty((B, h, Lq), dtype=torch.float32, device=q.device)
    step = max(1, max_score_bytes // max(1, B * h * Lk * 4))
    for r0 in range(0, Lq, step):
        qf = q[:, r0 : r0 + step].float().transpose(1, 2)  # (B, h, rows, D)
        s = torch.matmul(qf, kf.transpose(-1, -2)).mul_(scale)
        m = torch.logsumexp(s, dim=-1)
        lse[:, :, r0 : r0 + step] = m
        out[:, :, r0 : r0 + step] = torch.matmul(s.sub_(m.unsqueeze(-1)).exp_(), vf)
    return out.transpose(1, 2), lse


def _lse_backends() -> tuple[dict, dict]:
    fns, reasons = {"reference": attention_with_lse}, {}
    for b in BACKENDS.values():
        if b.lse:
            fns[b.lse], reasons[b.lse] = load(b.lse_impl), load(b.lse_impl + "_reason")
    return fns, reasons


LSE_BACKENDS, _REASONS = _lse_backends()


def lse_reason(name: str, q: torch.Tensor) -> str | None:
    """None when backend `name` can run on tensors like q; else the one-line reason."""
    if name not in LSE_BACKENDS:
        return f"unknown LSE attention backend {name!r} (one of {sorted(LSE_BACKENDS)})"
    if name == "reference":
        return None
    if q.device.type != "cuda":
        return f"{name} needs CUDA tensors (q is on {q.device.type})"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"{name} takes bf16/fp16 q/k/v, got {q.dtype}"
    return _REASONS[name](q)


def pick_lse_backend(q: torch.Tensor, prefer=("fa4", "sdpa_flash", "reference")) -> tuple[str, list[str]]:
    """(first backend in `prefer` that runs on q, reasons the earlier ones were passed over)."""
    skipped = []
    for name in prefer:
        why = lse_reason(name, q)
        if why is None:
            return name, skipped
        skipped.append(f"{name}: {why}")
    raise UsageError("no LSE attention backend runs here: " + "; ".join(skipped))


class LseMerge:
    """Online-softmax merge of block results in fp32 (see the module docstring for the math)."""

    def __init__(self):
        self.acc: torch.Tensor | None = None  # (B, Lq, h, D) fp32
        self.lse: torch.Tensor | None = None  # (B, h, Lq) fp32

    def add(self, o: torch.Tensor, lse: torch.Tensor) -> None:
        lse = lse.float()
        if self.acc is None:
            self.acc = torch.empty(o.shape, dtype=torch.float32, device=o.device).copy_(o)  # contiguous (B, Lq, h, D)
            self.lse = lse.clone()
            return
        new = torch.logaddexp(self.lse, lse)
        a = torch.exp(self.lse - new).transpose(1, 2).unsqueeze(-1)  # (B, Lq, h, 1)
        b = torch.exp(lse - new).transpose(1, 2).unsqueeze(-1)
        self.acc.mul_(a).addcmul_(o, b)  # o in its own dtype, promoted to fp32 per element
        self.lse = new

    def result(self, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.acc is None:
            raise UsageError("no block was merged (every key block was empty)")
        if out is not None:
            out.copy_(self.acc)
            return out
        return self.acc if dtype == torch.float32 else self.acc.to(dtype)


def check_lse_result(o, lse, q, Lk: int) -> None:
    """One-line UsageError when a block function broke the (out, lse) contract."""
    B, Lq, h, D = q.shape
    if not isinstance(o, torch.Tensor) or tuple(o.shape) != (B, Lq, h, D):
        raise UsageError(f"block attention returned out {getattr(o, 'shape', type(o))}, expected {(B, Lq, h, D)}")
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (B, h, Lq):
        raise UsageError(f"block attention returned lse {getattr(lse, 'shape', type(lse))}, expected {(B, h, Lq)} "
                         f"(over {Lk} keys)")


__all__ = ["attention_with_lse", "LSE_BACKENDS", "lse_reason", "pick_lse_backend", "LseMerge", "check_lse_result",
           "MAX_SCORE_BYTES"]
