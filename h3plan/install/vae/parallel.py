"""The vae_parallel lever: one VAE decode spread over the ranks of a process group (the plan's Ulysses group).

diffusers' AutoencoderKLMiniMaxH3._decode (0.42.1, models/autoencoders/autoencoder_kl_minimax_h3.py) decodes
a latent as temporal chunks; `_decode_clip` cuts each chunk into spatial tiles (`_split_tiles`) and calls
`self.decoder(self.post_quant_conv(tile))` once per tile, then `_stitch_tiles` blends them (`_blend`) and
`_decode` cross-fades the chunks (`_blend` on frames) and trims the padding. The decoder calls are
independent; only the stitching reads several. Installed, `vae._decode` becomes a ParallelDecode that:

1. lists the (chunk, tile) work items in diffusers' call order. Mirrored from diffusers: the chunk loop of
   `_decode` (the token padding, `tokens_chunk_size`, `token_overlap`: tiling.chunk_layout) and
   the tile slicing of `_decode_clip`; the tile grid itself comes from diffusers' `_split_tiles`;
2. decodes this rank's contiguous share (parallel_plan.shares; counts differ by at most one) with the
   model's own `decoder(post_quant_conv(tile))` (whatever decoder forward is installed: vae_graphs' replay,
   vae_ops' blocks), each output copied into this rank's slot of one byte buffer;
3. all-gathers that buffer in place (the slot is the send buffer): bytes, so every dtype keeps its bits on
   gloo and NCCL; slots are padded to the largest share and start with a status header;
4. runs diffusers' own `_decode` on every rank with `decoder.forward` answering each call from the gathered
   items in order: the stitching, blending, cropping and trimming are diffusers' code, so the video is
   bitwise the one-GPU decode given bitwise tiles (the same decoder on the same input and hardware).
   `post_quant_conv` runs again per tile there (a 1x1 conv on the latent tile). A call whose input shape is
   not the item's (diffusers changed its order?) is decoded locally from then on (counted
   `vae_parallel.replay.fallback`), so the output stays exact.

Guards, one counted event per `_decode` call (`vae_parallel.fused`, or `vae_parallel.fallback` with the
reason, and diffusers' decode): torch.compile tracing, no process group, a group of one rank, a backend
that cannot move tensors on the latent's device; then, agreed over the group by one small all_gather
(so every rank takes the same path): tiling off, autograd recording, hooks on the decoder, fewer than two
work items, and ranks holding different latents (shape, dtype, geometry or a checksum differ: each rank
decodes its own). A decoded item whose shape or dtype differs from the prediction makes every rank fall
back after the gather; an exception while decoding is re-raised on its rank and raised on the others.

Memory per rank: the gather buffer, degree x the largest share of decoded tiles (3.4 GiB at the released
latent [1, 24, 62, 48, 84] in FP16, any degree), plus what diffusers' stitching holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from h3plan.errors import InstallError
from h3plan.install.hooks import attached, effect, foreign
from h3plan.runtime.parallel.comm import degree_rank, device_reason
from h3plan.runtime.guards import count_route
from h3plan.levers import SPECS, owner
from h3plan.facts.vae.parallel_plan import HEADER_BYTES, aligned, shares
from h3plan.facts.vae.tiling import Geometry, chunk_layout

SPEC = SPECS[owner("parallel")]
LEVER = SPEC.name
COUNTER = SPEC.count()


logger = logging.getLogger("h3plan.install")

REPLAY = SPEC.count("replay")
OK, MISMATCH, FAILED = 0, 1, 2
# local guard reasons travel between ranks as their code (index here)
LOCAL_REASONS = (
    None,
    "tiling off: diffusers decodes each temporal chunk in one decoder call",
    "autograd is recording: the gathered tiles keep no backward",
    "the decoder carries forward hooks (offloading?): they would run again on replayed tiles",
    "fewer than two work items: nothing to spread",
    "latent is not [B, C, frames, height, width]",
    "listing the work items failed (logged on that rank)",
)
TILING_OFF, GRAD, HOOKS, FEW_ITEMS, NOT_5D, LIST_FAILED = range(1, len(LOCAL_REASONS))
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
DIFFUSERS_METHODS = ("_decode", "_decode_clip", "_split_tiles", "_stitch_tiles", "_blend")


@dataclass
class Item:
    """One decoder call: its latent tile (a view) and the decoder output it must give."""

    tile: torch.Tensor
    out_shape: tuple[int, ...]


def _all_gather_bytes(buf: torch.Tensor, mine: torch.Tensor, group) -> None:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    gather(buf, mine, group=group)


def _hooked(m) -> bool:
    """m carries a hook a plan did not register (a user's diffusers hook, a torch hook, accelerate's)."""
    return bool(m._forward_hooks or m._forward_pre_hooks or foreign(m) or hasattr(m, "_hf_hook"))


class _Replay:
    """Stands in for the decoder's forward during diffusers' `_decode` (a hook `h3plan.vae_parallel` for that call):
    call k returns gathered item k."""

    def __init__(self, items: list[Item], outputs: list[torch.Tensor], local: Callable, check: Callable | None):
        self.items, self.outputs, self.local, self.check = items, outputs, local, check
        self.k, self.broken = 0, None

    def __call__(self, x, *args, **kwargs):
        k = self.k
        self.k += 1
        if self.broken is None:
            if args or kwargs:
                self.broken = "decoder called with extra arguments"
            elif k >= len(self.items):
                self.broken = f"decoder call {k + 1} beyond the {len(self.items)} listed work items"
            elif tuple(x.shape) != tuple(self.items[k].tile.shape):
                self.broken = (f"decoder call {k} got {tuple(x.shape)}, work item {k} is "
                               f"{tuple(self.items[k].tile.shape)}")
            elif self.check is not None and not self.check(k, x):
                self.broken = f"decoder call {k}: input differs from work item {k}"
        if self.broken is not None:
            count_route(REPLAY, self.broken + ": decoded locally from here on")
            return self.local(x, *args, **kwargs)
        count_route(REPLAY, None)
        return self.outputs[k]


class ParallelDecode:
    """Callable installed as the VAE's `_decode` (see the module docstring)."""

    def __init__(self, vae, group=None, *, original: Callable, check_inputs: bool = False):
        self.vae, self.group, self.original, self.check_inputs = vae, group, original, check_inputs
        self.last: dict | None = None  # what the last parallel decode did (items, shares, bytes)

    # ------------------------------------------------------------------ work items
    def items(self, z: torch.Tensor) -> list[Item]:
        """(chunk, tile) decoder calls of diffusers' `_decode(z)`, in its order (see the module docstring)."""
        vae = self.vae
        dec = vae.decoder
        pad, chunks = chunk_layout(z.shape[2], self._geometry())
        if pad:
            z = torch.cat([z, z[:, :, -1:].repeat(1, 1, pad, 1, 1)], dim=2)
        r = vae.spatial_compression_ratio
        ys = vae._split_tiles(z.shape[-2] * r, vae.tile_sample_min_height, vae.tile_sample_min_overlap_height)
        xs = vae._split_tiles(z.shape[-1] * r, vae.tile_sample_min_width, vae.tile_sample_min_overlap_width)
        out = []
        for start, stop in chunks:
            clip = z[:, :, start:stop]
            for i, ih in zip(ys[0], ys[1]):
                for j, jw in zip(xs[0], xs[1]):
                    tile = clip[..., i // r: i // r + ih // r, j // r: j // r + jw // r]
                    b, _, t, h, w = tile.shape
                    out.append(Item(tile, (b, dec.out_channels, t * dec.patch_size_t, h * dec.patch_size,
                                           w * dec.patch_size)))
        return out

    def _geometry(self) -> Geometry:
        return geometry(self.vae)

    def out_dtype(self, z: torch.Tensor) -> torch.dtype:
        """The decoder output dtype: autocast's for the device when on, else proj_out's weights'."""
        dt = z.device.type
        if torch.is_autocast_enabled(dt) and torch.get_autocast_dtype(dt) in (torch.float16, torch.bfloat16):
            return torch.get_autocast_dtype(dt)
        return self.vae.decoder.proj_out.weight.dtype

    # ------------------------------------------------------------------ guards
    def group_reason(self, z) -> str | None:
        if torch.compiler.is_compiling():
            return "torch.compile is tracing: diffusers' decode"
        if not (dist.is_available() and dist.is_initialized()):
            return "no process group (torch.distributed is not initialised)"
        world, rank = degree_rank(self.group)
        if rank < 0:
            return "this rank is not a member of the process group"
        if world < 2:
            return "the process group has one rank"
        return device_reason(self.group, z.device)

    def local_reason(self, z, items) -> int:
        """0 when this rank can take part, else the code of its LOCAL_REASONS entry."""
        vae = self.vae
        if z.dim() != 5:
            return NOT_5D
        if not vae.use_tiling:
            return TILING_OFF
        if torch.is_grad_enabled() and (z.requires_grad or any(p.requires_grad for p in vae.decoder.parameters())):
            return GRAD
        if _hooked(vae.decoder):
            return HOOKS
        if len(items) < 2:
            return FEW_ITEMS
        return 0

    def _agree(self, z, code: int, world: int) -> str | None:
        """One all_gather of [reason code, shapes, geometry, checksum]: the same verdict on every rank."""
        vae = self.vae
        sig = [code, *(z.shape if z.dim() == 5 else [0] * 5), DTYPES.index(z.dtype) if z.dtype in DTYPES else -1,
               int(vae.use_tiling), vae.tile_sample_min_height, vae.tile_sample_min_width,
               vae.tile_sample_min_overlap_height, vae.tile_sample_min_overlap_width]
        flat = z.detach().reshape(-1).double()
        ramp = torch.arange(flat.numel(), device=z.device, dtype=torch.float64).remainder_(251).add_(1)
        sums = torch.stack([flat.sum(), (flat * ramp).sum()]).view(torch.int64)
        mine = torch.cat([torch.tensor(sig, dtype=torch.int64, device=z.device), sums])
        allv = torch.empty(world * mine.numel(), dtype=torch.int64, device=z.device)
        _all_gather_bytes(allv, mine, self.group)
        rows = allv.view(world, -1).tolist()
        for q, row in enumerate(rows):
            if row[0]:
                return f"rank {q}: {LOCAL_REASONS[row[0]]}"
        if any(row[1:12] != rows[0][1:12] for row in rows):
            return "ranks hold latents of different shapes or dtypes, or different tiling: each decodes its own"
        if any(row[12:] != rows[0][12:] for row in rows):
            return "ranks hold different latents (checksums differ): each decodes its own"
        return None

    # ------------------------------------------------------------------ call
    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        why = self.group_reason(z)
        if why is not None:
            count_route(COUNTER, why)
            return self.original(z)
        world, rank = degree_rank(self.group)
        try:
            items = self.items(z) if z.dim() == 5 and self.vae.use_tiling else []
            code = self.local_reason(z, items)
        except Exception:  # the other ranks are about to wait in the agreement: tell them instead of raising
            logger.exception("%s: rank %d could not list the work items", LEVER, rank)
            items, code = [], LIST_FAILED
        why = self._agree(z, code, world)
        if why is not None:
            count_route(COUNTER, why)
            return self.original(z)
        outputs, why = self._gather(z, items, world, rank)
        if why is not None:
            count_route(COUNTER, why)
            return self.original(z)
        count_route(COUNTER, None)
        return self._replay(z, items, outputs)

    def _gather(self, z, items, world, rank):
        dtype = self.out_dtype(z)
        esize = torch.empty((), dtype=dtype).element_size()
        sizes = [aligned(torch.Size(it.out_shape).numel() * esize) for it in items]
        sh = shares(len(items), world)
        slot = aligned(HEADER_BYTES + max(sum(sizes[lo:hi]) for lo, hi in sh))
        buf = torch.empty(world * slot, dtype=torch.uint8, device=z.device)
        mine = buf[rank * slot:(rank + 1) * slot]
        lo, hi = sh[rank]
        status, bad, err = OK, -1, None
        off = HEADER_BYTES
        dec, pqc = self.vae.decoder, self.vae.post_quant_conv
        for k in range(lo, hi):
            try:
                out = dec(pqc(items[k].tile))
            except Exception as exc:  # the other ranks are about to wait in the gather: tell them, then raise
                status, bad, err = FAILED, k, exc
                break
            if tuple(out.shape) != items[k].out_shape or out.dtype != dtype:
                logger.warning("%s: rank %d: decoded tile %d is %s %s, predicted %s %s", LEVER, rank, k,
                               tuple(out.shape), out.dtype, items[k].out_shape, dtype)
                status, bad = MISMATCH, k
                break
            mine[off:off + sizes[k]].view(dtype)[:out.numel()].view(out.shape).copy_(out)
            off += sizes[k]
            del out
        mine[:HEADER_BYTES].view(torch.int64).copy_(torch.tensor([status, bad], dtype=torch.int64))
        _all_gather_bytes(buf, mine, self.group)
        heads = buf.view(world, slot)[:, :HEADER_BYTES].contiguous().view(torch.int64).tolist()
        if err is not None:
            raise err
        for q, (st, k) in enumerate(heads):
            if st == FAILED:
                raise RuntimeError(f"{LEVER}: rank {q} failed decoding work item {k} (its own error is raised there)")
        for q, (st, k) in enumerate(heads):
            if st == MISMATCH:
                return None, f"rank {q}: decoded work item {k} did not have the predicted shape and dtype"
        outputs = []
        for q, (a, b) in enumerate(sh):
            off = q * slot + HEADER_BYTES
            for k in range(a, b):
                n = torch.Size(items[k].out_shape).numel()
                outputs.append(buf[off:off + sizes[k]].view(dtype)[:n].view(items[k].out_shape))
                off += sizes[k]
        self.last = {"items": len(items), "shares": sh, "slot_bytes": slot, "buffer_bytes": world * slot,
                     "gathered_bytes": (world - 1) * slot, "dtype": str(dtype).replace("torch.", "")}
        return outputs, None

    def _replay(self, z, items, outputs):
        dec, vae = self.vae.decoder, self.vae
        check = None
        if self.check_inputs:
            def check(k, x):
                return torch.equal(x, vae.post_quant_conv(items[k].tile))
        replay = _Replay(items, outputs, dec.forward, check)
        with attached(dec, "decoder", LEVER, lambda previous, *args, **kwargs: replay(*args, **kwargs), replaces=False):
            out = self.original(z)
        if replay.broken is None and replay.k != len(items):
            count_route(REPLAY, f"diffusers made {replay.k} decoder calls, {len(items)} work items were listed")
        return out


def geometry(vae) -> Geometry:
    """The planning geometry of this VAE as configured now (compression, chunking, tiling)."""
    return Geometry(spatial_ratio=vae.spatial_compression_ratio, temporal_ratio=vae.temporal_compression_ratio,
                    clip_length=vae.config.clip_length, token_drop=vae.config.token_drop,
                    out_channels=vae.decoder.out_channels, tile_height=vae.tile_sample_min_height,
                    tile_width=vae.tile_sample_min_width, overlap_height=vae.tile_sample_min_overlap_height,
                    overlap_width=vae.tile_sample_min_overlap_width, tiling=bool(vae.use_tiling))


def recognise(vae) -> None:
    """Raise InstallError unless `vae` runs diffusers' own chunk and tile loops (the work items mirror them)."""
    from diffusers import AutoencoderKLMiniMaxH3

    problems = []
    if not isinstance(vae, AutoencoderKLMiniMaxH3):
        problems.append(f"{type(vae).__name__} is not diffusers' AutoencoderKLMiniMaxH3")
    else:
        for name in DIFFUSERS_METHODS:
            if name in vae.__dict__ and not isinstance(vae.__dict__[name], ParallelDecode):
                problems.append(f"{name} is patched on the instance")
            elif getattr(type(vae), name) is not getattr(AutoencoderKLMiniMaxH3, name):
                problems.append(f"{type(vae).__name__} overrides {name}")
        for name in ("patch_size", "patch_size_t", "out_channels", "proj_out"):
            if not hasattr(vae.decoder, name):
                problems.append(f"decoder.{name} is missing")
        if not problems:
            g = geometry(vae)
            got = (vae.tokens_chunk_size, vae.token_overlap)
            if got != (g.tokens_chunk_size, g.token_overlap):
                problems.append(f"tokens_chunk_size, token_overlap = {got}, the chunk mirror derives "
                                f"{(g.tokens_chunk_size, g.token_overlap)}")
    if problems:
        raise InstallError(f"{LEVER}: cannot spread this VAE's decode: " + "; ".join(problems))


def install_parallel(vae, group=None, *, report=None, check_inputs: bool = False) -> Callable[[], None]:
    """Install ParallelDecode as `vae._decode` for `group` (None: the default group at call time); returns
    the undo. report: an InstallReport to log the swap in."""
    recognise(vae)
    if isinstance(vae.__dict__.get("_decode"), ParallelDecode):
        raise InstallError(f"{LEVER}: already installed on this VAE (undo it first)")
    pd = ParallelDecode(vae, group, original=vae._decode, check_inputs=check_inputs)
    vae._decode = pd
    if report is not None:
        report.swap(LEVER, "_decode", "AutoencoderKLMiniMaxH3._decode",
                    "work items spread over the process group, gathered, stitched by diffusers' _decode")

    def undo():
        if vae.__dict__.get("_decode") is pd:
            del vae.__dict__["_decode"]

    return undo


def apply(vae, group, state) -> None:
    """The installer's step (install.py's pattern): install, its undo the restore of a hook `h3plan.vae_parallel` on
    the VAE."""
    effect(vae, LEVER, state, install_parallel(vae, group, report=state.report))


__all__ = ["ParallelDecode", "install_parallel", "apply", "recognise", "LEVER", "REPLAY"]
