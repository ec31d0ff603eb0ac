"""Installing a plan into diffusers' AutoencoderKLMiniMaxH3 (tiny config, Triton interpreter).

Numeric contract: rtol=0, atol=0 against diffusers eager decoding in the same dtype: the decode as diffusers'
pipeline runs it (no autocast), a VAE cast by the plan's vae_precision against the same VAE cast as
`from_pretrained(torch_dtype=...)` casts it, and, where a user adds one, under the same CPU autocast. Two
CPU-only reference ops are swapped in both runs, as tests/kernels does: torch's RMSNorm by the CUDA reduction
order the QK kernel reproduces (`emulate_cuda_rms_norm`), and silu's exp by numpy's, the interpreter's exp (on
the GPU the kernel calls torch's expf). tests/gpu/test_install_vae_gpu.py checks unmodified CUDA eager.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import h3plan
from h3plan.install import counters, fallback_reasons, install, installed_plan, reset_counters, uninstall
from h3plan.install.hooks import registered
from h3plan.levers.vae_ops import OPS
from h3plan.runtime.kernels import qk_norm_rope as qm
from h3plan.planner import make_plan
from h3plan.facts.decision import make_decision
from h3plan.runtime.vae_sites import VaeBlockSites
from install_helpers import ROOT
from omegaconf import OmegaConf
from scripts import load_script

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
    """The lossless recipe with the recipe's own lossy fp16 decode (recipe.vae=fp16)."""
    return h3plan.resolve_config(hardware="sm90", recipe="bf16", vae="h3_tiny",
                                 **{"recipe.vae": "fp16", "levers.vae_ops": "fused", "levers.vae_graphs": "off"})


@pytest.fixture(scope="module")
def sm90_fp32():
    return h3plan.resolve_config(hardware="sm90", recipe="bf16", vae="h3_tiny",
                                 **{"levers.vae_ops": "fused", "levers.vae_graphs": "off"})


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


def cast(vae, dtype=torch.float16):
    """The VAE as from_pretrained(torch_dtype=dtype) loads it (_keep_in_fp32_modules stay float32)."""
    from h3plan.actions.pipeline_build import cast_like_from_pretrained

    return cast_like_from_pretrained(vae, dtype)


def latent(seed=1, hw=6):
    return torch.randn(1, 4, 3, hw, hw, generator=torch.Generator().manual_seed(seed))


def decode(vae, z, autocast=None, grad=False):
    with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=autocast or torch.float16,
                                                      enabled=autocast is not None):
        return vae.decode(z).sample


def vae_plan(ops=None, tile=None, tiles_setting="custom", precision="fp16"):
    ds = [make_decision("vae_precision", precision, precision == "fp32", ["test: precision"]),
          make_decision("vae_ops", "fused", True, ["test: fused"], params={"ops": list(ops or OPS)})]
    if tile is not None:
        ds.insert(1, make_decision("vae_tiles", tiles_setting, False, ["test: tiles"], params={"tile": tile}))
    return make_plan({}, {}, ds)


def assert_bits(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0)


FUSED = {"vae_ops.qk_norm_rope.fused": BLOCKS, "vae_ops.swiglu.fused": BLOCKS,
         "vae_ops.scaled_residual.fused": 2 * BLOCKS}


def test_fp16_plan_decode_is_bitwise_the_fp16_loaded_vae_and_every_fused_path_ran(sm90):
    """diffusers' own decode (no autocast) after install: the plan's fp16 decode, bit for bit the VAE loaded in fp16."""
    vae, z = tiny_vae(), latent()
    ref = decode(cast(tiny_vae()), z)
    report = h3plan.install(vae, sm90)
    assert vae.dtype == torch.float16 and vae.decoder.norm_out.weight.dtype == torch.float32  # kept in fp32
    out = decode(vae, z)
    assert out.dtype == torch.float16
    assert_bits(out, ref)
    assert counters() == FUSED  # one decoder call (one tile, one temporal chunk) through 2 blocks
    assert report.swapped_levers() == ["vae_precision", "vae_ops"] and len(report.swaps) == 1 + 3 * BLOCKS
    assert (str(report.swaps[0]).startswith("vae_precision: vae (")
            and "-> float16 (from_pretrained(torch_dtype)'s cast" in str(report.swaps[0]))
    skipped = dict(report.skipped)
    assert skipped["vae_tiles"].startswith("diffusers' released tile geometry")
    transformer = next(k for k in skipped if k.startswith("gemm_quant, adaln_table, attention"))
    assert "not to the VAE" in skipped[transformer] and "vae_ops" not in transformer
    note = next(n for n in report.notes if n.startswith("vae_precision=fp16"))
    assert "never read by a call" in note and "uninstall restores the originals bit for bit" in note


