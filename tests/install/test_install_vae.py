"""Installing a plan into diffusers' AutoencoderKLMiniMaxH3 (tiny config, Triton interpreter).

Numeric contract: rtol=0, atol=0. Eager and installed decodes run under the same CPU FP16 autocast
(torch's CPU autocast runs linear and sdpa in float16, as CUDA autocast does). Two CPU-only reference
ops are swapped in both runs, as tests/kernels does: torch's RMSNorm by the CUDA reduction order the
QK kernel reproduces (`emulate_cuda_rms_norm`), and silu's exp by numpy's, the interpreter's exp (on
the GPU the kernel calls torch's expf). tests/gpu/test_install_vae_gpu.py checks unmodified CUDA eager.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import h3plan
from h3plan.install import counters, fallback_reasons, install, installed_plan, reset_counters, uninstall
from h3plan.install.vae_block import OPS, plan_vae_block_forward
from h3plan.kernels import qk_norm_rope as qm
from h3plan.plan import make_decision, make_plan
from install_helpers import ROOT
from omegaconf import OmegaConf

TINY = {**OmegaConf.to_container(OmegaConf.load(ROOT / "conf/vae/h3_tiny.yaml").vae.diffusers_config),
        "latents_mean": (0.0,) * 4, "latents_std": (1.0,) * 4}
BLOCKS = TINY["decoder_num_layers"]
TILING = ("use_tiling", "tile_sample_min_height", "tile_sample_min_width", "tile_sample_min_overlap_height",
          "tile_sample_min_overlap_width")


def _silu_numpy_exp(x, inplace=False):
    xf = x.float()
    with np.errstate(over="ignore"):
        e = torch.from_numpy(np.exp((-xf).detach().numpy()))
    return (xf / (1.0 + e)).to(x.dtype)


@pytest.fixture(autouse=True)
def interpreter_order(monkeypatch):
    monkeypatch.setattr(F, "rms_norm", lambda x, shape, w=None, eps=None: qm.emulate_cuda_rms_norm(x, w, eps))
    monkeypatch.setattr(F, "silu", _silu_numpy_exp)
    # rows are independent; 64 rows a program only makes the interpreter faster (the GPU keeps its tuned launch)
    monkeypatch.setitem(qm.LAUNCH, "block_t", 64)
    reset_counters()


@pytest.fixture(scope="module")
def sm90():
    return h3plan.resolve_config(hardware="sm90", recipe="bf16", vae="h3_tiny", **{"levers.vae_ops": "fused", "levers.vae_graphs": "off"})


@pytest.fixture(scope="module")
def sm107():
    return h3plan.resolve_config(hardware="sm107", recipe="nvfp4", vae="h3_tiny")


def tiny_vae(seed=0):
    from diffusers import AutoencoderKLMiniMaxH3

    torch.manual_seed(seed)
    vae = AutoencoderKLMiniMaxH3(**TINY).eval()
    with torch.no_grad():  # diffusers initialises the residual scales and register tokens to zero
        for name, p in vae.named_parameters():
            if "scale" in name or "register" in name:
                p.normal_(0.0, 0.5)
    return vae


def latent(seed=1, hw=6):
    return torch.randn(1, 4, 3, hw, hw, generator=torch.Generator().manual_seed(seed))


def decode(vae, z, autocast=torch.float16, grad=False):
    with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=autocast or torch.float16, enabled=autocast is not None):
        return vae.decode(z).sample


def vae_plan(ops=None, tile=None, tiles_setting="custom"):
    ds = [make_decision("vae_ops", "fused", True, ["test: fused"], params={"ops": list(ops or OPS)})]
    if tile is not None:
        ds.insert(0, make_decision("vae_tiles", tiles_setting, False, ["test: tiles"], params={"tile": tile}))
    return make_plan({}, {}, ds)


def assert_bits(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_plan_decode_is_bitwise_eager_and_every_fused_path_ran(sm90):
    vae, z = tiny_vae(), latent()
    ref = decode(vae, z)
    report = h3plan.install(vae, sm90)
    out = decode(vae, z)
    assert_bits(out, ref)
    # one decoder call (one tile, one temporal chunk) through 2 blocks
    assert counters() == {"vae_ops.fp16_weights.fused": BLOCKS, "vae_ops.qk_norm_rope.fused": BLOCKS,
                          "vae_ops.swiglu.fused": BLOCKS, "vae_ops.scaled_residual.fused": 2 * BLOCKS}
    assert report.swapped_levers() == ["vae_ops"] and len(report.swaps) == 4 * BLOCKS
    assert str(report.swaps[0]) == ("vae_ops: decoder.transformer_blocks.0 linears (6) float32 + autocast casts -> "
                                    "float16 on the device (float32 masters on the host)")
    skipped = dict(report.skipped)
    assert skipped["vae_tiles"].startswith("diffusers' released tile geometry")
    transformer = next(k for k in skipped if k.startswith("gemm_quant, adaln_table, attention"))
    assert "not to the VAE" in skipped[transformer] and "vae_ops" not in transformer
    note = next(n for n in report.notes if n.startswith("vae_ops.fp16_weights"))
    n = 6 * 2 * BLOCKS  # six linears, weight + bias each
    assert f"{n} decoder-block linear weights/biases" in note and "are float16 on cpu while installed" in note
    assert "state_dict(), parameters() and save_pretrained see float16" in note and "device saves" in note


@pytest.mark.parametrize("op", OPS)
def test_each_op_alone_is_exact_and_counted(op):
    vae, z = tiny_vae(), latent()
    ref = decode(vae, z)
    install(vae, vae_plan([op]))
    assert_bits(decode(vae, z), ref)
    assert counters() == {f"vae_ops.{op}.fused": BLOCKS * (2 if op == "scaled_residual" else 1)}


def test_round_trip_restores_the_original_parameters_bit_for_bit(sm90):
    vae, z = tiny_vae(), latent()
    ref = decode(vae, z)
    before = {k: v.clone() for k, v in vae.state_dict().items()}
    params = dict(vae.named_parameters())
    buffers = [n for n, _ in vae.named_buffers()]
    install(vae, sm90)
    sd = vae.state_dict()  # installed: same keys; the block linears float16 (autocast's cast), the rest untouched
    linear = {k for k in before if k.startswith("decoder.transformer_blocks.") and (".attn.to_" in k or ".ff.net." in k)}
    assert len(linear) == 6 * 2 * BLOCKS and list(sd) == list(before)
    assert all(sd[k].dtype == torch.float16 and torch.equal(sd[k], before[k].to(torch.float16)) for k in linear)
    assert all(sd[k].dtype == v.dtype and torch.equal(sd[k], v) for k, v in before.items() if k not in linear)
    assert [n for n, _ in vae.named_buffers()] == buffers
    assert installed_plan(vae) == sm90
    assert uninstall(vae) and not uninstall(vae) and installed_plan(vae) is None
    for b in vae.decoder.transformer_blocks:
        assert "forward" not in b.__dict__ and "_h3plan_vae" not in b.__dict__
        assert all("forward" not in m.__dict__ and "_h3plan_fp16" not in m.__dict__ for m in b.modules())
    assert all(p is params[n] for n, p in vae.named_parameters())  # the same Parameter objects
    after = vae.state_dict()
    assert list(after) == list(before) and all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    reset_counters()
    assert_bits(decode(vae, z), ref)
    assert counters() == {}


def test_device_parameters_are_float16_and_the_masters_on_the_host(sm90):
    vae = tiny_vae()
    originals = {n: p.detach().clone() for n, p in vae.named_parameters()}
    report = install(vae, sm90)
    for b in vae.decoder.transformer_blocks:
        w = b._h3plan_vae.weights
        assert len(w.swapped) == 12 and not w.pinned  # CPU model: plain host memory
        for s in w.slots:
            assert s.param.dtype == torch.float16 and s.master.dtype == torch.float32 and s.master.device.type == "cpu"
            assert torch.equal(s.param, s.master.to(torch.float16))
            assert s.param.data_ptr() != s.master.data_ptr()
    fp16 = {n for n, p in vae.named_parameters() if p.dtype == torch.float16}
    assert fp16 == {n for n in originals if n.startswith("decoder.transformer_blocks.") and (".attn.to_" in n or ".ff.net." in n)}
    saved = sum(originals[n].numel() * 2 for n in fp16)
    assert f"the device saves {saved / 2**30:.3f} GiB" in "\n".join(report.notes)


def test_install_is_idempotent_and_a_new_plan_replaces_the_old(sm90):
    vae, z = tiny_vae(), latent()
    ref = decode(vae, z)
    report = install(vae, sm90)
    assert install(vae, sm90) is report
    fwd = vae.decoder.transformer_blocks[0].forward
    assert fwd.__func__ is plan_vae_block_forward and fwd.__self__ is vae.decoder.transformer_blocks[0]
    other = install(vae, vae_plan(["swiglu"]))
    assert other is not report and installed_plan(vae) != sm90
    reset_counters()
    assert_bits(decode(vae, z), ref)
    assert counters() == {"vae_ops.swiglu.fused": BLOCKS}


@pytest.mark.parametrize("tiling_before", ["released", "off"])
def test_tile_geometry_goes_through_enable_tiling_and_is_restored(tiling_before):
    vae, ref_vae, z = tiny_vae(), tiny_vae(), latent()
    if tiling_before == "off":
        vae.disable_tiling()
    before = {a: getattr(vae, a) for a in TILING}
    ref_vae.enable_tiling(16, 16, 8, 8)  # 24 px frames -> 2 x 2 tiles of 16 px
    ref = decode(ref_vae, z)
    report = install(vae, vae_plan(tile={"height": 16, "width": 16, "overlap": 8, "frames": None}))
    assert {a: getattr(vae, a) for a in TILING} == {a: getattr(ref_vae, a) for a in TILING}
    old = "tiling off" if tiling_before == "off" else "256x256 px, overlap 64x64"
    assert f"vae_tiles: tiling {old} -> 16x16 px, overlap 8x8" in [str(s) for s in report.swaps]
    assert_bits(decode(vae, z), ref)
    assert counters()["vae_ops.qk_norm_rope.fused"] == 4 * BLOCKS  # 4 tiles, fused in every one
    uninstall(vae)
    assert {a: getattr(vae, a) for a in TILING} == before


@pytest.mark.parametrize("tile,msg", [({"height": 18, "width": 16, "overlap": 8}, "multiples"),
                                      ({"height": 16, "width": 16, "overlap": 16}, "overlap < min"),
                                      ({"height": 16, "width": 16, "overlap": 0}, "overlap < min")])
def test_bad_tile_geometry_is_refused_and_the_model_untouched(tile, msg):
    vae = tiny_vae()
    before = {a: getattr(vae, a) for a in TILING}
    with pytest.raises(ValueError, match=msg):
        install(vae, vae_plan(tile=tile))
    assert {a: getattr(vae, a) for a in TILING} == before and installed_plan(vae) is None
    assert all("forward" not in b.__dict__ for b in vae.decoder.transformer_blocks)


def test_unregistered_arch_skips_vae_ops_with_the_reason_and_fp8_tiles_install_geometry_and_fp8_gemms(sm107):
    vae, ref_vae, z = tiny_vae(), tiny_vae(), latent()
    report = install(vae, sm107)
    skipped = dict(report.skipped)
    assert "compute capability 10.7 has no registered VAE decoder op set" in skipped["vae_ops"]
    assert "vae_tiles.fp8_decode" not in skipped
    assert [str(s) for s in report.swaps][0] == "vae_tiles: tiling 256x256 px, overlap 64x64 -> 288x272 px, overlap 32x32"
    assert [s.lever for s in report.swaps] == ["vae_tiles"] * (1 + BLOCKS) + ["vae_graphs"]
    assert all(b._h3plan_vae.ops == frozenset() and b._h3plan_vae.fp8 for b in vae.decoder.transformer_blocks)
    ref_vae.enable_tiling(288, 272, 32, 32)
    # FP8 GEMMs only when autocast is on: without it the blocks run diffusers' path, bit for bit
    assert_bits(decode(vae, z, autocast=None), decode(ref_vae, z, autocast=None))
    assert counters() == {"vae_graphs.fallback": 1, "vae_tiles.fp8_gemm.fallback": BLOCKS}
    assert "skipped vae_ops: compute capability 10.7" in report.summary()


def _reasons(op):
    return " | ".join(fallback_reasons().get(f"vae_ops.{op}", {}))


def test_fp32_without_autocast_falls_back_where_the_kernels_need_fp16():
    vae, z = tiny_vae(), latent()
    ref = decode(vae, z, autocast=None)
    install(vae, vae_plan())
    reset_counters()
    assert_bits(decode(vae, z, autocast=None), ref)  # on the float32 masters, not the float16 parameters
    c = counters()
    assert c["vae_ops.fp16_weights.fallback"] == BLOCKS and "autocast is off on cpu" in _reasons("fp16_weights")
    assert c["vae_ops.qk_norm_rope.fallback"] == BLOCKS and "float32" in _reasons("qk_norm_rope")
    assert c["vae_ops.swiglu.fallback"] == BLOCKS and "float32" in _reasons("swiglu")
    assert c["vae_ops.scaled_residual.fused"] == 2 * BLOCKS  # fp32 + fp32 * fp32 is the kernel's math too
    assert vae.decoder.transformer_blocks[0].ff.net[2].weight.dtype == torch.float16  # the masters were lent, not put back
    assert_bits(decode(vae, z), decode(tiny_vae(), z))  # and FP16 autocast is exact again right after


def test_bf16_autocast_refuses_the_fp16_weights_only():
    vae, z = tiny_vae(), latent()
    ref = decode(vae, z, autocast=torch.bfloat16)
    install(vae, vae_plan())
    reset_counters()
    assert_bits(decode(vae, z, autocast=torch.bfloat16), ref)
    assert "autocast dtype torch.bfloat16 != float16" in _reasons("fp16_weights")
    assert counters() == {"vae_ops.fp16_weights.fallback": BLOCKS, "vae_ops.qk_norm_rope.fused": BLOCKS,
                          "vae_ops.swiglu.fused": BLOCKS, "vae_ops.scaled_residual.fused": 2 * BLOCKS}


def test_grad_for_the_input_routes_everything_to_diffusers_on_the_masters():
    vae, ref_vae = tiny_vae().requires_grad_(False), tiny_vae().requires_grad_(False)
    z, z_ref = latent().requires_grad_(), latent().requires_grad_()
    ref = decode(ref_vae, z_ref, grad=True)
    ref.square().sum().backward()
    install(vae, vae_plan())
    reset_counters()
    out = decode(vae, z, grad=True)
    out.square().sum().backward()
    assert_bits(out, ref)
    assert_bits(z.grad, z_ref.grad)  # the backward ran through the float32 masters too
    assert set(counters()) == {f"vae_ops.{op}.fallback" for op in OPS}
    assert all(set(r) == {"grad enabled"} for r in fallback_reasons().values())


def test_autograd_into_trainable_parameters_is_refused():
    vae, z = tiny_vae(), latent()  # parameters require grad (diffusers' default)
    install(vae, vae_plan())
    with pytest.raises(h3plan.errors.InstallError, match=r"autograd is recording and decoder\.transformer_blocks\.0 linears "
                                                         r"require grad.*torch\.no_grad\(\)"):
        decode(vae, z, grad=True)
    assert_bits(decode(vae, z), decode(tiny_vae(), z))  # under no_grad they are not reached: exact


def test_cpu_without_the_interpreter_falls_back(monkeypatch):
    import h3plan.kernels._common as kc
    import h3plan.kernels.swiglu as ks
    import h3plan.kernels.vae as kv

    vae, z = tiny_vae(), latent()
    ref = decode(vae, z)
    install(vae, vae_plan())
    for mod in (kc, qm, kv, ks):
        monkeypatch.setattr(mod, "INTERPRET", False)
    reset_counters()
    assert_bits(decode(vae, z), ref)
    for op in ("qk_norm_rope", "swiglu", "scaled_residual"):
        assert counters()[f"vae_ops.{op}.fallback"] > 0 and "Triton needs CUDA" in _reasons(op), op
    assert counters()["vae_ops.fp16_weights.fused"] == BLOCKS  # no Triton in it


@pytest.mark.parametrize("change", ["edit", "replace", "move"])
def test_weights_changed_after_install_are_refused_and_uninstall_restores(change, caplog):
    vae, z = tiny_vae(), latent()
    before = {k: v.clone() for k, v in vae.state_dict().items()}
    install(vae, vae_plan())
    lin = vae.decoder.transformer_blocks[1].ff.net[2]
    with torch.no_grad():
        if change == "edit":
            lin.weight.mul_(0.5)
        elif change == "replace":
            lin.weight = torch.nn.Parameter(lin.weight.detach().float())
        else:
            lin.float()  # what vae.to(...) / vae.float() do: new data behind the same Parameter
    msg = {"edit": "was moved, cast or edited in place", "replace": "weight of a linear was replaced",
           "move": "was moved, cast or edited in place"}[change]
    with pytest.raises(h3plan.errors.InstallError, match=rf"decoder\.transformer_blocks\.1 .*{msg}.*uninstall"):
        decode(vae, z)
    with caplog.at_level("WARNING", logger="h3plan.install"):
        assert uninstall(vae)
    assert "restoring the float32 originals" in caplog.text
    after = vae.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())


def test_custom_attention_processor_keeps_diffusers_attention_on_guarded_linears():
    import diffusers.models.autoencoders.autoencoder_kl_minimax_h3 as am

    class Mine(am.MiniMaxH3VideoAttnProcessor):
        pass

    vae, ref_vae, z = tiny_vae(), tiny_vae(), latent()
    install(vae, vae_plan())
    for m in (vae, ref_vae):
        m.decoder.transformer_blocks[0].attn.set_processor(Mine())
    for autocast in (torch.float16, torch.bfloat16, None):
        reset_counters()
        assert_bits(decode(vae, z, autocast=autocast), decode(ref_vae, z, autocast=autocast))
        c = counters()
        # the processor calls to_q/k/v and to_out.0 through their modules: each call is routed and counted
        routed = c.get("vae_ops.fp16_weights.fused", 0) + c.get("vae_ops.fp16_weights.fallback", 0)
        assert routed == BLOCKS + 4, (autocast, c)
        assert (c.get("vae_ops.fp16_weights.fused", 0) == routed) == (autocast == torch.float16)
        assert "attention processor is Mine" in _reasons("qk_norm_rope")


@pytest.mark.parametrize("autocast", [torch.float16, torch.bfloat16, None])
def test_a_direct_linear_call_is_routed_exactly(autocast):
    vae, ref_vae = tiny_vae(), tiny_vae()
    install(vae, vae_plan())
    lin, ref_lin = vae.decoder.transformer_blocks[0].ff.net[0].proj, ref_vae.decoder.transformer_blocks[0].ff.net[0].proj
    x = torch.randn(3, lin.in_features, generator=torch.Generator().manual_seed(4))
    reset_counters()
    with torch.no_grad(), torch.autocast("cpu", dtype=autocast or torch.float16, enabled=autocast is not None):
        out, ref = lin(x), ref_lin(x)
    assert out.dtype == ref.dtype
    assert_bits(out, ref)  # bfloat16 autocast: bf16(original), not bf16(float16 weight)
    assert counters() == {f"vae_ops.fp16_weights.{'fused' if autocast == torch.float16 else 'fallback'}": 1}


def test_non_contiguous_block_input_falls_back():
    vae, ref_vae = tiny_vae(), tiny_vae()
    install(vae, vae_plan())
    blk, ref_blk = vae.decoder.transformer_blocks[0], ref_vae.decoder.transformer_blocks[0]
    dim, S = blk.norm1.weight.shape[0], 11
    h = torch.randn(1, dim, S, generator=torch.Generator().manual_seed(2)).transpose(1, 2)  # (1, S, dim), strided
    rope = vae.decoder.rope(torch.rand(1, S, 3, generator=torch.Generator().manual_seed(3)) * 2 - 1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        out, ref = blk(h, rope), ref_blk(h, rope)
    assert_bits(out, ref)
    # eager's first sum keeps the strided layout, so both residuals refuse; the linears' outputs are
    # contiguous, so QK-norm/RoPE and SwiGLU still run fused
    assert "not contiguous" in _reasons("scaled_residual")
    assert counters() == {"vae_ops.fp16_weights.fused": 1, "vae_ops.qk_norm_rope.fused": 1,
                          "vae_ops.swiglu.fused": 1, "vae_ops.scaled_residual.fallback": 2}


@pytest.mark.parametrize("bad", ["other_vae", "hooked", "ffn"])
def test_refuses_models_it_does_not_know(bad):
    if bad == "other_vae":
        from diffusers import AutoencoderKL

        model = AutoencoderKL(block_out_channels=(8,), norm_num_groups=4, latent_channels=2)
        msg = "supports the MiniMax-H3 VAE (diffusers' AutoencoderKLMiniMaxH3) and otherwise"
    elif bad == "hooked":
        model = tiny_vae()
        model.decoder.transformer_blocks[1].attn.to_q.register_forward_hook(lambda *a: None)
        msg = "decoder.transformer_blocks.1.attn.to_q carries hooks"
    else:
        model = tiny_vae()
        model.decoder.transformer_blocks[0].ff.net[0] = torch.nn.GELU()
        msg = "decoder.transformer_blocks.0.ff.net.0.proj is missing"
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        install(model, vae_plan())
    assert installed_plan(model) is None


def test_the_transformer_still_reports_vae_levers_skipped():
    from install_helpers import tiny_model

    model = tiny_model()
    report = install(model, vae_plan())
    assert ("vae_ops", "VAE options apply to AutoencoderKLMiniMaxH3, not to the transformer "
                       "(install the plan into the VAE too)") in report.skipped
    assert report.swaps == []


def test_benchmark_script_plumbing_on_cpu(tmp_path):
    """benchmarks/vae.py end to end on the tiny config (host clock; only the plumbing and records mean anything)."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "vae.py"
    spec = importlib.util.spec_from_file_location("bench_vae", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rc = bench.main(["--out", str(tmp_path), "--device", "cpu", "--config", "h3_tiny", "--latents", "1x4x3x6x6",
                     "--plans", "hardware=sm90 recipe=bf16 levers.vae_ops=fused", "--warmup", "0", "--iters", "1", "--tag", "cpu"])
    assert rc == 0
    (rec,) = json.loads((tmp_path / "vae-cpu.json").read_text())["records"]
    assert {"latent", "tiles", "plan", "eager_ms", "plan_ms", "speedup", "bitwise_equal", "peak_GiB", "peak_ratio"} <= set(rec)
    assert rec["bitwise_equal"] and rec["tiles"] == "256x256/64" and rec["decoder_calls"] == 1
    assert rec["counters"] == {"vae_ops.fp16_weights.fused": 2, "vae_ops.qk_norm_rope.fused": 2,
                               "vae_ops.swiglu.fused": 2, "vae_ops.scaled_residual.fused": 4, "vae_graphs.fallback": 1}
    assert rec["gpus"] == 1 and rec["bitwise"] and rec["peak_GiB_eager"] == rec["peak_GiB"]["eager"]
    assert "| 1x4x3x6x6 | 1 | 256x256/64 | hardware=sm90 recipe=bf16 levers.vae_ops=fused | on | fused | 1 |" in (tmp_path / "vae-cpu.md").read_text()


def test_fp16_checkpoint_has_nothing_to_materialise_and_still_fuses():
    """A float16 torch_dtype (no autocast): the block linears are float16 already; the kernels still run."""
    vae, z = tiny_vae(), latent()
    for b in vae.decoder.transformer_blocks:
        b.attn.half()
        b.ff.half()
    vae.decoder.proj_in.half()
    vae.post_quant_conv.half()
    ref = decode(vae, z, autocast=None)
    report = install(vae, vae_plan())
    assert dict(report.skipped)["vae_ops.fp16_weights"] == "decoder block linears are already float16: nothing to swap"
    assert_bits(decode(vae, z, autocast=None), ref)
    assert counters() == {"vae_ops.qk_norm_rope.fused": BLOCKS, "vae_ops.swiglu.fused": BLOCKS,
                          "vae_ops.scaled_residual.fused": 2 * BLOCKS}
