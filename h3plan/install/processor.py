"""The plan's attention processor for the transformer blocks' MiniMaxH3Attention.

Mathematically diffusers' `MiniMaxH3AttnProcessor` (0.42.1): Q/K/V projections, per-head RMSNorm of Q
and K, partial rotate-half RoPE, non-causal unmasked attention, `flatten(2, 3).type_as(query)`,
`to_out`. The plan picks:

- the backend (`h3plan.facts.attention`): sdpa / fa4 / cudnn_bf16 / cudnn_fp8, with FA4's per-call 2-CTA
  switch;
- the lever sites (runtime/attention_sites.py, composed at install in levers/rules.py `ATTENTION_SITES` order by
  install/attention.py; this file names no lever): QK-norm + RoPE (eager, one fused kernel, or fused with the e4m3
  cast feeding cudnn_fp8), the FP8 scales (dynamic amax, or this layer's static table: `static_descales`), the
  projection exchange in the packed one's place (`projection_exchange`), and a world exchange in the Ulysses
  exchange's place (`world_call` over `world`: ring x Ulysses' RingUlysses);
- Ulysses (`ulysses_degree` > 1): h3plan.runtime.parallel.ulysses.UlyssesAttention over the installer's
  sequence shards, with the options the levers' `exchange_options` site gives (padding mode, head chunks, FP8 codes,
  prefix in place, split output);
- a lever's takeover of the attention call (`override`, set by that lever's install while installed: sparse
  attention's block-sparse forwards, runtime/levers/sparse_attention.py): on a call its `active` marks, after the
  Ulysses exchange (this rank's heads, the whole sequence), `override.take(q, k, v)` gives the output, or None where
  the call runs the backend as above (the override counts either way).

Guards per call: a refused kernel check, an unavailable backend, an attention mask or autograd route
that step to diffusers' own code and count `<lever>.fallback` with the reason. The backend's
runtime verdict is cached per (shapes, strides, dtype, device).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn

from h3plan.runtime.attention import ops as attention_ops
from h3plan.runtime.attention_sites import AttentionSites, eager_norm_rope
from h3plan.facts.attention import backend_spec
from h3plan.runtime.parallel.comm import amax_allreduce_hook
from h3plan.facts.sizes import valid_rows
from h3plan.runtime.quant.fp8 import shared_activation

from h3plan.runtime.guards import GRAD_REASON, count_route, needs_grad, signature as _sig
from h3plan.levers import backend_options, counter

# the counter of the backend this processor runs (its lever's SPEC.counter)
ATTENTION = counter("backend")


_BACKENDS: list = []  # backend objects by index, for the trace-time verdict below
_VERDICTS: dict = {}  # (backend index, signature) -> reason or None


def _verdict(index: int, sig: tuple) -> str | None:
    """The backend's runtime verdict for tensors of this signature (shapes, strides, dtype, device), computed
    once on empty tensors of that signature. Under torch.compile it runs at trace time and its result is a
    constant of the graph (the guards on the input's shape, dtype and device keep it valid)."""
    key = (index, sig)
    if key not in _VERDICTS:
        ts = [torch.empty_strided(shape, stride, dtype=dtype, device=device) for shape, stride, dtype, device in sig]
        _VERDICTS[key] = _BACKENDS[index].unavailable_reason(*ts)
    return _VERDICTS[key]


_traced_verdict = torch.compiler.assume_constant_result(_verdict)


class H3PlanAttnProcessor:
    """One instance per transformer-block attention (it holds that layer's static FP8 scales)."""

    def __init__(self, opts, backend, kernels: dict, original, *, sites: AttentionSites = AttentionSites(),
                 static_descales=None, shard=None, ulysses=None, world=None):
        self.opts, self.backend, self.kernels, self.original = opts, backend, kernels, original
        self.sites = sites  # the lever sites (runtime/attention_sites.py); `kernels`: the ops they look up per call
        self.spec = backend_spec(opts.backend)  # what the backend declares (h3plan/facts/attention/specs/)
        self.static_descales = static_descales  # (3,) fp32 descales of q, k, v (static FP8 scales)
        self.static_scales = None if static_descales is None else tuple((1.0 / static_descales).tolist())
        self.shard, self.ulysses = shard, ulysses  # installer's sequence-shard context, UlyssesAttention
        self.world = world  # the world exchange `sites.world_call` runs through (then ulysses is None)
        self.override: Any = None  # a lever's takeover of some calls (module docstring), set while it is installed
        self._act_dtype = None  # the activations' dtype of the current call (dequantised FP8 fallbacks)
        attention_ops.register(backend)
        if not any(b is backend for b in _BACKENDS):
            _BACKENDS.append(backend)
        self._backend_index = next(i for i, b in enumerate(_BACKENDS) if b is backend)

    def __repr__(self) -> str:
        return f"H3PlanAttnProcessor[{self.opts.describe()}]"

    # ---- pieces -------------------------------------------------------------------------------------

    def _diffusers_attention(self, q, k, v):
        return dispatch_attention_fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
                                     backend=self.original._attention_backend,
                                     parallel_config=self.original._parallel_config)

    def _backend_reason(self, q, k, v) -> str | None:
        if needs_grad(q, k, v):
            return GRAD_REASON
        if torch.compiler.is_compiling():
            return _traced_verdict(self._backend_index, _sig(q, k, v))
        return _verdict(self._backend_index, _sig(q, k, v))

    def _count_options(self, q):
        """Per call, each set option the backend checks (BackendOption.reason: FA4's 2-CTA switch and tile)."""
        for o in backend_options(self.spec.name):
            if o.reason is not None and getattr(self.opts, o.key):
                why = getattr(self.backend, o.reason)(q)
                count_route(counter(o.key), why)

    def _taken(self, q, k, v, out):
        """The override's output for this call (into `out` where given), or None: the backend runs."""
        o = self.override.take(q, k, v)
        if o is None or out is None:
            return o
        out.copy_(o)
        return out

    def attend(self, q, k, v, out=None, descales=None, amax=None):
        """Backend attention on (B, Sq, H, D) / (B, Skv, H, D); diffusers' dispatch when refused. `amax` (3,):
        the q/k/v amax cudnn_fp8 scales bf16 inputs by (the whole sequence's, under Ulysses). On a call an override
        marks active, the override's output where it takes the call (`_taken`)."""
        if self.override is not None and self.override.active:
            o = self._taken(q, k, v, out)
            if o is not None:
                return o
        reason = self._backend_reason(q, k, v)
        if count_route(ATTENTION, reason):
            self._count_options(q)
            if self.spec.fp8_inputs:
                d = descales if descales is not None else self._static(q)
                return attention_ops.call(self.backend, q, k, v, out=out, descales=d, amax=amax if d is None else None)
            return attention_ops.call(self.backend, q, k, v, out=out)
        if q.dtype == torch.float8_e4m3fn:  # codes from the fused FP8 kernel: dequantise for the eager path
            dtype = self._act_dtype or torch.bfloat16
            q, k, v = (t.float().mul(d).to(dtype) for t, d in zip((q, k, v), descales))
        o = self._diffusers_attention(q, k, v)
        if out is not None:
            out.copy_(o)
            return out
        return o

    def _static(self, q):
        if self.static_descales is None:
            return None
        if self.static_descales.device != q.device:
            self.static_descales = self.static_descales.to(q.device)
        return self.static_descales

    # ---- call ---------------------------------------------------------------------------------------

    def __call__(self, attn, hidden_states, rotary_emb=None, attention_mask=None):
        if attention_mask is not None:
            count_route(ATTENTION, "attention mask given (MiniMax-H3 packs no mask)")
            return self.original(attn, hidden_states, rotary_emb, attention_mask)
        sites = self.sites
        if self.ulysses is not None and sites.projection_exchange is not None:
            out = self._projection_call(attn, hidden_states, rotary_emb)
            if out is not None:
                return self._project_out(attn, out, hidden_states.dtype)
        if attn.fused_projections:
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            with shared_activation(hidden_states):  # FP8 linears quantise the shared input once
                query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        query = query.unflatten(-1, (attn.heads, -1))
        key = key.unflatten(-1, (attn.heads, -1))
        value = value.unflatten(-1, (attn.heads, -1))
        out_dtype = self._act_dtype = query.dtype

        if self.world is not None:
            out = sites.world_call(self, attn, query, key, value, rotary_emb)
        elif self.ulysses is not None:
            out = self._ulysses_call(attn, query, key, value, rotary_emb)
        elif sites.codes is not None:  # degree 1: codes straight into the FP8 backend
            q8, k8, v8, descales = sites.codes(attn, query, key, value, rotary_emb, self.static_scales)
            out = self.attend(q8, k8, v8, descales=descales).flatten(2, 3)
        else:
            query, key = sites.norm_rope(attn, query, key, rotary_emb)
            out = self.attend(query, key, value).flatten(2, 3)
        return self._project_out(attn, out, out_dtype)

    @staticmethod
    def _project_out(attn, out, out_dtype):
        hidden_states = out.to(out_dtype) if out.dtype != out_dtype else out
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states

    def _attn_fn(self, descales=None, amax=None):
        def attn_fn(q, k, v, out=None):
            return self.attend(q, k, v, out=out, descales=descales, amax=amax)

        attn_fn.out_dtype = self.backend.out_dtype
        return attn_fn

    def _ulysses_call(self, attn, q, k, v, rotary_emb):
        """Degree U > 1: this rank's rows in, (B, S_loc, H*D) out (h3plan.runtime.parallel.ulysses)."""
        U, S, sites = self.opts.ulysses_degree, self.shard.seq_len, self.sites
        ua = self.ulysses
        if sites.wire_codes is not None:
            vr = valid_rows(S, U, ua.rank)
            kw = dict(scales=self.static_scales, valid_len=vr, amax_hook=self._amax_hook, ulysses_degree=U)
            packed, descales = sites.wire_codes(attn, q, k, v, rotary_emb, **kw)
            return ua(None, None, None, self._attn_fn(descales), seq_len=S, packed=packed)
        if sites.packed is not None:
            packed = sites.packed(attn, q, k, v, rotary_emb, U)
            if packed is not None:
                amax = self._sequence_amax(packed.unbind(1), row_dim=2)  # (U, B, S_loc, H/U, D) each
                return ua(None, None, None, self._attn_fn(amax=amax), seq_len=S, packed=packed)
        qq, kk = eager_norm_rope(attn, q, k, rotary_emb)
        amax = self._sequence_amax((qq, kk, v), row_dim=1)
        return ua(qq, kk, v.contiguous(), self._attn_fn(amax=amax), seq_len=S)

    def _projection_call(self, attn, x, rotary_emb):
        """The projection exchange (`sites.projection_exchange`): this rank's rows of hidden states in, (B, S_loc, H*D)
        out, attention on this rank's heads over every row and then the output exchange; None where the site refuses
        the call (counted; the caller runs the packed exchange)."""
        gathered = self.sites.projection_exchange(self, attn, x, rotary_emb)
        if gathered is None:
            return None
        self._act_dtype = x.dtype
        return self.ulysses(None, None, None, self._attn_fn(), seq_len=self.shard.seq_len, gathered=gathered)

    def _sequence_amax(self, qkv, row_dim: int):
        """Dynamic FP8 attention under Ulysses with BF16 on the wire: the per-tensor amax of q, k, v over the
        whole sequence and every head (this rank's valid rows, MAX all-reduced over the group), as degree 1
        takes it over its whole tensors; the backend casts with it after the exchange. Without it each rank
        would scale by the amax of its own heads only, and no code would match degree 1. None when the
        backend takes no FP8 scales from here (BF16 backends, static tables, FP8 codes on the wire)."""
        if not self.spec.fp8_inputs or not self.sites.sequence_amax:
            return None

        vr = valid_rows(self.shard.seq_len, self.opts.ulysses_degree, self.ulysses.rank)
        amax = torch.stack([t.narrow(row_dim, 0, vr).abs().amax().float() if vr > 0 else
                            torch.zeros((), device=t.device) for t in qkv])
        return self._amax_hook(amax)

    @property
    def _amax_hook(self):
        if getattr(self, "_hook", None) is None:
            self._hook = amax_allreduce_hook(self.ulysses.group)
        return self._hook

