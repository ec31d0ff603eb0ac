"""Install a Plan's VAE levers into diffusers' AutoencoderKLMiniMaxH3 (the installer dispatches here).

- `vae_ops` (builder option `vae_ops=True`; the decision's `params.ops` picks the ops, default all of
  vae_block.OPS): every ViT decoder block gets the plan forward of vae_block.py. `fp16_weights` replaces
  the six block linears' weights and biases on the device by their float16 casts (autocast's cast, made
  once) and moves the originals to host memory as masters (vae_weights.py): the device holds 2 bytes
  per weight of those linears instead of 4 (4.5 GiB less at the released config, where float16 copies
  beside the originals used to add 4.5 GiB). While
  installed the state dict, `parameters()` and `save_pretrained` see float16 there (the report says so);
  every call outside FP16 autocast computes on the masters, counted; uninstall puts the originals back
  bit for bit. A float16 `torch_dtype` has nothing to swap; float64, meta or split devices are skipped
  with the reason.
- `vae_graphs` (builder option `graphs=True`): `decoder.forward` becomes a GraphedDecoder
  (vae_graph.py) that replays the whole ViT decoder forward from one CUDA graph per input signature,
  with a counted per-call guard that runs diffusers' forward when a graph cannot apply.
- `vae_tiles` (builder option `tile`): the geometry goes through diffusers' own
  `enable_tiling(tile_sample_min_height, tile_sample_min_width, tile_sample_min_overlap_height,
  tile_sample_min_overlap_width)`; diffusers tiles spatially only, so `tile.frames` is reported, not
  applied. `fp8_tiles` (`tile_dtype` fp8) also makes every decoder block's six linears FP8 GEMMs
  (vae_fp8.py: per-channel e4m3 weights quantised once here, per-row e4m3 activations, float16 out;
  lossy), with or without vae_ops: a block without vae_ops gets the plan forward with no ops, which is
  diffusers' block op for op apart from those GEMMs. Float64, meta or split-device linears are skipped
  with the reason. `default` leaves the model's tiling as it is.

Transformer levers in the plan are reported skipped (they install into MiniMaxH3Transformer3DModel).
Uninstall (installer.uninstall) restores the block forwards, the block linears' parameters and the tiling
attributes exactly.
"""

from __future__ import annotations

import logging
import types

import torch

from h3plan.errors import InstallError

from .report import Swap
from .vae_block import LINEARS, VaeBlockState, load_kernels, plan_vae_block_forward
from .vae_fp8 import Fp8Gemms
from .vae_graph import GraphedDecoder
from .vae_weights import FP16, Fp16Weights, is_guarded_linear

logger = logging.getLogger("h3plan.install")

from h3plan.levers import SPECS

VAE_LEVERS = tuple(name for name, s in SPECS.items() if s.model == "vae")
TILING = ("use_tiling", "tile_sample_min_height", "tile_sample_min_width", "tile_sample_min_overlap_height",
          "tile_sample_min_overlap_width")
RELEASED = (True, 256, 256, 64, 64)  # diffusers' AutoencoderKLMiniMaxH3.__init__ tiling
AUTOCAST_CASTS = {torch.float32, torch.bfloat16, torch.float16}  # autocast casts these to float16, not float64


def _classes():
    from diffusers import AutoencoderKLMiniMaxH3
    from diffusers.models import activations
    from diffusers.models.autoencoders import autoencoder_kl_minimax_h3 as am

    return AutoencoderKLMiniMaxH3, am.MiniMaxH3VideoTransformerBlock, am.MiniMaxH3VideoAttention, activations.SwiGLU


def is_vae(model) -> bool:
    return isinstance(model, _classes()[0])


def _ours(m) -> bool:
    """An instance forward this installer put there (a plan block forward, a guarded fp16 linear)."""
    return getattr(m.__dict__.get("forward"), "__func__", None) is plan_vae_block_forward or is_guarded_linear(m)


def _hooked(m) -> bool:
    return bool(("forward" in m.__dict__ and not _ours(m)) or m._forward_hooks or m._forward_pre_hooks
                or hasattr(m, "_diffusers_hook") or hasattr(m, "_hf_hook"))


