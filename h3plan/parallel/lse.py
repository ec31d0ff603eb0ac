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
- `sdpa_flash`: torch's flash kernel (`aten._scaled_dot_product_flash_attention`), which returns its
  (B, h, Lq) fp32 logsumexp; CUDA, bf16/fp16, head_dim <= 256; output in q's dtype.
- `sdpa_cudnn`: torch's cuDNN kernel (`aten._scaled_dot_product_cudnn_attention`, compute_log_sumexp);
  some torch versions give the lse as (B, h, Lq, 1): it is reshaped.
- `fa4`: FlashAttention-4, `flash_attn.cute.flash_attn_func(..., return_lse=True)` returns
  (out, lse (B, h, Lq) fp32); builds without `return_lse` return lse only when autograd needs it, so
  a missing lse is an error there. 2-CTA switches and tuned tiles (h3plan.attention.fa4) are not
  applied here: the lead's hook is to wrap FA4Backend the same way (see ring.py's docstring).
- cuDNN through cudnn-frontend (h3plan.attention.cudnn) can emit the same statistic: `sdpa(...,
  generate_stats=True)` (`is_inference=False` before frontend 1.13) adds a Stats output (B, h, Lq, 1)
  fp32. Not wired here; FP8 attention with LSE is not covered.

Merge (`LseMerge`): running fp32 accumulator `acc` (B, Lq, h, D) and running `lse` (B, h, Lq);
adding a block (o_t, lse_t):  new = logaddexp(lse, lse_t);  acc = acc*exp(lse-new) + o_t*exp(lse_t-new).
Both weights are <= 1, so nothing overflows however large the logits are. The result equals the
softmax over the union of the blocks up to fp32 rounding in a different summation order than a
single kernel: about 1e-7 relative for fp32 block outputs. A bf16 block output (FA4, SDPA) is one
bf16 rounding per block before the merge: see ring_plan.NUMERICS for the error that adds.
"""

from __future__ import annotations

import inspect

import torch

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


def _sdpa_flash(q, k, v):
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, False, False)[:2]
    return o.transpose(1, 2), lse.float()


def _sdpa_cudnn(q, k, v):
    o, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, True, 0.0, False, False)[:2]
    B, Lq, h, _ = q.shape
    return o.transpose(1, 2), lse.float().reshape(B, h, Lq)


_FA4: list = []  # [(flash_attn_func, takes return_lse) or (None, reason)], resolved once


def _fa4_fn():
    if not _FA4:
        try:
            from flash_attn.cute import flash_attn_func

            try:
                takes = "return_lse" in inspect.signature(flash_attn_func).parameters
            except (TypeError, ValueError):
                takes = False
            _FA4.append((flash_attn_func, takes))
        except Exception as exc:  # ImportError, or a CUDA/cutlass error raised at import
            _FA4.append((None, f"flash_attn.cute import failed ({type(exc).__name__}: {exc})"))
    return _FA4[0]


def _fa4(q, k, v):
    fn, takes = _fa4_fn()
    if fn is None:
        raise UsageError(takes)
    kw = {"return_lse": True} if takes else {}
    o, lse = fn(q, k, v, softmax_scale=None, causal=False, **kw)
    if lse is None:
        raise UsageError("this flash_attn.cute returned no lse (no return_lse argument): use sdpa_flash")
    return o, lse


LSE_BACKENDS = {"reference": attention_with_lse, "sdpa_flash": _sdpa_flash, "sdpa_cudnn": _sdpa_cudnn, "fa4": _fa4}


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
    D = q.shape[-1]
    if name == "fa4":
        cc = torch.cuda.get_device_capability(q.device)
        if cc[0] not in (9, 10, 11):
            return f"FA4 forward needs SM90 or the SM100 family (device is SM{cc[0]}{cc[1]})"
        if not (8 <= D <= (256 if cc[0] == 9 else 128) and D % 8 == 0):
            return f"FA4 on SM{cc[0]}{cc[1]} does not take head_dim {D}"
        fn, why = _fa4_fn()
        return why if fn is None else None
    if D > 256 or D % 8:
        return f"{name} needs head_dim <= 256 and a multiple of 8, got {D}"
    if name == "sdpa_cudnn":
        op = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
        if op is None or "compute_log_sumexp" not in str(op.default._schema):
            return "this torch has no _scaled_dot_product_cudnn_attention with compute_log_sumexp"
        if not torch.backends.cudnn.is_available():
            return "cuDNN is not available to torch"
    return None


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
