"""Install a Plan's VAE levers into diffusers' AutoencoderKLMiniMaxH3 (the installer dispatches here).

- `vae_precision` (builder option `precision`): fp16 / bf16 cast the VAE as `from_pretrained(torch_dtype=)`
  does (weights.py; `_keep_in_fp32_modules` stay float32), originals in pinned host memory for uninstall
  only. diffusers' decode step (`vae.decode` casts the latents to post_quant_conv's dtype) then runs the
  planned precision with no autocast. fp32, or a VAE loaded in another dtype, is left as it is (reported).
- the VAE block levers (levers/rules.py `VAE_BLOCK_SITES`; vae_ops' builder option `ops`): every ViT decoder block
  gets the plan forward of block.py (a hook `h3plan.<lever>` of the first, install/hooks.py; every install here is such
  a named hook or a state-dict effect) with the sites `vae_block_sites` composes from their runtime modules
  (runtime/levers/<lever>.py): vae_ops' fused ops whose kernel takes the dtype the decode runs in (the block linears'
  dtype after the cast); the others keep diffusers' expressions, reported at install (never a per-call fallback of a
  planned decode).
- `vae_graphs` (builder option `graphs=True`): `decoder`'s hook runs a GraphedDecoder
  (graph.py) that replays the whole ViT decoder forward from one CUDA graph per input signature,
  with a counted per-call guard that runs diffusers' forward when a graph cannot apply.
- `vae_encode_precision` (builder option `encode_precision`): fp16 / bf16 cast `encoder` and `quant_conv` (the
  encode path, all in `_keep_in_fp32_modules`: no decode lever touches them) the same way, originals on the host for
  uninstall; `encode` casts its input to the encoder's dtype itself. fp32 and off install nothing.
- `vae_encode_tiles` (builder option `encode_tiling`): `own` keeps the encode at the tiles the VAE had before
  install where vae_tiles re-tiles the decode (`_encode` sets them while it runs); `shared` (default) is diffusers'.
- `vae_tiles` (builder option `tile`): the geometry goes through diffusers' own
  `enable_tiling(tile_sample_min_height, tile_sample_min_width, tile_sample_min_overlap_height,
  tile_sample_min_overlap_width)`; diffusers tiles spatially only, so `tile.frames` is reported, not
  applied. `fp8_tiles` (`tile_dtype` fp8) also makes every decoder block's six linears FP8 GEMMs
  (fp8.py: per-channel e4m3 weights quantised once here, per-row e4m3 activations, float16 out;
  lossy) where the decoder computes in float16, with or without vae_ops: a block without vae_ops gets the
  plan forward with no ops, which is diffusers' block op for op apart from those GEMMs. Float64, meta or
  split-device linears are skipped with the reason. `default` leaves the model's tiling as it is.

Transformer levers in the plan are reported skipped (they install into MiniMaxH3Transformer3DModel).
Uninstall (installer.uninstall) removes the hooks and restores the VAE's dtype and bits and the tiling attributes
exactly.
"""

from __future__ import annotations

import functools

import torch

from h3plan.errors import InstallError

from h3plan.install.hooks import attach, effect, foreign, hook
from h3plan.install.placement import slots_of
from . import parallel
from .block import LINEARS, VaeBlockState, plan_vae_block_forward, vae_block_sites
from .fp8 import Fp8Gemms
from .graph import GraphedDecoder
from h3plan.facts.vae.tiling import RELEASED_TILE, tile_rule
from .weights import DTYPES, PrecisionCast, blocker as cast_blocker, castable, encode_blocker, encode_tensors

from h3plan.levers import SPECS, owner

VAE_LEVERS = tuple(name for name, s in SPECS.items() if s.model == "vae")
TILING = ("use_tiling", "tile_sample_min_height", "tile_sample_min_width", "tile_sample_min_overlap_height",
          "tile_sample_min_overlap_width")
RELEASED = (True, RELEASED_TILE["height"], RELEASED_TILE["width"], RELEASED_TILE["overlap"], RELEASED_TILE["overlap"])
GRAPHS = "_h3plan_graphs"  # the decoder's GraphedDecoder while vae_graphs' hook is on
FP8_SOURCES = {torch.float32, torch.bfloat16, torch.float16}  # linears the FP8 codes are quantised from (no float64)


