"""H200 suite for h3plan plans in diffusers' AutoencoderKLMiniMaxH3 at the released config (36 decoder
blocks, 32 x 64 heads, dim 2048), seeded fp32 weights (benchmarks/vae.py build_vae), decoded as diffusers'
pipeline decodes (`vae.decode(z)` in no_grad, no autocast) and as a user with an autocast of their own would.
Each test prints one line.

    . /tmp/h3site/env.sh && python -m pytest tests/gpu/test_install_vae_gpu.py -m gpu -q -rA -s

Contracts (rtol=0, atol=0, against unmodified CUDA eager in the same dtype; no emulation anywhere):
- every route a user takes (the VAE as loaded: float32, float16, bfloat16; with or without FP16 / BF16 autocast)
  decodes latent [1, 24, 4, 48, 84] with the installed plan bit for bit like the same call without it, and no
  slower than it (at most 1.02x: a fallback is never slower than no plan), with no per-call fallback counted;
- the plan's fp16 decode (vae_precision=fp16 into the float32 VAE) is bit for bit the VAE loaded in float16,
  at below the float32 VAE's peak memory, and uninstall returns the float32 parameters and eager's bits;
- vae_graphs=on replays every decoder call from a CUDA graph bit for bit, at most 10% above eager's peak;
- the fp8 recipe's decode (288x272 / overlap 32 tiles, FP8 decoder GEMMs) runs the FP8 GEMMs on every linear
  and stays inside the recipe's PSNR budget against eager fp16 at the same tiles.
- the encode levers: an fl2va plan's default encode is diffusers' bit for bit (also under the fp8 recipe's re-tiled
  decode: vae_encode_tiles=default), a forced fp16 / bf16 encode stays within ENCODE_REL (never run when written).
Times: CUDA events, medians of interleaved timed decodes after one warm-up each.
"""

import statistics

import pytest
import torch

import h3plan
from h3plan.install import counters, fallback_reasons, install, reset_counters, uninstall
from h3plan.install.vae.install import graphs_of
from scripts import load_script

pytestmark = pytest.mark.gpu

LATENT = (1, 24, 4, 48, 84)
SLOWER = 1.02  # a plan's decode may be at most this much slower than the same call without it (noise included)
DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/vae.py")


@pytest.fixture(scope="module")
def z():
    return torch.randn(LATENT, generator=torch.Generator().manual_seed(1)).cuda()


def _vae(bench, load="fp32"):
    from h3plan.actions.pipeline_build import cast_like_from_pretrained

    model = bench.build_vae(bench.vae_config("h3"), device="cuda", seed=0)
    return cast_like_from_pretrained(model, DT[load]) if load != "fp32" else model


def _decode(vae, z, autocast):
    with torch.no_grad(), torch.autocast("cuda", dtype=DT.get(autocast, torch.float16), enabled=autocast is not None):
        return vae.decode(z).sample


def _time(fn, n=3):
    ts, out = [], None
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        out = fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts), out


@pytest.mark.parametrize("load,recipe_vae,autocast", [
    ("fp32", None, None),          # diffusers' default: the plan's fp32 decode
    ("fp32", None, "fp16"),        # a user's own FP16 autocast over the float32 VAE
    ("fp32", None, "bf16"),
    ("fp16", "fp16", None),        # the VAE loaded in float16
    ("bf16", "fp16", None),        # loaded in bfloat16: the plan keeps it (no double rounding)
    ("fp16", "fp16", "fp16"),
])
def test_every_route_is_bitwise_and_no_slower_than_no_plan(bench, z, load, recipe_vae, autocast):
    vae = _vae(bench, load)
    over = {"recipe.vae": recipe_vae} if recipe_vae else {}
    plan = h3plan.resolve_config(hardware="sm90", recipe="bf16", **over)
    try:
        _decode(vae, z, autocast)  # warm-up
        eager = [_time(lambda: _decode(vae, z, autocast), 1)]
        ref = eager[0][1]
        report = install(vae, plan)
        _decode(vae, z, autocast)  # warm-up (captures the graphs)
        reset_counters()
        planned = [_time(lambda: _decode(vae, z, autocast), 1)]
        c, why = counters(), fallback_reasons()
        out = planned[0][1]
        uninstall(vae)
        for _ in range(2):  # interleaved: eager, plan, eager, plan
            eager.append(_time(lambda: _decode(vae, z, autocast), 1))
            install(vae, plan)
            _decode(vae, z, autocast)  # a fresh install captures its graphs again: not part of a serving call
            planned.append(_time(lambda: _decode(vae, z, autocast), 1))
            uninstall(vae)
    finally:
        uninstall(vae)
    e, p = statistics.median(t for t, _ in eager), statistics.median(t for t, _ in planned)
    same = torch.equal(out, ref)
    fb = {k: v for k, v in c.items() if k.endswith(".fallback") and k != "vae_graphs.fallback"}
    print(f"\n[gpu] vae route load={load} plan vae={recipe_vae or 'fp32'} autocast={autocast}: eager {e:.0f} ms, plan "
          f"{p:.0f} ms ({e / p:.3f}x); bitwise {same}; counters {c}; skipped "
          f"{[s for s in report.skipped if s[0].startswith('vae')]}")
    assert same, f"max abs diff {(out.float() - ref.float()).abs().max().item()}"
    assert p <= SLOWER * e, (p, e)
    assert not fb, (fb, why)
    assert c.get("vae_graphs.fused", 0) > 0, c  # the graphs replayed
    assert vae.dtype == DT[load]