def test_fp32_plan_keeps_diffusers_default_decode_bit_for_bit_with_the_fused_ops(sm90_fp32):
    vae, z = tiny_vae(), latent()
    ref = decode(tiny_vae(), z)
    report = install(vae, sm90_fp32)
    assert vae.dtype == torch.float32
    assert_bits(decode(vae, z), ref)
    # SwiGLU and the scaled residual take float32 (no rounding step); the QK norm does not: torch's fp32 RMSNorm
    # reduces in another order (benchmarks/results/probes/vae-fp32-ops-h200.json), settled at install
    assert counters() == {k: v for k, v in FUSED.items() if "qk_norm_rope" not in k}
    assert "fp32: the VAE decodes in float32 as diffusers loads it" in dict(report.skipped)["vae_precision"]
    assert [k for k, _ in report.skipped if k.startswith("vae_ops.")] == ["vae_ops.qk_norm_rope"]


def test_an_op_whose_kernel_does_not_take_the_decode_dtype_is_settled_at_install(sm90_fp32, monkeypatch):
    import h3plan.runtime.kernels.swiglu as ks

    monkeypatch.setattr(ks, "VAE_DTYPES", ks.DTYPES)  # as if the SwiGLU kernel took 16-bit inputs only
    vae, z = tiny_vae(), latent()
    ref = decode(tiny_vae(), z)
    report = install(vae, sm90_fp32)
    assert_bits(decode(vae, z), ref)
    assert counters() == {"vae_ops.scaled_residual.fused": 2 * BLOCKS}  # no per-call fallback
    why = dict(report.skipped)["vae_ops.swiglu"]
    assert "the decoder computes in torch.float32" in why and "no per-call fallback" in why