def _classes():
    from diffusers import AutoencoderKLMiniMaxH3
    from diffusers.models import activations
    from diffusers.models.autoencoders import autoencoder_kl_minimax_h3 as am

    return AutoencoderKLMiniMaxH3, am.MiniMaxH3VideoTransformerBlock, am.MiniMaxH3VideoAttention, activations.SwiGLU


def is_vae(model) -> bool:
    return isinstance(model, _classes()[0])


def _hooked(m) -> bool:
    """m carries what a plan did not put there: a user's diffusers hook (install/hooks.py `foreign`), a torch hook,
    accelerate's hook or an instance forward outside a hook registry."""
    return bool(("forward" in m.__dict__ and "_diffusers_hook" not in m.__dict__) or m._forward_hooks
                or m._forward_pre_hooks or foreign(m) or hasattr(m, "_hf_hook"))


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
        problems += [f"{fqn}.{n} is missing" for n in ("scale1", "scale2")
                     if not isinstance(getattr(b, n, None), torch.Tensor)]
        if problems:
            continue
        for path in LINEARS:
            if not isinstance(b.get_submodule(path), torch.nn.Linear):
                problems.append(f"{fqn}.{path} is {type(b.get_submodule(path)).__name__}, not nn.Linear")
        if not isinstance(b.ff.net[0], SwiGLU):
            problems.append(f"{fqn}.ff.net.0 is {type(b.ff.net[0]).__name__}, not SwiGLU")
        if b.attn.norm_q.weight is not None or b.attn.norm_k.weight is not None:
            problems.append(f"{fqn}.attn norm_q/norm_k have an affine weight (diffusers' VAE has none)")
        if "forward" in b.__dict__ and "_diffusers_hook" not in b.__dict__:  # hooks: install/hooks.py judges them
            problems.append(f"{fqn} already has an instance forward (not a diffusers hook); install before replacing "
                            "forwards")
        for path in ("attn", "ff", "ff.net.0", *LINEARS):
            if _hooked(b.get_submodule(path)):
                problems.append(f"{fqn}.{path} carries hooks (offloading, layerwise casting?); install before them")
    if problems:
        raise InstallError("h3plan.install: unexpected AutoencoderKLMiniMaxH3 layout: " + "; ".join(problems[:5]))


def _fp8_blocker(blocks) -> str | None:
    """Why the block linears cannot be quantised to FP8 codes (None: they can)."""
    params = [t for b in blocks for p in LINEARS for t in (b.get_submodule(p).weight, b.get_submodule(p).bias)
              if t is not None]
    dtypes, devices = {t.dtype for t in params}, {t.device for t in params}
    if not dtypes <= FP8_SOURCES:
        return (f"decoder block linears are {sorted(map(str, dtypes))}: the FP8 codes are quantised from float16 "
                "casts of float32/16 weights")
    if len(devices) != 1 or next(iter(devices)).type == "meta":
        return f"decoder block linears on {sorted(map(str, devices))}: FP8 codes need them loaded on one device"
    return None


def _install_precision(model, builder, state) -> None:
    lever = builder.lever_of("precision")
    name = builder.view("vae").precision
    dtype = DTYPES[name]
    report = state.report
    if name == "fp32":
        why = cast_blocker(model, torch.float32)
        if why:
            report.skipped.append((lever, why.replace("its decode stays", "the plan's fp32 decode needs the float32 "
                                                      "checkpoint; its decode stays")))
        else:
            report.skipped.append((lever, "fp32: the VAE decodes in float32 as diffusers loads it (nothing to cast)"))
        return
    why = cast_blocker(model, dtype)
    if why:
        report.skipped.append((lever, why))
        return
    placement = getattr(state, "placement", None)
    cast = PrecisionCast.apply(model, dtype, None if placement is None else _streamer(model, builder, placement))
    effect(model, lever, state, cast.restore)
    if not cast.slots:
        report.skipped.append((lever, f"the VAE is {dtype} already (loaded with torch_dtype): nothing to cast"))
        return
    report.swap(lever, f"vae ({len(cast.slots)} tensors)", "float32",
                f"{str(dtype).replace('torch.', '')} (from_pretrained(torch_dtype)'s cast; _keep_in_fp32_modules "
                "float32)")
    where = "pinned host memory" if cast.pinned else "host memory"
    if placement is not None:
        state.report.placement.setdefault("host", {})[f"{lever}: the float32 originals"] = cast.host_bytes
    report.notes.append(
        f"vae_precision={name}: {len(cast.slots)} VAE tensors are {str(dtype).replace('torch.', '')} while installed "
        f"({cast.device_bytes / 2**30:.3f} GiB on the device, "
        f"{cast.host_bytes / 2**30 - cast.device_bytes / 2**30:.3f} GiB less); their float32 originals "
        f"({cast.host_bytes / 2**30:.3f} GiB) wait in {where} for uninstall only, never read by a call. state_dict(), "
        "parameters(), vae.dtype and save_pretrained see the cast dtype; uninstall restores the originals bit for bit")


