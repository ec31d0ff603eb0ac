"""Ulysses (all-to-all) sequence parallelism for MiniMax-H3 attention, any degree U.

API (called by the installer's attention processor)::

    ua = UlyssesAttention(group, chunks=1, padding="padded", fp8_codes=False, prefix_inplace=False)
    out = ua(q, k, v, attn_fn, seq_len=S)                  # q, k, v: (B, S_loc, H, D), normed + roped
    out = ua(None, None, None, attn_fn, seq_len=S, packed=p)
    # p: (U, 3, B, S_loc, H/U, D) destination-major, from qk_norm_rope(..., ulysses_degree=U)
    # out: (B, S_loc, H*D), this rank's rows; padding rows zero

`group` is a torch.distributed ProcessGroup (degree = its size, rank = the group rank; None = the
default group, or one process when torch.distributed is not initialised). Rank r holds rows
r*S_loc .. (r+1)*S_loc-1 of the sequence padded at the tail to U*S_loc rows, S_loc = ceil(S/U)
(see sizes.py). Flow: the pre-attention all-to-all scatters heads and gathers rows, so each rank
holds its H/U heads over all rows; `attn_fn(q, k, v)` runs on them; the post-attention all-to-all
scatters rows and gathers heads; the merge writes (B, S_loc, H*D) with the padding rows zeroed
(h3plan.runtime.kernels.ulysses_merge.merge_head_chunks when its check accepts the tensors, else eager).

attn_fn(q, k, v[, out=]) gets (B, Rq, h, D) queries and (B, S, h, D) keys/values, h = heads of the
chunk, and returns (B, Rq, h, D) in any dtype (the output exchange moves that dtype). Padding rows
are never keys: a padded key would enter every valid row's softmax.

Padding modes (`padding`); the pre-attention exchange always moves the fixed S_loc-row shards:
- `padded`: fixed padded shapes; attention over all Rq = U*S_loc query rows and the S valid key rows
  (what a key-padding mask does); the padding queries are computed and dropped by the merge. Needs
  an attn_fn that takes fewer key rows than query rows (SDPA, FA4 and cuDNN do) when S % U != 0.
- `fixed_valid`: attention on the valid prefix only (Rq = S), output restored to the padded shape
  with a zero tail, then the same fixed-shape exchange as `padded`.
- `valid_only`: like fixed_valid but the tail is never restored: the output exchange sends only
  valid rows (uneven splits) and the merge zero-fills the tail in the same step.
- `none`: no padding allowed (S % U == 0 or a ValueError); then the same as `padded`.
Every mode gives the valid rows of single-rank attn_fn over the unpadded sequence, bit for bit,
given an attn_fn whose rows and heads do not depend on the other rows/heads in the call (true of
attention kernels; a BLAS that changes its reduction order with the row count would break it).

`chunks` > 1 (overlap): the local heads split into `chunks` groups (sizes differ by at most one);
the pre-attention all-to-all of chunk i+1 is issued with async_op=True before attention runs on
chunk i, and each chunk's output exchange is issued asynchronously as soon as its attention ends.
Results equal chunks=1 under the same per-head condition.

`fp8_codes`: q, k, v arrive as float8_e4m3fn codes (qk_norm_rope_fp8_lean with `amax_allreduce_hook`, so
all ranks share one per-tensor scale); they travel as uint8, 1 byte per element instead of 2, and
attn_fn carries the descales itself. An FP8 output (cuDNN FP8 on Hopper) travels as uint8 too.
Bytes: see sizes.a2a_bytes (37.5% fewer per layer with a bf16 output, 50% with an FP8 one).

`prefix_inplace` (padded, fixed_valid): the padded (B, U*S_loc, h, D) output is allocated once and
attn_fn writes into it through `out=` (a view of the prefix in fixed_valid) when its signature takes
`out` (or **kwargs); only the padding rows are zeroed. Its dtype is `attn_fn.out_dtype` if set, else
q's dtype. An attn_fn without `out` is called plainly and its result copied into the buffer.
At batch 1 the padded output is already the output exchange's send buffer (no relayout copy).

`exchange_projected` + `gathered=` (the ulysses_exchange lever's projection settings): q, k, v arrive per
destination as send/recv while the caller produces the next destination's heads, straight into
seq-major buffers (see the method). `split_output=True` (gathered calls; padding none or padded): the
output exchange too runs per destination, each other rank's query rows attended and sent (on
`post_group`, e.g. a high-priority NCCL stream from comm.high_priority_group) while the next rows attend.

NCCL: every exchange is all_to_all_single on contiguous buffers; async works are waited on before
their buffers are read, and their send buffers stay referenced until then. Ranks must call with
identical shapes, modes and attn_fn (collectives are issued in the same order on every rank).

Degree 1: no communication; attn_fn on the inputs, reshaped to (B, S, H*D); chunks and padding
modes do not apply. Guards (ValueError, one line, raised on every rank before any communication):
q/k/v/packed shapes, dtypes and devices, H % U, seq_len against S_loc, chunks > heads per rank,
fp8_codes against the dtype, the group backend against the device.
"""