def test_the_plans_fp16_decode_is_the_fp16_loaded_vae_bit_for_bit_at_less_memory(bench, z):
    vae, ref_vae = _vae(bench), _vae(bench, "fp16")
    plan = h3plan.resolve_config(hardware="sm90", recipe="bf16", **{"recipe.vae": "fp16"})
    fp32_ms, ref32 = _time(lambda: _decode(vae, z, None), 2)
    ref_ms, ref = _time(lambda: _decode(ref_vae, z, None), 2)
    del ref_vae
    torch.cuda.empty_cache()
    before = {k: v.clone() for k, v in vae.state_dict().items()}
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    report = install(vae, plan)
    try:
        assert vae.dtype == torch.float16 and report.swapped_levers()[0] == "vae_precision"
        plan_ms, out = _time(lambda: _decode(vae, z, None), 3)
        peak = torch.cuda.max_memory_allocated()
    finally:
        uninstall(vae)
    assert all(torch.equal(vae.state_dict()[k], v) and vae.state_dict()[k].dtype == v.dtype for k, v in before.items())
    same = torch.equal(out, ref)
    from h3plan.actions.quality import compare

    q = compare(((out.float() + 1) / 2).clamp(0, 1), ((ref32.float() + 1) / 2).clamp(0, 1))
    print(f"\n[gpu] vae fp16 plan: fp32 eager {fp32_ms:.0f} ms, fp16 eager {ref_ms:.0f} ms, plan {plan_ms:.0f} ms "
          f"({fp32_ms / plan_ms:.2f}x fp32, {ref_ms / plan_ms:.2f}x fp16); bitwise vs fp16-loaded {same}; vs the fp32 "
          f"decode PSNR {q['psnr_db']:.1f} dB SSIM {q['ssim']:.5f}; peak {peak / 2**30:.1f} GiB (weights at install "
          f"{base / 2**30:.1f})")
    assert same
    assert torch.equal(_decode(vae, z, None), ref32)  # uninstalled: the float32 decode again


def test_fp8_recipe_decode_runs_fp8_gemms_inside_the_budget(bench, z):
    vae = _vae(bench)
    plan = h3plan.resolve_config(hardware="sm90", recipe="fp8")
    assert plan.decision("vae_precision").setting == "fp16" and plan.decision("vae_tiles").setting == "fp8_tiles"
    ref_vae = _vae(bench, "fp16")
    install(ref_vae, bench.tiles_only(plan))
    ref_ms, ref = _time(lambda: _decode(ref_vae, z, None), 2)
    uninstall(ref_vae)
    del ref_vae
    install(vae, plan)
    try:
        _decode(vae, z, None)
        reset_counters()
        plan_ms, out = _time(lambda: _decode(vae, z, None), 1)
        c = counters()
        calls = bench.decoder_calls(vae, LATENT)
    finally:
        uninstall(vae)
    from h3plan.actions.quality import compare

    q = compare(((out.float() + 1) / 2).clamp(0, 1), ((ref.float() + 1) / 2).clamp(0, 1))
    print(f"\n[gpu] vae fp8 plan {calls} decoder calls: fp16 eager at the tiles {ref_ms:.0f} ms, plan {plan_ms:.0f} ms "
          f"({ref_ms / plan_ms:.2f}x); PSNR {q['psnr_db']:.1f} dB SSIM {q['ssim']:.5f}; counters {c}")
    assert calls == 18  # 3 x 6 tiles of 288 x 272 px
    assert "vae_tiles.fp8_gemm.fallback" not in c, c
    assert q["psnr_db"] >= plan.get("recipe")["budget"]["psnr_db_min"]