def _install_encode_precision(model, builder, state) -> None:
    lever = builder.lever_of("encode_precision")
    name = builder.view("vae").encode_precision
    dtype = DTYPES[name]
    why = encode_blocker(model, dtype)
    if why:
        state.report.skipped.append((lever, why))
        return
    cast = PrecisionCast.apply(model, dtype, tensors=encode_tensors(model))
    effect(model, lever, state, cast.restore)
    if not cast.slots:
        state.report.skipped.append((lever, f"the encoder is {dtype} already: nothing to cast"))
        return
    short = str(dtype).replace("torch.", "")
    state.report.swap(lever, f"encoder, quant_conv ({len(cast.slots)} tensors)", "float32", f"{short} (lossy encode)")
    state.report.notes.append(
        f"vae_encode_precision={name}: the encoder and quant_conv are {short} while installed "
        f"({cast.device_bytes / 2**30:.3f} GiB on the device); their float32 originals wait in "
        f"{'pinned host' if cast.pinned else 'host'} memory for uninstall only; vae.encode casts its input to the "
        "encoder's dtype; the decoder is untouched")


def _install_sites(model, builder, state) -> None:
    """Every ViT decoder block's forward as block.py's plan forward with the sites `vae_block_sites` composes for the
    dtype the decode runs in (the block linears' dtype after the cast), under the first composed lever's hook; nothing
    where the plan sets no VAE block lever's options."""
    from diffusers.models.modeling_utils import get_parameter_dtype

    blocks = model.decoder.transformer_blocks
    dtype = get_parameter_dtype(blocks[0].attn.to_q)
    levers, sites, swaps = vae_block_sites(builder.view("vae"), dtype, state.report.skipped)
    if not levers:
        return
    for i, block in enumerate(blocks):
        fqn = f"decoder.transformer_blocks.{i}"
        attach(block, fqn, levers[0], plan_vae_block_forward, state, attrs={"_h3plan_vae": VaeBlockState(sites)})
        for lever, where, old, new in swaps:
            state.report.swap(lever, fqn + where, old, new)


def _install_graphs(model, builder, state) -> None:
    lever = builder.lever_of("graphs")
    dec = model.decoder
    if _hooked(dec) or any(_hooked(m) for m in dec.modules() if m is not dec):
        state.report.skipped.append((lever, "the ViT decoder or one of its modules carries hooks or an instance "
                                            "forward (offloading?): a CUDA graph would freeze what they do; diffusers' "
                                            "forward kept"))
        return
    gemms = [g for b in dec.transformer_blocks if (g := getattr(getattr(b, "_h3plan_vae", None), "fp8", None))]
    gd = GraphedDecoder(dec, dec.forward, validate=(lambda: [g.verify() for g in gemms]) if gemms else None)
    effect(dec, lever, state, gd.release, part="graphs", fqn="decoder")  # the graphs' memory, after the hook is off
    attach(dec, "decoder", lever, lambda previous, *args, **kwargs: gd(*args, **kwargs), state, replaces=False,
           attrs={GRAPHS: gd})
    state.report.swap(lever, "decoder.forward", type(dec).__name__ + ".forward",
                      "CUDA graph replay, one graph per input signature (diffusers' forward when a guard refuses)")


def graphs_of(vae) -> GraphedDecoder | None:
    """The GraphedDecoder that vae_graphs' hook runs on `vae.decoder` (its graphs, `captures`, `validate`), read from
    the hook `h3plan.vae_graphs` itself; None where that hook is not on."""
    found = hook(vae.decoder, owner("graphs"))
    return None if found is None else found.attrs[GRAPHS]


def _geometry(model) -> str:
    return _geometry_of(tuple(getattr(model, a) for a in TILING))


def _geometry_of(values) -> str:
    """A TILING tuple as the report writes it."""
    use, h, w, oh, ow = values
    return f"{h}x{w} px, overlap {oh}x{ow}" if use else "tiling off"


