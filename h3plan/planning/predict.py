"""The plan's time prediction: one transformer forward, and diffusers' whole pipe(...) call (text encode, denoise,
decode), with the biggest share of the call and the cheapest lever that would cut it. Torch-free.

forward = layers x (attention + block linears + elementwise + all-to-all) per block (derive.estimates gives the
first two and the all-to-all; the elementwise term is `measured.elementwise` at the recipe's default levers scaled
by rows, else the block's elementwise bytes at `measured.hbm_copy_tbps`, a floor). Outside the blocks (token
refiner, patch embedding, the tabled AdaLN) the profiled H200 forward spends under 0.2%
(block-profile-forward-h200.json):
not counted. call = text encode + forwards x forward + decode, where decode is `measured.decode` at the plan's
vae_precision and vae_tiles, scaled by latent volume (frames x height x width); an fl2va / ref2va call adds the video
VAE encode of its keyframes / references (`measured.encode` at the plan's vae_encode_precision, scaled by pixel volume;
the packaged sm90 points are estimates and the line says so; a t2va call has no encode term); the text encoder is
outside the call (prompt_embeds given: h3plan/planning/memory.py). Where a term has no measurement the prediction says
so and leaves it out (None), never a guess. Checked against the committed H200 pipe(...) rows by
tests/planner/test_predict.py.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from h3plan.facts.attention import FP8
from h3plan.facts.vae import decode as vae_decode, encode as vae_encode
from h3plan.levers import TERM_OWNERS, terms
from h3plan.planning import derive

DECODE_TILES = TERM_OWNERS["vae_tile"]  # vae_tiles: its setting names the geometry of the measured decode points
DECODE_PRECISION = TERM_OWNERS["vae_cast"]  # vae_precision: hardware.measured.<it> prices fp16 frames
ENCODE_PRECISION = TERM_OWNERS["vae_encode_cast"]  # vae_encode_precision: the cheapest cut of the encode sets it


def elementwise_bytes_per_row(dc: Mapping[str, Any]) -> int:
    """Bytes one row moves through a lossless block's fused elementwise kernels (bf16: 2 bytes an element): two
    RMSNorm+modulations (read, write hidden), QK-norm+RoPE (read, write q and k), two gated residuals (read h and
    the branch, write h), SwiGLU (read 2F, write F)."""
    h, inner, f = dc["hidden_size"], dc["num_attention_heads"] * dc["attention_head_dim"], dc["ffn_dim"]
    return 2 * (2 * 2 * h + 2 * 2 * inner + 2 * 3 * h + 3 * f)


def elementwise(sections: Mapping[str, Any], rows: int) -> tuple[float | None, str]:
    """(ms per block, basis) of the block's elementwise kernels at `rows` rows per GPU."""
    hw, recipe = sections["hardware"], sections["recipe"]["name"]
    m = hw["measured"]
    points = [p for p in m.get("elementwise") or () if p["recipe"] == recipe]
    pair = derive.bracket(points, rows, lambda p: p["rows"])
    if pair is not None:  # between two measured row counts: linear in rows (a fixed cost per block stays fixed)
        a, b = pair
        ma, mb = sum(a["ms"]) / a["layers"], sum(b["ms"]) / b["layers"]
        v = ma + (mb - ma) * (rows - a["rows"]) / (b["rows"] - a["rows"])
        return v, (f"recipe {recipe}'s elementwise kernels {v:.3f} ms per block on {hw['name']}: linear in rows "
                   f"between {ma:.3f} ms at {a['rows']:,} and {mb:.3f} ms at {b['rows']:,} rows "
                   f"({derive.provenance(a)}; {derive.provenance(b)})")
    if points:
        p = min(points, key=lambda p: (abs(math.log(p["rows"] / rows)), p["rows"]))
        per_block = sum(p["ms"]) / p["layers"]
        return per_block * rows / p["rows"], (
            f"recipe {recipe}'s elementwise kernels measured {per_block:.3f} ms per block on {hw['name']} at "
            f"{p['rows']:,} rows ({' + '.join(f'{x:g}' for x in p['ms'])} ms over {p['layers']} block(s)), x "
            f"{rows:,}/{p['rows']:,} rows ({derive.provenance(p)})")
    bw = m.get("hbm_copy_tbps")
    if bw:
        nbytes = elementwise_bytes_per_row(sections["model"]["diffusers_config"]) * rows
        return nbytes / (bw * 1e12) * 1e3, (f"{nbytes / 1e9:.2f} GB of elementwise traffic per block at the measured "
                                            f"copy bandwidth {bw:g} TB/s (a floor: recipe {recipe}'s kernels never "
                                            f"timed on {hw['name']})")
    return None, f"no copy bandwidth measured on {hw['name']}: elementwise work not counted"