@pytest.mark.parametrize("autocast", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_user_autocast_is_honoured_bit_for_bit(precision, autocast):
    vae, ref_vae, z = tiny_vae(), tiny_vae(), latent()
    if precision == "fp16":
        cast(ref_vae)
    ref = decode(ref_vae, z, autocast=autocast)
    install(vae, vae_plan(precision=precision))
    assert_bits(decode(vae, z, autocast=autocast), ref)
    assert counters().get("vae_ops.scaled_residual.fused") == 2 * BLOCKS


@pytest.mark.slow  # VAE decodes in the interpreter (~1 s a case)
@pytest.mark.parametrize("loaded", [torch.float16, torch.bfloat16])
def test_a_vae_loaded_in_another_dtype_keeps_it_and_still_fuses(loaded):
    """torch_dtype=float16 or bfloat16 at load: nothing to cast (fp16 plan) or nothing castable (bf16 VAE); the kernels
    run."""
    vae, z = cast(tiny_vae(), loaded), latent()
    ref = decode(cast(tiny_vae(), loaded), z)
    report = install(vae, vae_plan())
    why = dict(report.skipped)["vae_precision"]
    if loaded == torch.float16:
        assert why == "the VAE is torch.float16 already (loaded with torch_dtype): nothing to cast"
    else:
        assert why.startswith("the VAE was loaded in bfloat16, not float32: it keeps that dtype")
    assert_bits(decode(vae, z), ref)
    assert counters() == FUSED
    uninstall(vae)
    assert vae.dtype == loaded


@pytest.mark.slow  # a VAE decode per op in the interpreter (~1 s)
def test_each_op_alone_is_exact_and_counted():
    for op in OPS:
        vae, z = tiny_vae(), latent()
        ref = decode(cast(tiny_vae()), z)
        install(vae, vae_plan([op]))
        reset_counters()
        assert_bits(decode(vae, z), ref)
        assert counters() == {f"vae_ops.{op}.fused": BLOCKS * (2 if op == "scaled_residual" else 1)}, op


def test_round_trip_restores_the_original_parameters_bit_for_bit(sm90):
    vae, z = tiny_vae(), latent()
    ref = decode(vae, z)
    before = {k: v.clone() for k, v in vae.state_dict().items()}
    params = dict(vae.named_parameters())
    buffers = [n for n, _ in vae.named_buffers()]
    install(vae, sm90)
    sd = vae.state_dict()  # installed: same keys; the castable tensors float16, the _keep_in_fp32_modules float32
    from h3plan.install.vae.weights import keeps_fp32

    cast_keys = {k for k in before if not keeps_fp32(vae, k) and before[k].is_floating_point()}
    assert cast_keys and list(sd) == list(before)
    assert all(sd[k].dtype == torch.float16 and torch.equal(sd[k], before[k].to(torch.float16)) for k in cast_keys)
    assert all(sd[k].dtype == v.dtype and torch.equal(sd[k], v) for k, v in before.items() if k not in cast_keys)
    assert [n for n, _ in vae.named_buffers()] == buffers
    assert all("forward" not in m.__dict__ for b in vae.decoder.transformer_blocks for m in b.modules() if m is not b)
    assert installed_plan(vae) == sm90
    assert uninstall(vae) and not uninstall(vae) and installed_plan(vae) is None
    for b in vae.decoder.transformer_blocks:
        assert "forward" not in b.__dict__ and "_h3plan_vae" not in b.__dict__
    assert all(p is params[n] for n, p in vae.named_parameters())  # the same Parameter objects
    after = vae.state_dict()
    assert list(after) == list(before) and all(after[k].dtype == v.dtype and torch.equal(after[k], v)
                                               for k, v in before.items())
    reset_counters()
    assert_bits(decode(vae, z), ref)
    assert counters() == {}


@pytest.mark.slow  # VAE decodes in the interpreter (~2 s)
def test_the_originals_are_on_the_host_and_only_uninstall_reads_them(sm90, monkeypatch):
    vae, z = tiny_vae(), latent()
    report = install(vae, sm90)
    (cast_,) = [h.restore.__self__ for m, n in installed_state(vae).hooks if (h := m._diffusers_hook.hooks[n])
                and type(getattr(getattr(h, "restore", None), "__self__", None)).__name__ == "PrecisionCast"]
    assert cast_.slots and all(h.dtype == torch.float32 and h.device.type == "cpu" for _, h, _ in cast_.slots)
    saved = cast_.host_bytes - cast_.device_bytes
    assert f"{saved / 2**30:.3f} GiB less" in "\n".join(report.notes)
    # a decode never touches them: make reading them fail, then decode every way a user may
    monkeypatch.setattr(torch.Tensor, "to", _refuse_host_originals(torch.Tensor.to, {id(h) for _, h, _ in cast_.slots}))
    for autocast in (None, torch.float16, torch.bfloat16):
        decode(vae, z, autocast=autocast)


def installed_state(model):
    return model.__dict__["_h3plan_state"]


def _refuse_host_originals(to, ids):
    def guarded(self, *a, **k):
        if id(self) in ids:
            raise AssertionError("a call read a host-parked original")
        return to(self, *a, **k)

    return guarded


def test_install_is_idempotent_and_a_new_plan_replaces_the_old(sm90):
    vae, z = tiny_vae(), latent()
    ref = decode(cast(tiny_vae()), z)
    report = install(vae, sm90)
    assert install(vae, sm90) is report
    assert registered(vae.decoder.transformer_blocks[0]) == ["h3plan.vae_ops"]
    other = install(vae, vae_plan(["swiglu"]))
    assert other is not report and installed_plan(vae) != sm90
    reset_counters()
    assert_bits(decode(vae, z), ref)
    assert counters() == {"vae_ops.swiglu.fused": BLOCKS}


@pytest.mark.slow  # VAE decodes in the interpreter (~1-2 s a case)
@pytest.mark.parametrize("tiling_before", ["released", "off"])
def test_tile_geometry_goes_through_enable_tiling_and_is_restored(tiling_before):
    vae, ref_vae, z = tiny_vae(), cast(tiny_vae()), latent()
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


@pytest.mark.slow  # FP8 GEMMs over a whole VAE decode (~8 s)
def test_unregistered_arch_skips_vae_ops_with_the_reason_and_fp8_tiles_install_geometry_and_fp8_gemms(sm107):
    vae, ref_vae, z = tiny_vae(), cast(tiny_vae()), latent()
    report = install(vae, sm107)
    skipped = dict(report.skipped)
    assert "compute capability 10.7 has no registered VAE decoder op set" in skipped["vae_ops"]
    assert "vae_tiles.fp8_decode" not in skipped
    assert [str(s) for s in report.swaps][1] == ("vae_tiles: tiling 256x256 px, overlap 64x64 -> 288x272 px, "
                                                 "overlap 32x32")
    assert [s.lever for s in report.swaps] == ["vae_precision", "vae_tiles"] + ["vae_tiles"] * BLOCKS + ["vae_graphs"]
    assert all(b._h3plan_vae.sites == VaeBlockSites() and b._h3plan_vae.fp8 for b in vae.decoder.transformer_blocks)
    ref_vae.enable_tiling(288, 272, 32, 32)
    # the float16 decode runs the FP8 GEMMs (lossy); under bfloat16 autocast the blocks run diffusers' path, bit for bit
    out, ref = decode(vae, z), decode(ref_vae, z)
    assert out.dtype == torch.float16 and not torch.equal(out, ref) and torch.isfinite(out).all()
    assert counters()["vae_tiles.fp8_gemm.fallback"] == 6 * BLOCKS  # the fp32 emulation off CUDA, per GEMM
    reset_counters()
    assert_bits(decode(vae, z, autocast=torch.bfloat16), decode(ref_vae, z, autocast=torch.bfloat16))
    assert counters() == {"vae_graphs.fallback": 1, "vae_tiles.fp8_gemm.fallback": BLOCKS}
    assert "skipped vae_ops: compute capability 10.7" in report.summary()


def _reasons(op):
    return " | ".join(fallback_reasons().get(f"vae_ops.{op}", {}))


def test_grad_for_the_input_routes_the_kernels_to_diffusers():
    vae, ref_vae = tiny_vae().requires_grad_(False), cast(tiny_vae()).requires_grad_(False)
    z, z_ref = latent().requires_grad_(), latent().requires_grad_()
    ref = decode(ref_vae, z_ref, grad=True)
    ref.float().square().sum().backward()
    install(vae, vae_plan())
    reset_counters()
    out = decode(vae, z, grad=True)
    out.float().square().sum().backward()
    assert_bits(out, ref)
    assert_bits(z.grad, z_ref.grad)
    assert set(counters()) == {f"vae_ops.{op}.fallback" for op in OPS}
    assert all(set(r) == {"grad enabled"} for r in fallback_reasons().values())


def test_autograd_into_trainable_parameters_runs_as_diffusers_does():
    """Nothing waits on the host per call any more: gradients into the (cast) parameters are diffusers' own."""
    vae, ref_vae, z = tiny_vae(), cast(tiny_vae()), latent()  # parameters require grad (diffusers' default)
    install(vae, vae_plan())
    out, ref = decode(vae, z, grad=True), decode(ref_vae, z, grad=True)
    out.float().sum().backward()
    ref.float().sum().backward()
    assert_bits(out, ref)
    w, w_ref = (vae.decoder.transformer_blocks[0].ff.net[2].weight,
                ref_vae.decoder.transformer_blocks[0].ff.net[2].weight)
    assert w.dtype == torch.float16 and w.grad is not None and torch.equal(w.grad, w_ref.grad)


def test_cpu_without_the_interpreter_falls_back(monkeypatch):
    import h3plan.runtime.kernels._common as kc
    import h3plan.runtime.kernels.swiglu as ks
    import h3plan.runtime.kernels.vae as kv

    vae, z = tiny_vae(), latent()
    ref = decode(cast(tiny_vae()), z)
    install(vae, vae_plan())
    for mod in (kc, qm, kv, ks):
        monkeypatch.setattr(mod, "INTERPRET", False)
    reset_counters()
    assert_bits(decode(vae, z), ref)
    for op in ("qk_norm_rope", "swiglu", "scaled_residual"):
        assert counters()[f"vae_ops.{op}.fallback"] > 0 and "Triton needs CUDA" in _reasons(op), op


@pytest.mark.slow  # VAE decodes in the interpreter (~1 s a case)
@pytest.mark.parametrize("change", ["edit", "replace", "move"])
def test_weights_changed_after_install_decode_as_changed_and_uninstall_restores_the_originals(change, caplog):
    vae, ref_vae, z = tiny_vae(), cast(tiny_vae()), latent()
    before = {k: v.clone() for k, v in vae.state_dict().items()}
    install(vae, vae_plan())
    for m in (vae, ref_vae):
        lin = m.decoder.transformer_blocks[1].ff.net[2]
        with torch.no_grad():
            if change == "edit":
                lin.weight.mul_(0.5)
            elif change == "replace":
                lin.weight = torch.nn.Parameter(lin.weight.detach().clone())
            else:
                lin.float()  # what vae.to(...) / vae.float() do: new data behind the same Parameter
    if change == "move":  # one float32 linear among float16 ones: diffusers' decode refuses it, installed or not
        for m in (vae, ref_vae):
            with pytest.raises(RuntimeError, match="same dtype"):
                decode(m, z)
    else:
        assert_bits(decode(vae, z), decode(ref_vae, z))  # no copy of the weights lives anywhere a call reads
    with caplog.at_level("WARNING", logger="h3plan.install"):
        assert uninstall(vae)
    assert ("was cast to torch.float32 while installed" in caplog.text) == (change == "move")
    after = vae.state_dict()
    replaced = "decoder.transformer_blocks.1.ff.net.2.weight"
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items()
               if not (change == "replace" and k == replaced))