from __future__ import annotations

import inspect
from collections import Counter

import torch

from .comm import all_to_all, backend_name, check_qkv, degree_rank, device_reason, wire
from h3plan.facts.sizes import shard_len, valid_rows

PADDING_MODES = ("none", "padded", "fixed_valid", "valid_only")
FP8_CODES = (torch.float8_e4m3fn,)

try:  # the fused merge kernel is optional: the eager merge below is its exact equivalent
    from h3plan.runtime.kernels import ulysses_merge as _merge_mod
except ImportError:
    _merge_mod = None


def _takes_out(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "out" or p.kind is p.VAR_KEYWORD for p in params)


def _chunk_bounds(h: int, chunks: int) -> list[tuple[int, int]]:
    sizes = [h // chunks + (i < h % chunks) for i in range(chunks)]
    starts = [sum(sizes[:i]) for i in range(chunks)]
    return [(s, s + n) for s, n in zip(starts, sizes)]


def _seq_major(recv: torch.Tensor, rows: int) -> torch.Tensor:
    """recv (U, B, S_loc, h, D) from each source rank -> contiguous (B, rows, h, D), rows <= U*S_loc."""
    U, B, S_loc, h, D = recv.shape
    w_recv = wire(recv)
    if rows == U * S_loc:
        return w_recv.permute(1, 0, 2, 3, 4).contiguous().view(B, rows, h, D).view(recv.dtype)
    out = torch.empty((B, rows, h, D), dtype=recv.dtype, device=recv.device)
    full, rest = divmod(rows, S_loc)
    w_out = wire(out)
    if full:
        w_out[:, : full * S_loc].view(B, full, S_loc, h, D).copy_(w_recv[:full].permute(1, 0, 2, 3, 4))
    if rest:
        w_out[:, full * S_loc :].copy_(w_recv[full, :, :rest])
    return out


def _dest_major(o: torch.Tensor, U: int) -> torch.Tensor:
    """(B, U*S_loc, h, D) -> (U, B, S_loc, h, D) send buffer; a free view at batch 1."""
    B, R, h, D = o.shape
    if B == 1 and o.is_contiguous():
        return o.view(U, 1, R // U, h, D)
    return wire(o).unflatten(1, (U, R // U)).permute(1, 0, 2, 3, 4).contiguous().view(o.dtype)


class UlyssesAttention:
    """Ulysses all-to-all attention over a process group; see the module docstring for the contract.

    After each call `last_bytes` = {"pre": n, "post": n} holds the bytes this rank sent to the other
    ranks; `stats` counts calls, exchanges (sync/async) and merge paths (kernel/eager); set
    `trace = []` to record the order of exchanges and attention calls.
    """

    def __init__(self, group, *, chunks: int = 1, padding: str = "padded", fp8_codes: bool = False,
                 prefix_inplace: bool = False, split_output: bool = False, post_group=None):
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"chunks must be an int >= 1, got {chunks!r}")
        if padding not in PADDING_MODES:
            raise ValueError(f"padding must be one of {PADDING_MODES}, got {padding!r}")
        if prefix_inplace and padding == "valid_only":
            raise ValueError("prefix_inplace needs a padded output (padding padded or fixed_valid), not valid_only")
        if split_output and (padding not in ("none", "padded") or prefix_inplace or chunks != 1 or fp8_codes):
            raise ValueError("split_output needs padding none or padded, chunks=1, no prefix_inplace and no fp8_codes")
        self.group = group
        self.split_output = bool(split_output)
        self.post_group = group if post_group is None else post_group
        self.degree, self.rank = degree_rank(group)
        self.chunks = chunks
        self.padding = padding
        self.fp8_codes = bool(fp8_codes)
        self.prefix_inplace = bool(prefix_inplace)
        self.stats: Counter = Counter()
        self.last_bytes = {"pre": 0, "post": 0}
        self.trace: list | None = None

    # ---- guards -------------------------------------------------------------------------------------

    def _shapes(self, q, k, v, packed):
        U = self.degree
        if packed is not None:
            if any(t is not None for t in (q, k, v)):
                raise ValueError("pass either q, k, v or packed, not both")
            if not isinstance(packed, torch.Tensor) or packed.dim() != 6:
                raise ValueError(f"packed must be a 6-dim (U, 3, B, S_loc, H/U, D) tensor, got "
                                 f"{tuple(packed.shape) if isinstance(packed, torch.Tensor) else type(packed)}")
            if packed.shape[0] != U or packed.shape[1] != 3:
                raise ValueError(f"packed shape {tuple(packed.shape)} is not (U={U}, 3, B, S_loc, H/U, D)")
            _, _, B, S_loc, h, D = packed.shape
            return B, S_loc, U * h, D, packed.dtype, packed.device
        if any(t is None for t in (q, k, v)):
            raise ValueError("q, k and v are all required when packed is None")
        check_qkv(q, k, v, "(B, S_loc, H, D)")
        return (*q.shape, q.dtype, q.device)

    def _check(self, B, S_loc, H, D, dtype, device, seq_len):
        U = self.degree
        if not dtype.is_floating_point:
            raise ValueError(f"q/k/v must be floating point, got {dtype}")
        if self.fp8_codes and dtype not in FP8_CODES:
            raise ValueError(f"fp8_codes=True expects float8_e4m3fn q/k/v, got {dtype}")
        if not self.fp8_codes and dtype.is_floating_point and torch.finfo(dtype).bits == 8:
            raise ValueError(f"got {dtype} q/k/v with fp8_codes=False (enable the a2a_fp8_codes lever)")
        if H % U:
            raise ValueError(f"heads H={H} not divisible by the Ulysses degree U={U}")
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
        if shard_len(seq_len, U) != S_loc:
            raise ValueError(f"seq_len={seq_len} needs ceil(S/U)={shard_len(seq_len, U)} rows per rank at "
                             f"degree {U}, got S_loc={S_loc}")
        if U == 1:
            return
        if self.padding == "none" and seq_len % U:
            raise ValueError(f"padding='none' needs seq_len % U == 0, got S={seq_len}, U={U}")
        if self.chunks > H // U:
            raise ValueError(f"chunks={self.chunks} exceeds the {H // U} heads per rank")
        reason = device_reason(self.group, device)
        if reason:
            raise ValueError(reason)

    # ---- pieces ------------------------------------------------------------------------------------

    def _exchange(self, recv, send, *, async_op, tag, out_splits=None, in_splits=None):
        self.stats["a2a_async" if async_op else "a2a_sync"] += 1
        if self.trace is not None:
            self.trace.append(tag)
        return all_to_all(recv, send, self.group, out_splits=out_splits, in_splits=in_splits, async_op=async_op)

    def _pre_send(self, q, k, v, packed, c0, c1, h):
        """Destination-major (U, 3, B, S_loc, c1-c0, D) send buffer of one head chunk."""
        if packed is not None:
            if c0 == 0 and c1 == h and packed.is_contiguous():
                return packed
            return packed[..., c0:c1, :].contiguous()
        B, S_loc, H, D = q.shape
        send = torch.empty((self.degree, 3, B, S_loc, c1 - c0, D), dtype=q.dtype, device=q.device)
        for t, x in enumerate((q, k, v)):
            wire(send)[:, t].copy_(wire(x).unflatten(2, (self.degree, h))[:, :, :, c0:c1].permute(2, 0, 1, 3, 4))
        return send

    def _query_rows(self, S, S_pad):
        return S if self.padding in ("fixed_valid", "valid_only") else S_pad

    def _attend(self, attn_fn, recv, S, S_pad, c):
        """Attention for one chunk of the exchanged (U, 3, B, S_loc, hc, D); see _attend_rows."""
        rq = self._query_rows(S, S_pad)
        qf, kf, vf = _seq_major(recv[:, 0], rq), _seq_major(recv[:, 1], S), _seq_major(recv[:, 2], S)
        return self._attend_rows(attn_fn, qf, kf, vf, S, S_pad, c)

    def _attend_rows(self, attn_fn, qf, kf, vf, S, S_pad, c):
        """Attention on seq-major (B, rq, hc, D) queries and (B, S, hc, D) keys/values; returns the output
        exchange's pieces (see _post_fixed)."""
        mode = self.padding
        B, rq, hc, D = qf.shape
        S_loc = S_pad // self.degree
        if self.trace is not None:
            self.trace.append(f"attn{c}")
        if self.prefix_inplace:
            buf = torch.empty((B, S_pad, hc, D), dtype=getattr(attn_fn, "out_dtype", None) or qf.dtype,
                              device=qf.device)
            view = buf[:, :rq]
            if _takes_out(attn_fn):
                o = attn_fn(qf, kf, vf, out=view)
                self._check_out(o, (B, rq, hc, D))
                self.stats["prefix_out_kw"] += 1
                if o.data_ptr() != view.data_ptr() or o.stride() != view.stride():
                    self._copy_into(view, o)
            else:
                o = attn_fn(qf, kf, vf)
                self._check_out(o, (B, rq, hc, D))
                self._copy_into(view, o)
            if rq < S_pad:
                wire(buf)[:, rq:].zero_()
            return self._post_fixed(buf)
        o = attn_fn(qf, kf, vf)
        self._check_out(o, (B, rq, hc, D))
        if mode == "valid_only":
            return self._post_valid(o, S, S_loc)
        if rq < S_pad:  # fixed_valid: restore the padded shape with a zero tail
            buf = torch.zeros((B, S_pad, hc, D), dtype=o.dtype, device=o.device)
            wire(buf)[:, :rq].copy_(wire(o))
            o = buf
        return self._post_fixed(o)

    @staticmethod
    def _check_out(o, shape):
        if not isinstance(o, torch.Tensor) or tuple(o.shape) != shape:
            got = tuple(o.shape) if isinstance(o, torch.Tensor) else type(o).__name__
            raise ValueError(f"attn_fn returned {got}, expected {shape}")

    @staticmethod
    def _copy_into(view, o):
        if o.dtype != view.dtype:
            raise ValueError(f"attn_fn returned {o.dtype} but prefix_inplace allocated {view.dtype} "
                             f"(set attn_fn.out_dtype)")
        wire(view).copy_(wire(o))

    def _post_fixed(self, o):
        """-> (recv buffer of the exchange, its (U, B, S_loc, h, D) merge view, send, out/in splits)."""
        send = _dest_major(o, self.degree)
        recv = torch.empty_like(send)
        return recv, recv, send, None, None

    def _post_valid(self, o, S, S_loc):
        """valid_only: send each destination only its valid rows (uneven splits)."""
        U = self.degree
        B, _, hc, D = o.shape
        rows = [valid_rows(S, U, d) for d in range(U)]
        if B == 1 and o.is_contiguous():
            send = o.reshape(-1)  # the destinations' valid rows are consecutive: rows 0..S
        else:
            w = wire(o)
            send = torch.cat([w[:, d * S_loc : d * S_loc + n].reshape(-1) for d, n in enumerate(rows)]).view(o.dtype)
        vr = rows[self.rank]
        # The merge reads rows < vr only, so the short (U, B, vr, hc, D) receive is handed to it as a
        # (U, B, S_loc, hc, D) view with the short strides; the slack keeps the view inside storage.
        n = U * B * vr * hc * D
        buf = torch.empty(n + (S_loc - vr) * hc * D, dtype=o.dtype, device=o.device)
        view = buf.as_strided((U, B, S_loc, hc, D), (B * vr * hc * D, vr * hc * D, hc * D, D, 1))
        in_splits = [B * r * hc * D for r in rows]
        return buf[:n], view, send, [B * vr * hc * D] * U, in_splits

    def _merge(self, parts, B, S_loc, H, D, vr):
        """parts: [(recv (U, B, S_loc, hc, D), c0, c1)] -> (B, S_loc, H*D), rows >= vr zero (never read)."""
        U, h = self.degree, H // self.degree
        dtype, device = parts[0][0].dtype, parts[0][0].device
        out = torch.empty((B, S_loc, H * D), dtype=dtype, device=device)
        if len(parts) == 1 and _merge_mod is not None:
            check = getattr(_merge_mod, "merge_head_chunks_check", None)
            recv = parts[0][0]
            if check is not None and check(recv, vr, out=out) is None:
                self.stats["merge_kernel"] += 1
                return _merge_mod.merge_head_chunks(recv, vr, out=out)
        self.stats["merge_eager"] += 1
        o5 = wire(out).view(B, S_loc, U, h, D)
        for recv, c0, c1 in parts:
            o5[:, :vr, :, c0:c1].copy_(wire(recv)[:, :, :vr].permute(1, 2, 0, 3, 4))
        o5[:, vr:].zero_()
        return out

    # ---- the projection exchange -------------------------------------------------------------------

    def _peers(self):
        """(step j, destination, source) for j = 1..U-1: at step j this rank sends to rank+j and receives from
        rank-j, so every send meets its receive in the same step on the peer."""
        U, r = self.degree, self.rank
        return [(j, (r + j) % U, (r - j) % U) for j in range(1, U)]

    @staticmethod
    def _pair(send, dst, recv, src, group):
        """The P2P ops of one step: `send` to group rank dst, `recv` from group rank src."""
        import torch.distributed as dist

        return [dist.P2POp(dist.isend, wire(send), group=group, group_peer=dst),
                dist.P2POp(dist.irecv, wire(recv), group=group, group_peer=src)]

    def _post_bytes(self, send, in_splits) -> int:
        """Bytes the output exchange sends to the other ranks (whole blocks, or the valid_only splits)."""
        if in_splits is None:
            return send.numel() * send.element_size() * (self.degree - 1) // self.degree
        return (sum(in_splits) - in_splits[self.rank]) * send.element_size()

    def exchange_projected(self, produce, *, seq_len: int, shape, dtype, device):
        """Gather this rank's heads over every row while the other ranks' heads are still being produced.

        `produce(d)` returns (q, k, v) of destination rank d's H/U heads over this rank's rows, each a
        contiguous (1, S_loc, H/U, D) tensor (normed + roped q and k). It is called for d = rank+1, ...,
        rank+U-1 (mod U), and each result is sent to d (send/recv with that peer, in flight while the next
        destination's heads are produced), then for this rank, whose own result is copied into place.
        Returns seq-major (q, k, v), each (1, U*S_loc, H/U, D): the same tensors the packed exchange gives
        `attn_fn`, without its (U, 3, ...) send buffer and the three seq-major copies after it.
        `shape` = (B, S_loc, H, D) of this rank's q; batch 1 only (a row block of a larger batch is not
        contiguous). Guards as `__call__`, plus chunks == 1 and BF16 on the wire (ValueError, one line).
        """
        import torch.distributed as dist

        B, S_loc, H, D = shape
        self._check(B, S_loc, H, D, dtype, device, seq_len)
        if B != 1:
            raise ValueError(f"the projection exchange takes batch 1, got B={B}")
        if self.chunks != 1 or self.fp8_codes:
            raise ValueError("the projection exchange runs with chunks=1 and fp8_codes=False")
        U, r, h = self.degree, self.rank, H // self.degree
        full = torch.empty((3, 1, U * S_loc, h, D), dtype=dtype, device=device)
        if U == 1:
            for t, p in enumerate(self._produced(produce, r, (1, S_loc, h, D), dtype, device)):
                full[t].copy_(p)
            return full.unbind(0)

        def rows(src):
            return full[:, :, src * S_loc:(src + 1) * S_loc]

        works, keep, sent = [], [], 0
        for j, dst, src in self._peers():
            parts = self._produced(produce, dst, (1, S_loc, h, D), dtype, device)
            dest = rows(src)
            ops = []
            for t, p in enumerate(parts):
                ops += self._pair(p, dst, dest[t], src, self.group)
                sent += p.numel() * p.element_size()
            works += dist.batch_isend_irecv(ops)
            keep.append(parts)  # the send buffers stay referenced until their works are waited on
            self.stats["p2p_async"] += 1
            if self.trace is not None:
                self.trace.append(f"p2p{j}")
        for t, p in enumerate(self._produced(produce, r, (1, S_loc, h, D), dtype, device)):
            rows(r)[t].copy_(p)
        for w in works:
            w.wait()
        del keep
        self.stats["projection_exchange"] += 1
        self.last_bytes = {"pre": sent, "post": 0}
        return full.unbind(0)

    @staticmethod
    def _produced(produce, d, shape, dtype, device):
        parts = produce(d)
        if not isinstance(parts, (tuple, list)) or len(parts) != 3:
            raise ValueError(f"produce({d}) must return (q, k, v), got {type(parts).__name__}")
        for name, p in zip("qkv", parts):
            if (not isinstance(p, torch.Tensor) or tuple(p.shape) != shape or p.dtype != dtype or p.device != device
                    or not p.is_contiguous()):
                got = (tuple(p.shape), p.dtype, p.device) if isinstance(p, torch.Tensor) else type(p).__name__
                raise ValueError(f"produce({d}) gave {name} {got}, expected a contiguous {shape} {dtype} on {device}")
        return parts

    def _call_gathered(self, gathered, attn_fn, S):
        """Attention and the output exchange on exchange_projected's (q, k, v)."""
        if not isinstance(gathered, (tuple, list)) or len(gathered) != 3:
            raise ValueError("gathered must be exchange_projected's (q, k, v)")
        qf, kf, vf = gathered
        check_qkv(qf, kf, vf, "(1, U*S_loc, H/U, D)")
        B, S_pad, h, D = qf.shape
        U = self.degree
        if S_pad % U:
            raise ValueError(f"gathered rows {S_pad} are not U*S_loc at degree {U}")
        self._check(B, S_pad // U, U * h, D, qf.dtype, qf.device, seq_len=S)
        self.stats["calls"] += 1
        if U == 1:
            o = attn_fn(qf[:, :S], kf[:, :S], vf[:, :S])
            self._check_out(o, (B, S, h, D))
            return o.reshape(B, S, h * D)
        S_loc = S_pad // U
        if self.split_output:
            return self._split_output(qf, kf[:, :S], vf[:, :S], attn_fn, S)
        rq = self._query_rows(S, S_pad)
        r_out, r_merge, s_out, out_splits, in_splits = self._attend_rows(attn_fn, qf[:, :rq], kf[:, :S], vf[:, :S],
                                                                         S, S_pad, 0)
        if in_splits is None:  # whole (U, B, S_loc, h, D) blocks: the remote ones as send/recv, this rank's as a copy
            self._blocks_exchange(r_out, s_out, tag="post0")
        else:
            w = self._exchange(r_out, s_out, async_op=False, tag="post0", out_splits=out_splits, in_splits=in_splits)
            if w is not None:
                w.wait()
        self.last_bytes["post"] = self._post_bytes(s_out, in_splits)
        return self._merge([(r_merge, 0, h)], B, S_loc, U * h, D, valid_rows(S, U, self.rank))

    def _blocks_exchange(self, recv, send, *, tag):
        """all_to_all of (U, ...) blocks without NCCL's copy of this rank's own block: one batch of send/recv with
        every other rank, this rank's block copied by the device meanwhile. Same bytes in the same places."""
        import torch.distributed as dist

        r = self.rank
        ops = [op for _, d, src in self._peers() for op in self._pair(send[d], d, recv[src], src, self.group)]
        works = dist.batch_isend_irecv(ops)
        wire(recv[r]).copy_(wire(send[r]))
        for w in works:
            w.wait()
        self.stats["p2p_sync"] += 1
        if self.trace is not None:
            self.trace.append(tag)

    def _split_output(self, qf, kf, vf, attn_fn, S):
        """split_output: attention over each other rank's query rows first, each result sent to that rank
        (send/recv on `post_group`) while the next block of rows attends, this rank's own rows last, written
        into the merge's input. Each attention call sees whole rows and every key, so the rows are bitwise
        those of one call (given an attn_fn whose rows do not depend on the other rows in the call)."""
        import torch.distributed as dist

        U, r = self.degree, self.rank
        B, S_pad, h, D = qf.shape
        S_loc = S_pad // U
        recv, works, keep, sent = None, [], [], 0

        def attend(d):
            if self.trace is not None:
                self.trace.append(f"attn-rows{d}")
            o = attn_fn(qf[:, d * S_loc:(d + 1) * S_loc], kf, vf)
            self._check_out(o, (B, S_loc, h, D))
            return o.contiguous()

        for j, d, src in self._peers():
            o = attend(d)
            if recv is None:
                recv = torch.empty((U, B, S_loc, h, D), dtype=o.dtype, device=o.device)
            works += dist.batch_isend_irecv(self._pair(o, d, recv[src], src, self.post_group))
            keep.append(o)
            sent += o.numel() * o.element_size()
            self.stats["p2p_async"] += 1
            if self.trace is not None:
                self.trace.append(f"post-p2p{j}")
        o = attend(r)
        if o.dtype != recv.dtype:
            raise ValueError(f"attn_fn returned {o.dtype} for this rank's rows and {recv.dtype} for the others")
        wire(recv[r]).copy_(wire(o))
        for w in works:
            w.wait()
        del keep
        self.stats["split_output"] += 1
        self.last_bytes["post"] = sent
        return self._merge([(recv, 0, h)], B, S_loc, U * h, D, valid_rows(S, U, r))

    # ---- call --------------------------------------------------------------------------------------

    def __call__(self, q, k, v, attn_fn, *, seq_len: int, packed=None, gathered=None) -> torch.Tensor:
        if gathered is not None:
            if any(t is not None for t in (q, k, v, packed)):
                raise ValueError("pass gathered alone (from exchange_projected), not with q, k, v or packed")
            return self._call_gathered(gathered, attn_fn, seq_len)
        B, S_loc, H, D, dtype, device = self._shapes(q, k, v, packed)
        self._check(B, S_loc, H, D, dtype, device, seq_len)
        U, S = self.degree, seq_len
        self.stats["calls"] += 1
        if U == 1:
            if packed is not None:
                q, k, v = packed[0, 0], packed[0, 1], packed[0, 2]
            o = attn_fn(q, k, v)
            self._check_out(o, (B, S, H, D))
            return o.reshape(B, S, H * D)

        h, S_pad = H // U, U * S_loc
        vr = valid_rows(S, U, self.rank)
        bounds = _chunk_bounds(h, self.chunks)
        async_op = self.chunks > 1
        pre_bytes = post_bytes = 0

        def issue_pre(c):
            c0, c1 = bounds[c]
            send = self._pre_send(q, k, v, packed, c0, c1, h)
            recv = torch.empty_like(send)
            work = self._exchange(recv, send, async_op=async_op, tag=f"pre{c}")
            return send, recv, work

        pending = issue_pre(0)
        posts = []
        for c, (c0, c1) in enumerate(bounds):
            (send, recv, work), pending = pending, None
            if work is not None:
                work.wait()
            pre_bytes += send.numel() * send.element_size() * (U - 1) // U
            if c + 1 < len(bounds):
                pending = issue_pre(c + 1)  # in flight while chunk c attends
            r_out, r_merge, s_out, out_splits, in_splits = self._attend(attn_fn, recv, S, S_pad, c)
            del send, recv
            post_bytes += self._post_bytes(s_out, in_splits)
            w = self._exchange(r_out, s_out, async_op=async_op, tag=f"post{c}",
                               out_splits=out_splits, in_splits=in_splits)
            posts.append((r_merge, s_out, w, c0, c1))
        for _, _, w, _, _ in posts:
            if w is not None:
                w.wait()
        self.last_bytes = {"pre": pre_bytes, "post": post_bytes}
        return self._merge([(r, c0, c1) for r, _, _, c0, c1 in posts], B, S_loc, H, D, vr)

    def __repr__(self):
        be = backend_name(self.group) if self.degree > 1 else "local"
        return (f"UlyssesAttention(degree={self.degree}, rank={self.rank}, backend={be}, chunks={self.chunks}, "
                f"padding={self.padding!r}, fp8_codes={self.fp8_codes}, prefix_inplace={self.prefix_inplace}, "
                f"split_output={self.split_output})")