def _check_tile(model, tile: dict) -> tuple[int, int, int]:
    r = model.spatial_compression_ratio
    h, w, o = (tile.get(k) for k in ("height", "width", "overlap"))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (h, w, o)):
        raise InstallError(f"vae_tiles: tile height/width/overlap must be ints, got {tile}")
    if tile_rule(h, w, o, r):
        raise InstallError(f"vae_tiles: tile {h}x{w}, overlap {o} must be multiples of the VAE's spatial compression "
                         f"{r} with {r} <= overlap < min(height, width) (diffusers' _split_tiles needs it)")
    return h, w, o


def _install_tiles(model, builder, state) -> None:
    lever = builder.lever_of("tile")
    tile = builder.view("vae").tile
    h, w, o = _check_tile(model, tile)
    before, old = {a: getattr(model, a) for a in TILING}, _geometry(model)
    model.enable_tiling(tile_sample_min_height=h, tile_sample_min_width=w, tile_sample_min_overlap_height=o,
                        tile_sample_min_overlap_width=o)
    effect(model, lever, state, lambda: [setattr(model, a, v) for a, v in before.items()])
    got = tuple(getattr(model, a) for a in TILING)
    if got != (True, h, w, o, o):
        raise ValueError(f"vae_tiles: enable_tiling left {dict(zip(TILING, got))}, asked for {h}x{w} overlap {o}")
    state.report.swap(lever, "tiling", old, _geometry(model))
    if tile.get("frames") is not None:
        state.report.notes.append(f"vae_tiles: tile.frames={tile['frames']} not applied: diffusers tiles spatially "
                                  "only (temporal chunks follow clip_length)")


def _install_fp8(model, builder, state) -> None:
    lever = builder.lever_of("tile_dtype")
    blocks = model.decoder.transformer_blocks
    blocker = _fp8_blocker(blocks)
    if blocker:
        state.report.skipped.append((f"{lever}.fp8_gemm", blocker))
        return
    added = 0
    for i, block in enumerate(blocks):
        fqn = f"decoder.transformer_blocks.{i}"
        gemms = Fp8Gemms(fqn, [block.get_submodule(p) for p in LINEARS])
        added += gemms.code_bytes
        st = getattr(block, "_h3plan_vae", None)
        if st is None:  # no site lever's hook: the plan forward with diffusers' ops, for the GEMMs (dropped with it)
            attach(block, fqn, lever, plan_vae_block_forward, state, attrs={"_h3plan_vae": VaeBlockState(fp8=gemms)})
        else:  # a site lever's hook: its state takes the GEMMs and drops them with it
            st.fp8 = gemms
        state.report.swap(lever, f"{fqn} linears ({len(LINEARS)})", "float16 GEMMs",
                          "FP8 e4m3 GEMMs: per-channel weight scales, per-row activation scales, float16 out (lossy)")
    state.report.notes.append(
        f"vae_tiles.fp8: {len(blocks)} blocks x {len(LINEARS)} decoder-block linears run as FP8 GEMMs where the "
        "decoder computes in float16 (torch._scaled_mm on CUDA SM89+, an fp32 emulation elsewhere, counted); their "
        f"e4m3 codes add {added / 2**30:.3f} GiB on the device beside the unchanged parameters; uninstall drops them")


def _streamer(model, builder, placement):
    """install(..., device=): t -> t on the device, moved just before its cast (one float32 tensor staged at a time)."""
    where = {id(t): w for t, w in slots_of(model, cast_tensors(model, builder))}

    def move(t):
        placement.move_tensor(t, where[id(t)])
        return placement.current(t)

    return move


def cast_tensors(model, builder) -> list:
    """The tensors vae_precision casts at install (install(..., device=) streams them, never moving one whole)."""
    name = builder.view("vae").precision if "precision" in builder.recorded("vae") else None
    if name in (None, "fp32") or cast_blocker(model, DTYPES[name]):
        return []
    return [t for _, t in castable(model) if t.dtype != DTYPES[name]]