@pytest.mark.slow  # VAE decodes in the interpreter (~1 s)
def test_custom_attention_processor_keeps_diffusers_attention():
    import diffusers.models.autoencoders.autoencoder_kl_minimax_h3 as am

    class Mine(am.MiniMaxH3VideoAttnProcessor):
        pass

    vae, ref_vae, z = tiny_vae(), cast(tiny_vae()), latent()
    install(vae, vae_plan())
    for m in (vae, ref_vae):
        m.decoder.transformer_blocks[0].attn.set_processor(Mine())
    for autocast in (torch.float16, torch.bfloat16, None):
        reset_counters()
        assert_bits(decode(vae, z, autocast=autocast), decode(ref_vae, z, autocast=autocast))
        assert "attention processor is Mine" in _reasons("qk_norm_rope")
        assert (counters()["vae_ops.qk_norm_rope.fallback"] == 1
                and counters()["vae_ops.qk_norm_rope.fused"] == BLOCKS - 1)


def test_non_contiguous_block_input_falls_back():
    vae, ref_vae = tiny_vae(), cast(tiny_vae())
    install(vae, vae_plan())
    blk, ref_blk = vae.decoder.transformer_blocks[0], ref_vae.decoder.transformer_blocks[0]
    dim, S = blk.norm1.weight.shape[0], 11
    h = torch.randn(1, dim, S, generator=torch.Generator().manual_seed(2)).transpose(1, 2)  # (1, S, dim), strided
    rope = vae.decoder.rope(torch.rand(1, S, 3, generator=torch.Generator().manual_seed(3)) * 2 - 1)
    with torch.no_grad():
        out, ref = blk(h, rope), ref_blk(h, rope)
    assert_bits(out, ref)
    # eager's first sum keeps the strided layout, so both residuals refuse; the linears' outputs are
    # contiguous, so QK-norm/RoPE and SwiGLU still run fused
    assert "not contiguous" in _reasons("scaled_residual")
    assert counters() == {"vae_ops.qk_norm_rope.fused": 1, "vae_ops.swiglu.fused": 1,
                          "vae_ops.scaled_residual.fallback": 2}


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
    if bad == "other_vae":  # a model h3plan does not know: asking what it carries is refused the same way
        with pytest.raises(h3plan.errors.InstallError, match="expects a diffusers MiniMaxH3Transformer3DModel"):
            installed_plan(model)
    else:
        assert installed_plan(model) is None