def recognise(model) -> None:
    """Raise one ValueError unless the VAE's decoder blocks have the parts the plan forward uses."""
    _, Block, Attention, SwiGLU = _classes()
    problems = []
    blocks = getattr(getattr(model, "decoder", None), "transformer_blocks", None)
    if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
        problems.append("decoder.transformer_blocks is missing or empty")
    for i, b in enumerate(blocks or ()):
        fqn = f"decoder.transformer_blocks.{i}"
        if not isinstance(b, Block):
            problems.append(f"{fqn} is {type(b).__name__}")
            continue
        if not isinstance(getattr(b, "attn", None), Attention):
            problems.append(f"{fqn}.attn is not MiniMaxH3VideoAttention")
            continue
        for path in ("norm1", "norm2", "attn.norm_q", "attn.norm_k", *LINEARS):
            try:
                b.get_submodule(path)
            except AttributeError:
                problems.append(f"{fqn}.{path} is missing")
        problems += [f"{fqn}.{n} is missing" for n in ("scale1", "scale2") if not isinstance(getattr(b, n, None), torch.Tensor)]
        if problems:
            continue
        for path in LINEARS:
            if not isinstance(b.get_submodule(path), torch.nn.Linear):
                problems.append(f"{fqn}.{path} is {type(b.get_submodule(path)).__name__}, not nn.Linear")
        if not isinstance(b.ff.net[0], SwiGLU):
            problems.append(f"{fqn}.ff.net.0 is {type(b.ff.net[0]).__name__}, not SwiGLU")
        if b.attn.norm_q.weight is not None or b.attn.norm_k.weight is not None:
            problems.append(f"{fqn}.attn norm_q/norm_k have an affine weight (diffusers' VAE has none)")
        own = getattr(b.__dict__.get("forward"), "__func__", None) is plan_vae_block_forward
        if "forward" in b.__dict__ and not own:
            problems.append(f"{fqn} already has an instance forward (a hook?); install before hooks")
        for path in ("attn", "ff", "ff.net.0", *LINEARS):
            if _hooked(b.get_submodule(path)):
                problems.append(f"{fqn}.{path} carries hooks (offloading, layerwise casting?); install before them")
    if problems:
        raise InstallError("h3plan.install: unexpected AutoencoderKLMiniMaxH3 layout: " + "; ".join(problems[:5]))


def _swap(report, lever, fqn, old, new) -> None:
    s = Swap(lever, fqn, old, new)
    report.swaps.append(s)
    logger.info("%s", s)


def _fp16_blocker(blocks) -> str | None:
    """Why fp16_weights has nothing to swap in these blocks (None: swap)."""
    params = [t for b in blocks for p in LINEARS for t in (b.get_submodule(p).weight, b.get_submodule(p).bias) if t is not None]
    dtypes, devices = {t.dtype for t in params}, {t.device for t in params}
    if dtypes == {FP16}:
        return "decoder block linears are already float16: nothing to swap"
    if not dtypes <= AUTOCAST_CASTS:
        return f"decoder block linears are {sorted(map(str, dtypes))}: autocast would not cast them to float16"
    if len(devices) != 1 or next(iter(devices)).type == "meta":
        return f"decoder block linears on {sorted(map(str, devices))}: float16 weights need them loaded on one device"
    return None


