"""FlashAttention-4 (`flash_attn.cute.flash_attn_func`, flash-attn-4 4.0.0b36) forward.

SM90 dispatches FA4's FlashAttentionForwardSm90 (1-CTA only); the SM100 family (10.x, and 11.x which
FA4 treats alike) may use the 2-CTA tcgen05 kernel. FA4 reads FA_DISABLE_2CTA once, at import of
`flash_attn.cute.utils`, into the module flag `_fa_disable_2cta_enabled`; `interface._flash_attn_fwd`
reads that flag on every call. So a per-call 2-CTA switch sets the flag around the forward and puts it
back (`two_cta=True` allows 2-CTA, FA4's heuristics still decide per shape; `False` forces 1-CTA;
None leaves FA4's default). An explicit FA_DISABLE_2CTA in the environment always wins: the flag is
never touched then. FA4 also disables the 2-CTA forward on CUDA 12 (`_fa_disable_2cta_cuda12`).

Tile (`tile=`, the fa4_tile lever): a measured SM90 forward tile {tile_m, tile_n, mma_pv_is_rs,
intra_wg_overlap} passed to FA4's `interface._flash_attn_fwd` (the function `flash_attn_func` wraps; it
takes these as keyword arguments). `tile_reason(q)` says per call why the tile cannot apply (not SM9x,
an FA4 build whose `_flash_attn_fwd` lacks those arguments); the call then runs FA4's default tile and
the processor counts `fa4_tile.fallback` with that reason. The H200's tuned tile is bit-identical to FA4's default
(docs/measurements.md).

Ring block (`fa4_lse`): `flash_attn_func(..., return_lse=True)` returns (out, lse (B, h, Lq) fp32); builds
without `return_lse` return lse only when autograd needs it, so a missing lse is an error there. The 2-CTA
switch and tuned tiles are not applied to it (the plan blocks them under the ring).

Numerics: FA4's own (fp32 accumulation, bf16 output); not bitwise equal to SDPA (relative error about
3e-3 at H3 shapes, docs/sources.md#h200-anchors). Where it ran: docs/measurements.md; where the 2-CTA switch ran is
the hardware YAML's verified.settings.fa4_2cta (specs/fa4.py's `untested`, the installer's note).
"""

from __future__ import annotations

import inspect
import os
from contextlib import contextmanager


from h3plan.errors import UsageError

from .base import (AttentionBackend, cuda_reason, device_cc, device_facts, dtype_reason, facts_reason, shape_reason,
                   write_out)
from h3plan.facts.attention.specs.fa4 import SPEC

ENV = "FA_DISABLE_2CTA"
TILE_ARGS = ("tile_mn", "mma_pv_is_rs", "intra_wg_overlap")
_TILE_FN: list = []  # [(fn or None, reason or None)], resolved once per process


def _tile_fn():
    """(FA4's `_flash_attn_fwd`, None) when it takes the tile arguments, else (None, why not)."""
    if not _TILE_FN:
        try:
            from flash_attn.cute import interface

            fn = getattr(interface, "_flash_attn_fwd", None)
            if fn is None:
                _TILE_FN.append((None, "this flash_attn.cute has no interface._flash_attn_fwd"))
            else:
                missing = [a for a in TILE_ARGS if a not in inspect.signature(fn).parameters]
                _TILE_FN.append((None, f"this FA4's _flash_attn_fwd lacks {missing}") if missing else (fn, None))
        except Exception as exc:
            _TILE_FN.append((None, f"flash_attn.cute.interface import failed ({type(exc).__name__}: {exc})"))
    return _TILE_FN[0]


def _import():
    from flash_attn.cute import flash_attn_func
    from flash_attn.cute import utils

    return flash_attn_func, utils


def _device_reason(q) -> str | None:
    """This device's facts (specs/fa4.py's needs, hardware.fa4.head_dim_limit), q's dtype."""
    cc = device_cc(q)
    facts, why = device_facts(cc)
    if facts is None:
        return f"FA4: {why}"
    reason = facts_reason(SPEC, facts) or dtype_reason(SPEC, q)
    if reason:
        return reason
    D, hi = q.shape[-1], facts["fa4"]["head_dim_limit"]
    if not (8 <= D <= hi and D % 8 == 0):
        return f"FA4 on SM{cc[0]}{cc[1]} needs head_dim in [8, {hi}] divisible by 8, got {D}"
    return None