def apply(model, builder, state, group=None) -> None:
    """Swap what the builder's VAE options ask for; every swap is a hook recorded on `state.hooks` (install/hooks.py).
    `group`: the process group vae_parallel spreads the decode over (None: the default group)."""
    opts = builder.view("vae")
    tiling = tuple(getattr(model, a) for a in TILING)
    if "precision" in builder.recorded("vae"):
        _install_precision(model, builder, state)
    if "encode_precision" in builder.recorded("vae"):
        _install_encode_precision(model, builder, state)
    _install_sites(model, builder, state)
    if opts.tile is not None:
        _install_tiles(model, builder, state)
    if opts.encode_tiling == "own":
        _install_encode_tiles(model, builder, state, tiling)
    if opts.tile_dtype == "fp8":
        _install_fp8(model, builder, state)
    if opts.graphs:
        _install_graphs(model, builder, state)
    if opts.parallel:
        parallel.apply(model, group, state)
    _encode_note(model, tiling, state)
    tiles = owner("tile")  # the lever of the decode's tile geometry
    if tiles in builder.settings and opts.tile is None and tuple(getattr(model, a) for a in TILING) != RELEASED:
        state.report.notes.append(f"{tiles}=default leaves the model's tiling as set ({_geometry(model)}), not "
                                  "diffusers' released 256x256 px, overlap 64x64")


def _install_encode_tiles(model, builder, state, before: tuple) -> None:
    """vae_encode_tiles=default: `_encode` lays the tiles the VAE had before install while it runs (diffusers' encode
    and decode share the tile attributes, and vae_tiles set the decode's); nothing to do where they are unchanged."""
    lever = builder.lever_of("encode_tiling")
    now = tuple(getattr(model, a) for a in TILING)
    if now == before:
        state.report.skipped.append((lever, f"the encode tiles at the VAE's own geometry already ({_geometry(model)}): "
                                            "nothing to lay"))
        return
    if "_encode" in model.__dict__:
        raise InstallError("vae_encode_tiles: AutoencoderKLMiniMaxH3._encode already has an instance override (a "
                           "hook?); install before it")
    original = model._encode

    def _encode(x):
        during = tuple(getattr(model, a) for a in TILING)
        for a, v in zip(TILING, before):
            setattr(model, a, v)
        try:
            return original(x)
        finally:
            for a, v in zip(TILING, during):
                setattr(model, a, v)

    _encode.h3plan_encode_tiles = before  # type: ignore[attr-defined]
    effect(model, lever, state, functools.partial(model.__dict__.pop, "_encode", None),
           apply=functools.partial(setattr, model, "_encode", _encode))
    state.report.swap(lever, "_encode tiling", _geometry_of(now) + " (vae_tiles' decode geometry)",
                      _geometry_of(before) + " (the VAE's own, while the encode runs)")


def _encode_note(model, tiling_before, state) -> None:
    """What the plan does to `vae.encode` (fl2va keyframes, ref2va references): its precision is vae_encode_precision's
    (the decode's cast leaves the encoder float32 under `_keep_in_fp32_modules`, as from_pretrained(torch_dtype) does);
    its tiles are vae_encode_tiles' (diffusers keeps one set of tile attributes for encode and decode)."""
    enc = getattr(model, "encoder", None)
    if not isinstance(enc, torch.nn.Module):
        return
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in enc.parameters()})
    own = getattr(model.__dict__.get("_encode"), "h3plan_encode_tiles", None)
    tiled = tuple(getattr(model, a) for a in TILING) != tiling_before
    if own is not None:
        tiles = (f"its own tiles ({_geometry_of(own)}, vae_encode_tiles=default; the decode's are "
                 f"{_geometry(model)}): its bits kept")
    elif tiled:
        tiles = (f"the decode's tiles ({_geometry(model)}; diffusers tiles encode and decode alike): the encode's "
                 "latents change with them")
    else:
        tiles = f"the model's tiling ({_geometry(model)}): the encode keeps its bits"
    state.report.notes.append(f"encode (keyframes, references): diffusers' encoder in {'/'.join(dtypes)} "
                              f"(vae_encode_precision; the decode's cast leaves it) and {tiles}")


def skips(plan, builder, report, stepped=frozenset()) -> None:
    """Report every plan lever that installed nothing here, with its reason (never silently); `stepped`: the levers
    whose own install step ran on the VAE (install/site.py)."""
    vae_levers = set(VAE_LEVERS) | {builder.lever_of(k) for k in builder.recorded("vae")} | set(stepped)
    other = [d.lever for d in plan.decisions if d.lever not in vae_levers]
    if other:
        report.skipped.append((", ".join(other), "transformer levers apply to MiniMaxH3Transformer3DModel, not to "
                                                 "the VAE (install the plan into the transformer too)"))
    report.skipped.extend((lv, r) for lv, r in builder.skipped if lv in vae_levers)
    touched = {builder.lever_of(k) for k in builder.recorded("vae")} | set(stepped)
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