def _install_ops(model, builder, state) -> None:
    lever = builder.lever_of("ops")
    ops = builder.values["ops"]
    kernels = load_kernels(ops)
    report = state.report
    blocks = model.decoder.transformer_blocks
    blocker = _fp16_blocker(blocks) if "fp16_weights" in ops else None
    if blocker:
        report.skipped.append((f"{lever}.fp16_weights", blocker))
    swap = "fp16_weights" in ops and blocker is None
    old = "/".join(sorted({str(b.get_submodule(p).weight.dtype).replace("torch.", "") for b in blocks for p in LINEARS}))
    moved = []
    for i, block in enumerate(blocks):
        fqn = f"decoder.transformer_blocks.{i}"
        weights = None
        if swap:
            weights = Fp16Weights.swap(fqn, [block.get_submodule(p) for p in LINEARS])
            state.undo.append(weights.restore)
            weights.guard_linears()
            moved.append(weights)
        block._h3plan_vae = VaeBlockState(frozenset(ops), kernels, weights)
        block.forward = types.MethodType(plan_vae_block_forward, block)

        def undo(b=block):
            for attr in ("forward", "_h3plan_vae"):
                b.__dict__.pop(attr, None)

        state.undo.append(undo)
        if weights is not None:
            _swap(report, lever, f"{fqn} linears ({len(LINEARS)})", f"{old} + autocast casts",
                  "float16 on the device (float32 masters on the host)")
        if "qk_norm_rope" in ops:
            _swap(report, lever, f"{fqn}.attn.norm_q/norm_k+rope", "eager", "fused")
        if "swiglu" in ops:
            _swap(report, lever, f"{fqn}.ff.net.0 swiglu", "eager", "fused")
        if "scaled_residual" in ops:
            _swap(report, lever, f"{fqn} scaled residual", "eager", "fused")
    if moved:
        n = sum(len(w.swapped) for w in moved)
        host, saved = sum(w.host_bytes for w in moved), sum(w.saved_bytes for w in moved)
        where = "pinned host memory" if moved[0].pinned else "host memory"
        report.notes.append(
            f"vae_ops.fp16_weights: {n} decoder-block linear weights/biases ({len(blocks)} blocks x {len(LINEARS)} linears) "
            f"are float16 on {moved[0].device} while installed; their {old} originals ({host / 2**30:.3f} GiB) moved to "
            f"{where} as masters: the device saves {saved / 2**30:.3f} GiB. state_dict(), parameters() and "
            "save_pretrained see float16 there (vae.dtype does not change); uninstall restores the originals bit for bit")


def _install_graphs(model, builder, state) -> None:
    lever = builder.lever_of("graphs")
    dec = model.decoder
    if _hooked(dec) or any(_hooked(m) for m in dec.modules() if m is not dec):
        state.report.skipped.append((lever, "the ViT decoder or one of its modules carries hooks or an instance forward "
                                            "(offloading?): a CUDA graph would freeze what they do; diffusers' forward kept"))
        return
    swapped = [w for b in dec.transformer_blocks if (w := getattr(getattr(b, "_h3plan_vae", None), "weights", None))]
    gd = GraphedDecoder(dec, dec.forward, validate=(lambda: [w.verify() for w in swapped]) if swapped else None)
    dec.forward = gd

    def undo():
        dec.__dict__.pop("forward", None)
        gd.release()

    state.undo.append(undo)
    _swap(state.report, lever, "decoder.forward", type(dec).__name__ + ".forward",
          "CUDA graph replay, one graph per input signature (diffusers' forward when a guard refuses)")


def _geometry(model) -> str:
    if not model.use_tiling:
        return "tiling off"
    return (f"{model.tile_sample_min_height}x{model.tile_sample_min_width} px, overlap "
            f"{model.tile_sample_min_overlap_height}x{model.tile_sample_min_overlap_width}")


def _check_tile(model, tile: dict) -> tuple[int, int, int]:
    r = model.spatial_compression_ratio
    h, w, o = (tile.get(k) for k in ("height", "width", "overlap"))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (h, w, o)):
        raise InstallError(f"vae_tiles: tile height/width/overlap must be ints, got {tile}")
    if any(v % r for v in (h, w, o)) or o < r or o >= min(h, w):
        raise InstallError(f"vae_tiles: tile {h}x{w}, overlap {o} must be multiples of the VAE's spatial compression "
                         f"{r} with {r} <= overlap < min(height, width) (diffusers' _split_tiles needs it)")
    return h, w, o


def _install_tiles(model, builder, state) -> None:
    lever = builder.lever_of("tile")
    tile = builder.values["tile"]
    h, w, o = _check_tile(model, tile)
    before, old = {a: getattr(model, a) for a in TILING}, _geometry(model)
    model.enable_tiling(tile_sample_min_height=h, tile_sample_min_width=w, tile_sample_min_overlap_height=o,
                        tile_sample_min_overlap_width=o)
    state.undo.append(lambda: [setattr(model, a, v) for a, v in before.items()])
    got = tuple(getattr(model, a) for a in TILING)
    if got != (True, h, w, o, o):
        raise ValueError(f"vae_tiles: enable_tiling left {dict(zip(TILING, got))}, asked for {h}x{w} overlap {o}")
    _swap(state.report, lever, "tiling", old, _geometry(model))
    if tile.get("frames") is not None:
        state.report.notes.append(f"vae_tiles: tile.frames={tile['frames']} not applied: diffusers tiles spatially "
                                  "only (temporal chunks follow clip_length)")