@pytest.mark.parametrize("ops", ["eager", "fused"])
def test_graphs_replay_every_decoder_call_bit_for_bit(bench, z, ops):
    vae = _vae(bench)
    plan = h3plan.resolve_config(hardware="sm90", recipe="bf16", **{"recipe.vae": "fp16", "levers.vae_ops": ops,
                                                                    "levers.vae_graphs": "on"})
    ref_vae = _vae(bench, "fp16")
    _decode(ref_vae, z, None)
    eager_ms, ref = _time(lambda: _decode(ref_vae, z, None), 1)
    torch.cuda.reset_peak_memory_stats()
    _decode(ref_vae, z, None)
    eager_peak = torch.cuda.max_memory_allocated()
    del ref_vae
    torch.cuda.empty_cache()
    report = install(vae, plan)
    try:
        reset_counters()
        _decode(vae, z, None)  # captures
        torch.cuda.reset_peak_memory_stats()
        plan_ms, out = _time(lambda: _decode(vae, z, None), 2)
        plan_peak = torch.cuda.max_memory_allocated()
        c, why = counters(), fallback_reasons()
        gd = graphs_of(vae)
        captures, signatures = gd.captures, len(gd.graphs)
        calls = bench.decoder_calls(vae, LATENT)
    finally:
        uninstall(vae)
    blocks = len(vae.decoder.transformer_blocks)
    assert "vae_graphs" in report.swapped_levers() and "forward" not in vae.decoder.__dict__
    assert c.get("vae_graphs.fused") == 3 * calls and "vae_graphs.fallback" not in c, (c, why)
    assert captures == signatures and 1 <= signatures <= calls
    if ops == "fused":  # the inner kernels run in the warm-up and capture runs only
        assert c["vae_ops.qk_norm_rope.fused"] == 2 * signatures * blocks, c
    same = torch.equal(out, ref)
    print(f"\n[gpu] vae decode {list(LATENT)} fp16 vae_graphs=on vae_ops={ops}: {calls} decoder calls, {signatures} "
          f"graphs; eager fp16 {eager_ms:.0f} ms, plan {plan_ms:.0f} ms, {eager_ms / plan_ms:.2f}x; bitwise equal "
          f"{same}; peak GiB {eager_peak / 2**30:.1f} / {plan_peak / 2**30:.1f}")
    assert same, f"max abs diff {(out.float() - ref.float()).abs().max().item()}"
    assert plan_peak <= 1.10 * eager_peak + 2 * 2**30, (plan_peak, eager_peak)  # + the float32 VAE still resident here


# the latent mean against the fp32 encode's, relative to its largest magnitude
ENCODE_REL = {"fp16": 5e-3, "bf16": 4e-2}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_encode_levers_keep_the_default_encode_bitwise_and_a_forced_cast_inside_its_tolerance(bench, precision):
    """vae_encode_precision / vae_encode_tiles on the released-width VAE: an fl2va plan's default encode of a 1344x768
    keyframe is diffusers' (bitwise, also under the fp8 recipe's re-tiled decode), a forced fp16 / bf16 encode stays
    within ENCODE_REL of it and uninstall gives the float32 encoder back. Never run on a GPU when written (CPU tests:
    tests/install/test_install_vae_encode.py)."""
    fl2va = {"video": "fl2va_turbo_768x1344"}
    x = (torch.rand(1, 3, 1, 1344, 768, generator=torch.Generator().manual_seed(3)) * 2 - 1).cuda()
    vae = bench.build_vae(bench.vae_config("h3"), device="cuda", seed=0)

    def enc():
        with torch.no_grad():
            return vae.encode(x).latent_dist.mean

    ref_ms, ref = _time(enc, 2)
    for over in ({"recipe": "bf16"}, {"recipe": "fp8"}):  # fp8: vae_tiles=fp8_tiles re-tiles the decode only
        install(vae, h3plan.resolve_config(hardware="sm90", **fl2va, **over))
        try:
            assert torch.equal(enc(), ref), over
        finally:
            uninstall(vae)
    plan = h3plan.resolve_config(hardware="sm90", recipe="fp8", **fl2va, **{"levers.vae_encode_precision": precision})
    install(vae, plan)
    try:
        ms, out = _time(enc, 2)
    finally:
        uninstall(vae)
    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
    print(f"\n[gpu] vae encode 1x1344x768 fp32 {ref_ms:.0f} ms, {precision} {ms:.0f} ms ({ref_ms / ms:.2f}x), rel err "
          f"{err:.2e}")
    assert out.dtype == DT[precision] and 0 < err <= ENCODE_REL[precision]
    assert {p.dtype for p in vae.encoder.parameters()} == {torch.float32} and torch.equal(enc(), ref)