def forward(sections: Mapping[str, Any], shp: Mapping[str, Any], est: Mapping[str, Any]) -> dict[str, Any]:
    """The forward's parts per block (ms) and its total (s); None where attention or GEMMs have no rate."""
    layers = sections["model"]["diffusers_config"]["num_layers"]
    el, el_basis = elementwise(sections, shp["batch"] * shp["local_rows"])
    att, gemm, a2a = est["attention_ms_per_block_est"], est["gemm_ms_per_block_est"], est["a2a_ms_per_block_est"]
    block = None if att is None or gemm is None else att + gemm + (el or 0) + (a2a or 0)
    sparse = {}
    if block is not None and est.get("attention_ms_per_block_sparse_est") is not None:
        fs = (block - att + est["attention_ms_per_block_sparse_est"]) * layers / 1e3
        sparse = {"forward_sparse_s_est": round(fs, 4)}
    return {**sparse, "elementwise_ms_per_block_est": None if el is None else round(el, 3),
            "block_ms_est": None if block is None else round(block, 3),
            "forward_s_est": None if block is None else round(block * layers / 1e3, 4),
            "basis": {"elementwise_ms_per_block_est": el_basis,
                      **({"forward_sparse_s_est": "forward_s_est with attention_ms_per_block_sparse_est in place of "
                                                  "attention_ms_per_block_est (a forward that runs sparse attention)"}
                         if sparse else {}),
                      "forward_s_est": f"{layers} blocks x (attention + block linears + elementwise + all-to-all) per "
                                       f"block; outside the blocks under 0.2% of the profiled H200 forward, "
                                       f"not counted"}}


def decode(sections: Mapping[str, Any], sequence: Mapping[str, Any], precision: str, tiles: str,
           parallel: Mapping[str, Any] | None = None) -> tuple[float | None, str]:
    """(seconds, basis) of the call after its last forward at this decode precision and tile geometry, on one GPU
    (h3plan/facts/vae/decode.py); `parallel`: the vae_parallel decision's params at degree > 1, whose `decode_s` (the
    figure its reason states, from the same one-GPU decode) stands in for it."""
    hw = sections["hardware"]
    latent = ((int(sequence["latent_frames"]), int(sequence["latent_height"]), int(sequence["latent_width"]))
              if sequence.get("latent_frames") else None)
    p = None if latent is None else vae_decode.nearest(hw["measured"].get("decode"), precision, tiles, latent)
    if p is None or latent is None:
        return None, f"no decode measured on {hw['name']} at vae_precision={precision}, vae_tiles={tiles}"
    s = vae_decode.seconds(p, latent)
    basis = (f"the call after its last forward measured {p['seconds']:g} s on {hw['name']} at latent {p['latent']} "
             f"(vae_precision={precision}, vae_tiles={tiles}), scaled by latent frames x height x width "
             f"({p['source']})")
    if parallel and parallel.get("decode_s") is not None:
        return parallel["decode_s"], (f"vae_parallel=tiles: {parallel['one_gpu_s']:g} s on one GPU spread over the "
                                      f"ranks -> {parallel['decode_s']:g} s (the vae_parallel reason's figure); one "
                                      f"GPU: {basis}")
    return s, basis


def encode(sections: Mapping[str, Any], sequence: Mapping[str, Any], precision: str,
           tiles: str = "default") -> tuple[float | None, str] | None:
    """(seconds, basis) of the call's video VAE encodes at this encode precision and geometry; None: the request
    encodes nothing."""
    inputs = vae_encode.encode_inputs(sequence)
    if not inputs:
        return None
    hw = sections["hardware"]
    return vae_encode.seconds(hw["measured"].get("encode") or (), inputs, precision, hw["name"], tiles)


def encode_tiles(settings: Mapping[str, str]) -> str:
    """The geometry the plan's encode runs at, named as the measured points name it (the decode's tile setting): the
    decode's where the encode shares it (Terms.vae_encode_shares_tile), else the VAE's own (default)."""
    return settings.get(DECODE_TILES, "default") if terms(settings).vae_encode_shares_tile else "default"