class FA4Backend(AttentionBackend):
    name = "fa4"

    def __init__(self, two_cta: bool | None = None, tile: dict | None = None):
        self.two_cta = two_cta
        self.tile = dict(tile) if tile else None

    def unavailable_reason(self, q, k=None, v=None) -> str | None:
        reason = shape_reason(q, k, v) or cuda_reason(q, "FA4") or _device_reason(q)
        if reason:
            return reason
        try:
            _import()
        except Exception as exc:
            return f"flash_attn.cute import failed ({type(exc).__name__}: {exc})"
        return None

    def two_cta_reason(self, q) -> str | None:
        """None when this call lets FA4 use its 2-CTA kernel; else why not."""
        if ENV in os.environ:
            return f"{ENV}={os.environ[ENV]} in the environment wins over the plan"
        facts, why = device_facts(device_cc(q))
        if facts is None:
            return f"FA4 2-CTA: {why}"
        if not facts["fa4"]["two_cta"]:
            return f"FA4 has no 2-CTA kernel on {facts['name']} (hardware.fa4.two_cta=false; {facts['fa4']['source']})"
        _, utils = _import()
        if getattr(utils, "_fa_disable_2cta_cuda12", False):
            return "FA4 disables its 2-CTA forward on CUDA 12"
        return None

    def tile_reason(self, q) -> str | None:
        """None when this call runs the planned tile; else why FA4's default tile runs instead."""
        if not self.tile:
            return "no tile planned"
        facts, why = device_facts(device_cc(q))
        keys = ("tile_m", "tile_n", "mma_pv_is_rs", "intra_wg_overlap")
        listed = [{k: t[k] for k in keys} for t in (facts or {}).get("fa4", {}).get("tuned_tiles") or []]
        if facts is None or {k: self.tile[k] for k in keys} not in listed:
            where = why or f"{facts['name']} (hardware.fa4.tuned_tiles)"
            return f"the tile was not measured on this device: {where}"
        return _tile_fn()[1]

    @contextmanager
    def _cta_switch(self, utils):
        if self.two_cta is None or ENV in os.environ or not hasattr(utils, "_fa_disable_2cta_enabled"):
            yield
            return
        prev = utils._fa_disable_2cta_enabled
        utils._fa_disable_2cta_enabled = not self.two_cta
        try:
            yield
        finally:
            utils._fa_disable_2cta_enabled = prev

    def __call__(self, q, k, v, out=None):
        flash_attn_func, utils = _import()
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
        if self.tile and self.tile_reason(q) is None:
            t = self.tile
            o = _tile_fn()[0](q, k, v, softmax_scale=None, causal=False, tile_mn=(t["tile_m"], t["tile_n"]),
                              mma_pv_is_rs=t["mma_pv_is_rs"], intra_wg_overlap=t["intra_wg_overlap"])[0]
            return write_out(o, out)
        with self._cta_switch(utils):
            o, _lse = flash_attn_func(q, k, v, softmax_scale=None, causal=False)
        return write_out(o, out)

    def __repr__(self) -> str:
        tile = f", tile={self.tile['tile_m']}x{self.tile['tile_n']}" if self.tile else ""
        return f"FA4Backend(two_cta={self.two_cta}{tile})"


_LSE_FN: list = []  # [(flash_attn_func, takes return_lse) or (None, reason)], resolved once


def _lse_fn():
    if not _LSE_FN:
        try:
            from flash_attn.cute import flash_attn_func

            try:
                takes = "return_lse" in inspect.signature(flash_attn_func).parameters
            except (TypeError, ValueError):
                takes = False
            _LSE_FN.append((flash_attn_func, takes))
        except Exception as exc:  # ImportError, or a CUDA/cutlass error raised at import
            _LSE_FN.append((None, f"flash_attn.cute import failed ({type(exc).__name__}: {exc})"))
    return _LSE_FN[0]


def fa4_lse_reason(q) -> str | None:
    """Why the ring's FA4 block call cannot run on CUDA tensors like q (h3plan/runtime/parallel/lse.py checks the
    rest)."""
    reason = _device_reason(q)
    if reason:
        return reason
    fn, why = _lse_fn()
    return why if fn is None else None


def fa4_lse(q, k, v):
    """Ring block attention: (out (B, Lq, h, D), lse (B, h, Lq) fp32)."""
    fn, takes = _lse_fn()
    if fn is None:
        raise UsageError(takes)
    kw = {"return_lse": True} if takes else {}
    o, lse = fn(q, k, v, softmax_scale=None, causal=False, **kw)
    if lse is None:
        raise UsageError("this flash_attn.cute returned no lse (no return_lse argument): use sdpa_flash")
    return o, lse