def _install_fp8(model, builder, state) -> None:
    lever = builder.lever_of("tile_dtype")
    blocks = model.decoder.transformer_blocks
    blocker = _fp16_blocker(blocks)
    if blocker and "already float16" not in blocker:
        state.report.skipped.append((f"{lever}.fp8_gemm", blocker.replace("float16 weights", "FP8 codes")
                                     .replace("to float16", "to float16 for the FP8 GEMMs")))
        return
    added = 0
    for i, block in enumerate(blocks):
        fqn = f"decoder.transformer_blocks.{i}"
        gemms = Fp8Gemms(fqn, [block.get_submodule(p) for p in LINEARS])
        added += gemms.code_bytes
        st = getattr(block, "_h3plan_vae", None)
        if st is None:
            block._h3plan_vae = VaeBlockState(frozenset(), {}, fp8=gemms)
            block.forward = types.MethodType(plan_vae_block_forward, block)

            def undo(b=block):
                for attr in ("forward", "_h3plan_vae"):
                    b.__dict__.pop(attr, None)
        else:
            st.fp8 = gemms

            def undo(st=st):
                st.fp8 = None
        state.undo.append(undo)
        _swap(state.report, lever, f"{fqn} linears ({len(LINEARS)})", "float16 GEMMs (FP16 autocast)",
              "FP8 e4m3 GEMMs: per-channel weight scales, per-row activation scales, float16 out (lossy)")
    state.report.notes.append(
        f"vae_tiles.fp8: {len(blocks)} blocks x {len(LINEARS)} decoder-block linears run as FP8 GEMMs under FP16 "
        f"autocast (torch._scaled_mm on CUDA SM89+, an fp32 emulation elsewhere, counted); their e4m3 codes add "
        f"{added / 2**30:.3f} GiB on the device beside the unchanged parameters; uninstall drops them")


def apply(model, builder, state, group=None) -> None:
    """Swap what the builder's VAE options ask for; every swap is undoable through state.undo. `group`: the
    process group vae_parallel spreads the decode over (None: the default group)."""
    opts = builder.options("vae")
    if opts["ops"]:
        _install_ops(model, builder, state)
    if opts["tile"] is not None:
        _install_tiles(model, builder, state)
    if opts["tile_dtype"] == "fp8":
        _install_fp8(model, builder, state)
    if opts["graphs"]:
        _install_graphs(model, builder, state)
    if opts["parallel"]:
        from . import vae_parallel

        vae_parallel.apply(model, group, state)
    if "vae_tiles" in builder.settings and opts["tile"] is None and tuple(getattr(model, a) for a in TILING) != RELEASED:
        state.report.notes.append(f"vae_tiles=default leaves the model's tiling as set ({_geometry(model)}), not "
                                  "diffusers' released 256x256 px, overlap 64x64")


def skips(plan, builder, report) -> None:
    """Report every plan lever that installed nothing here, with its reason (never silently)."""
    vae_levers = set(VAE_LEVERS) | {builder.lever_of(k) for k in builder.recorded("vae")}
    other = [d.lever for d in plan.decisions if d.lever not in vae_levers]
    if other:
        report.skipped.append((", ".join(other), "transformer levers apply to MiniMaxH3Transformer3DModel, not to "
                                                 "the VAE (install the plan into the transformer too)"))
    report.skipped.extend((lv, r) for lv, r in builder.skipped if lv in vae_levers)
    touched = {builder.lever_of(k) for k in builder.recorded("vae")}
    skipped = {lv for lv, _ in builder.skipped}
    for d in plan.decisions:
        if d.lever not in vae_levers:
            continue
        if d.lever not in touched and d.lever not in skipped:
            if d.enabled:
                report.notes.append(f"{d.lever}={d.setting} is enabled but its install recorded no option")
            else:
                report.skipped.append((d.lever, f"setting {d.setting!r}: nothing to install"))
        if not d.hardware_verified and d.enabled:
            report.notes.append(f"{d.lever}={d.setting} has never run on hardware of the planned kind")
    if not any(d.lever in vae_levers for d in plan.decisions):
        report.notes.append("the plan has no VAE levers: nothing installed into the VAE")