def call(sections: Mapping[str, Any], sequence: Mapping[str, Any], shp: Mapping[str, Any], fwd: Mapping[str, Any],
         settings: Mapping[str, str], computed: int | None = None, dense: int | None = None,
         parallel_decode: Mapping[str, Any] | None = None,
         text_encoder: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """End to end: text encode + forwards x forward + decode; the biggest share and the cheapest cut. `computed`: the
    forwards a step_cache schedule runs of the request's (None: all of them); `dense`: with sparse attention, the
    first forwards that run dense (the others at forward_sparse_s_est); `parallel_decode`: the vae_parallel decision's
    params where it spreads the decode (decode); `text_encoder`: the memory.text_encoder placement (planning/memory),
    whose call_s (the encode and its moves) the call counts; none: prompt_embeds given."""
    n, f = sequence.get("transformer_forwards"), fwd["forward_s_est"]
    if not n or f is None:
        return {}
    of = f"{computed} computed of {n}" if computed and computed != n else f"{n}"
    n = computed or n
    fs = fwd.get("forward_sparse_s_est")
    if fs is not None and dense is not None and n > dense:  # the dense ones first, the rest at the sparse forward
        f = (dense * f + (n - dense) * fs) / n
        of += f" ({min(dense, n)} dense, {n - min(dense, n)} with sparse attention)"
    t = terms(settings)  # the decode and encode dtypes: a float32 VAE's where the plan casts none
    dec, dec_basis = decode(sections, sequence, t.vae_cast or "fp32", settings[DECODE_TILES], parallel_decode)
    enc = encode(sections, sequence, t.vae_encode_cast or "fp32", encode_tiles(settings))
    te, te_basis = text_encode(text_encoder)
    parts = {"text_encode": te, "denoise": n * f, "decode": dec}
    total = (None if dec is None or (enc is not None and enc[0] is None)
             else te + n * f + dec + (enc[0] if enc else 0.0))
    out = {"denoise_s_est": round(n * f, 2), "decode_s_est": None if dec is None else round(dec, 2),
           "text_encode_s_est": round(te, 2),
           "call_s_est": None if total is None else round(total, 2),
           "basis": {"denoise_s_est": f"{of} transformer forwards x forward_s_est", "decode_s_est": dec_basis,
                     "text_encode_s_est": te_basis,
                     "call_s_est": "text encode + denoise + decode (diffusers' pipe(...), one GPU per rank)"}}
    if enc is not None:  # fl2va / ref2va: the keyframes' / references' VAE encode (a t2va plan has no such key)
        parts["encode"] = enc[0]
        out["encode_s_est"] = None if enc[0] is None else round(enc[0], 2)
        out["basis"]["encode_s_est"] = enc[1]
        out["basis"]["call_s_est"] = ("text encode + VAE encode + denoise + decode (diffusers' pipe(...), "
                                      "one GPU per rank)")
    if total is None:
        return out
    big = max(parts, key=lambda k: parts[k] or 0)
    out["call_biggest"] = {"part": big, "share": round(parts[big] / total, 3),
                           "cut": cheapest_cut(sections, sequence, shp, big, settings, fwd, parallel_decode)}
    out["basis"]["call_biggest"] = ("the largest of text encode, denoise, decode, and the lever that cuts it at the "
                                    "least quality cost")
    return out


def text_encode(placement: Mapping[str, Any] | None) -> tuple[float, str]:
    """(seconds, basis) of the call's text encode: the placement's call_s (the encode and the conditioner's moves);
    0 where prompt_embeds are given, or where the placement has no time (nan: no BF16 rate to time it)."""
    if not placement:
        return 0.0, "0: prompt_embeds given, the text encoder runs before the call (memory: not resident)"
    s = placement.get("call_s")
    if s is None or s != s:
        return 0.0, f"0: memory.text_encoder={placement['setting']} has no time on this hardware (no BF16 rate)"
    return float(s), (f"memory.text_encoder={placement['setting']}: the conditioner's encode and its moves "
                      f"(text_encoder.call_s)")


def call_range(sections: Mapping[str, Any], sequence: Mapping[str, Any], times: Mapping[str, Any],
               fwd: Mapping[str, Any], skipped: Sequence[int], dense: int | None = None) -> dict[str, Any]:
    """An adaptive cache's call (step_cache=first_block) as a range: from its schedule that skips the most (`skipped`:
    those forwards' indices; each skipped forward still runs the first block, 1/layers of a forward) up to every
    forward computed (call_s_est, the figure the call line gives); how many skip is the checkpoint's. `dense`: with
    sparse attention, the first forwards that run dense (a skipped one saves a dense forward, a later one a sparse)."""
    call, f, n = times.get("call_s_est"), fwd["forward_s_est"], sequence.get("transformer_forwards")
    if call is None or f is None or not n:
        return {}
    layers = sections["model"]["diffusers_config"]["num_layers"]
    fs = fwd.get("forward_sparse_s_est")
    cost = [f if fs is None or dense is None or i < dense else fs for i in range(n)]
    low = call - sum(cost[i] for i in skipped) * (1 - 1 / layers)
    return {"call_s_range_est": [round(low, 2), round(call, 2)],
            "basis": {"call_s_range_est": f"step_cache=first_block computes {n - len(skipped)}..{n} forwards (the most "
                                          f"it can skip under its warm-up, final and limit in a row .. none): each "
                                          f"skipped forward runs 1 of {layers} blocks"
                                          + (f", the first {dense} dense, the rest with sparse attention"
                                             if fs is not None and dense is not None else "")
                                          + "; how many skip is the checkpoint's statistic"}}


def cheapest_cut(sections, sequence, shp, part: str, settings: Mapping[str, str], fwd: Mapping[str, Any],
                 parallel_decode: Mapping[str, Any] | None = None) -> str:
    """The cheapest lever (least quality cost) that cuts `part`, with its predicted time and that cost (a decode
    spread over the ranks: spread the same way)."""
    hw, t = sections["hardware"], terms(settings)
    if part == "decode" and t.vae_cast is None:  # a float32 decode
        s, _ = decode(sections, sequence, "fp16", "default")
        if s is not None and parallel_decode and parallel_decode.get("decode_s") is not None:
            s *= parallel_decode["decode_s"] / parallel_decode["one_gpu_s"]
        q = [p for p in hw["measured"].get(DECODE_PRECISION) or () if p["precision"] == "fp16"]
        cost = (f"PSNR {q[0]['psnr_db']:.1f} dB against the fp32 frames (measured on {hw['name']})" if q
                else f"fp16 frames never compared with fp32 on {hw['name']}")
        if s is not None:
            return f"recipe.vae=fp16 cuts the decode to {s:.1f} s, at {cost}"
    if part == "encode":
        fast = encode(sections, sequence, "fp16", encode_tiles(settings)) if t.vae_encode_cast is None else None
        if fast is not None and fast[0] is not None:
            return (f"levers.{ENCODE_PRECISION}=fp16 (a recipe that allows a lossy VAE) cuts the encode to "
                    f"{fast[0]:.1f} s, outside every measured budget (its effect on the frames never measured)")
        return "no lever cuts it further on this plan"
    if part == "decode":
        return ("no lever cuts it further on this plan (the decode already runs its fastest measured precision "
                "and tiles)")
    if part == "denoise" and t.gemm_dtype is None and hw["gemm"]["fp8"]:  # BF16 GEMMs
        f8 = fp8_forward(sections, shp)
        if f8 is not None:
            return (f"recipe=fp8 cuts a forward to {f8:.2f} s (FP8 GEMMs and attention: lossy, within its PSNR/SSIM "
                    f"budget)")
    steps = sequence.get("num_inference_steps")  # video.num_inference_steps sets the request's, over pipeline's default
    return (f"fewer forwards (video.num_inference_steps, {steps} now; a step-distilled LoRA): the {part} shrinks with "
            "them, at a quality cost h3plan does not measure")


def fp8_forward(sections: Mapping[str, Any], shp: Mapping[str, Any]) -> float | None:
    """The same forward with the fp8 recipe's block (FP8 GEMMs, cuDNN FP8 attention, its elementwise kernels), from
    this hardware's measurements only (None where one is missing)."""
    hw = sections["hardware"]
    rows, heads = shp["batch"] * shp["local_rows"], shp["heads_per_rank"]
    att, _ = derive._throughput(hw, "attention", "fp8", (shp["seq_len"], heads), FP8)
    gemm, _ = derive._throughput(hw, "gemm", "fp8", rows=rows,
                                 params=derive.block_linear_params(sections["model"]["diffusers_config"]))
    el, _ = elementwise({**sections, "recipe": {**sections["recipe"], "name": "fp8"}}, rows)
    if None in (att, gemm, el) or not hw["measured"].get("on_hardware"):
        return None
    dc = sections["model"]["diffusers_config"]
    block = (4 * shp["batch"] * shp["seq_len"] ** 2 * heads * dc["attention_head_dim"] / (att * 1e12)
             + 2 * rows * derive.block_linear_params(dc) / (gemm * 1e12)) * 1e3 + el
    return block * dc["num_layers"] / 1e3