def test_the_transformer_still_reports_vae_levers_skipped():
    from install_helpers import tiny_model

    model = tiny_model()
    report = install(model, vae_plan())
    assert ("vae_ops, vae_precision", "VAE options apply to AutoencoderKLMiniMaxH3, not to the transformer "
                       "(install the plan into the VAE too)") in report.skipped
    assert report.swaps == []


@pytest.mark.slow  # the VAE bench script on CPU (~1 s)
def test_benchmark_script_plumbing_on_cpu(tmp_path):
    """benchmarks/vae.py end to end on the tiny config (host clock; only the plumbing and records mean anything)."""
    import json

    bench = load_script("benchmarks/vae.py")
    rc = bench.main(["--out", str(tmp_path), "--device", "cpu", "--config", "h3_tiny", "--latents", "1x4x3x6x6",
                     "--plans", "hardware=sm90 recipe=bf16 recipe.vae=fp16 levers.vae_ops=fused", "--warmup", "0",
                     "--iters", "1", "--tag", "cpu"])
    assert rc == 0
    (rec,) = json.loads((tmp_path / "vae-cpu.json").read_text())["records"]
    assert {"latent", "tiles", "plan", "eager_ms", "plan_ms", "speedup", "bitwise_equal", "peak_GiB",
            "peak_ratio"} <= set(rec)
    assert rec["bitwise_equal"] and rec["tiles"] == "256x256/64" and rec["decoder_calls"] == 1 and rec["vae"] == "fp16"
    assert rec["counters"] == {**FUSED, "vae_graphs.fallback": 1}
    assert rec["gpus"] == 1 and rec["bitwise"] and rec["peak_GiB_eager"] == rec["peak_GiB"]["eager"]
    assert rec["psnr_vs_fp32_db"] is not None and rec["eager_fp32_ms"] > 0
    md = (tmp_path / "vae-cpu.md").read_text()
    assert "| 1x4x3x6x6 | 1 | 256x256/64 | hardware=sm90 recipe=bf16 recipe.vae=fp16 levers.vae_ops=fused | fp16 | on | fused | 1 |" in md  # noqa: E501
