"""Decision tables: the TRT-LLM seed's recipe rows (SM107, docs/sources.md#trtllm-seed) and the SM90
plans that follow from the H200 anchors. Each row lists the settings it pins; the rest is free."""

from pathlib import Path

import pytest

# A synthetic table in the right format (not calibrated on any prompt): the planner only needs it to load.
TABLE = str(Path(__file__).parent / "data" / "scales-synthetic.json")
NVFP4_U1_U4 = dict(gemm_quant="nvfp4", attention="cudnn_fp8", fa4_2cta="off", fp8_scales="dynamic",
                   qk_norm_rope="fused_fp8",
                   nvfp4_producer_quant="on", nvfp4_out_quant="on", vae_tiles="fp8_tiles", vae_ops="eager")
ROWS = [
    # U1 and U4: every step fusion on, cuDNN FP8 attention, dynamic fused scales, VAE FP8 tiles
    pytest.param(["hardware=sm107", "recipe=nvfp4", "parallel=u1"],
                 dict(NVFP4_U1_U4, ulysses_padding="none", ulysses_overlap="off", a2a_fp8_codes="off",
                      prefix_inplace="off"), id="sm107-nvfp4-u1"),
    pytest.param(["hardware=sm107", "recipe=nvfp4", "parallel=u4"],
                 dict(NVFP4_U1_U4, ulysses_padding="none", ulysses_overlap="off", a2a_fp8_codes="off",
                      prefix_inplace="off"), id="sm107-nvfp4-u4"),
    # prefix in place: on whenever the length does not divide by the degree (the seed drops it otherwise)
    pytest.param(["hardware=sm107", "recipe=nvfp4", "parallel=u4", "parallel.seq_len=37822"],
                 dict(NVFP4_U1_U4, ulysses_padding="fixed_valid", prefix_inplace="on"), id="sm107-nvfp4-u4-padded"),
    # U8 at 104k: static scales (held-out table, margin 1.0); the async arm with the FP8 cast runs on static scales
    pytest.param(["hardware=sm107", "recipe=nvfp4", "parallel=u8", "video=t2v_768x1344_14s",
                  f"recipe.fp8_static_table={TABLE}"],
                 dict(NVFP4_U1_U4, fp8_scales="static", ulysses_padding="fixed_valid", prefix_inplace="on",
                      ulysses_overlap="on", a2a_fp8_codes="on"), id="sm107-nvfp4-u8-104k"),
    # U8 at 104k without a calibrated table: dynamic kept (and so no async arm with the FP8 cast)
    pytest.param(["hardware=sm107", "recipe=nvfp4", "parallel=u8", "video=t2v_768x1344_14s"],
                 dict(NVFP4_U1_U4, fp8_scales="dynamic", ulysses_overlap="off", a2a_fp8_codes="on"),
                 id="sm107-nvfp4-u8-104k-notable"),
    # U8 at 19k: step fusions off (producer quantize, out quantize, fold, FP8 scale fusion)
    pytest.param(["hardware=sm107", "recipe=nvfp4", "parallel=u8", "parallel.seq_len=19000"],
                 dict(gemm_quant="nvfp4", attention="cudnn_fp8", fp8_scales="dynamic", qk_norm_rope="fused",
                      nvfp4_producer_quant="off", nvfp4_out_quant="off", ulysses_overlap="off", a2a_fp8_codes="off",
                      ulysses_padding="none", prefix_inplace="off", vae_tiles="fp8_tiles"), id="sm107-nvfp4-u8-19k"),
    # fallback row: BF16 FA4 2-CTA, no cuDNN FP8 pieces (cuDNN FP8 unavailable, or a BF16 recipe)
    pytest.param(["hardware=sm107", "recipe=nvfp4", "parallel=u4", "hardware.cudnn.fp8=false"],
                 dict(gemm_quant="nvfp4", attention="fa4", fa4_2cta="on", fp8_scales="off", qk_norm_rope="fused",
                      a2a_fp8_codes="off", prefix_inplace="off", nvfp4_producer_quant="on"),
                 id="sm107-fallback-no-cudnn-fp8"),
    pytest.param(["hardware=sm107", "recipe=nvfp4", "parallel=u1", "hardware.cudnn.version=9.10.0"],
                 dict(attention="fa4", fa4_2cta="on", fp8_scales="off", qk_norm_rope="fused"),
                 id="sm107-fallback-cudnn-9.10.0"),
    pytest.param(["hardware=sm107", "recipe=bf16", "parallel=u1"],
                 dict(gemm_quant="bf16", attention="fa4", fa4_2cta="on", fp8_scales="off", qk_norm_rope="fused",
                      modulation="exact",
                      prefix_inplace="off", nvfp4_producer_quant="off", vae_tiles="default", vae_ops="eager"),
                 id="sm107-bf16"),
    pytest.param(["hardware=sm103", "recipe=bf16", "parallel=u1"],
                 dict(attention="fa4", fa4_2cta="on", vae_ops="eager"), id="sm103-bf16"),
    # the FP8 option: NVFP4 fusions off, dynamic FP8 scale fusion on, the static table never
    pytest.param(["hardware=sm107", "recipe=fp8", "parallel=u4"],
                 dict(gemm_quant="fp8", attention="cudnn_fp8", fp8_scales="dynamic", qk_norm_rope="fused_fp8",
                      nvfp4_producer_quant="off", nvfp4_out_quant="off", vae_tiles="fp8_tiles"), id="sm107-fp8-option"),
    pytest.param(["hardware=sm107", "recipe=fp8", "parallel=u8", f"recipe.fp8_static_table={TABLE}"],
                 dict(fp8_scales="dynamic", qk_norm_rope="fused_fp8"), id="sm107-fp8-option-u8-never-static"),
    # async Ulysses: loses at 19k, a small gain at 104k
    pytest.param(["hardware=sm107", "recipe=bf16", "parallel=u4", "parallel.seq_len=19000"],
                 dict(ulysses_overlap="off"), id="sm107-async-19k"),
    pytest.param(["hardware=sm107", "recipe=bf16", "parallel=u4", "parallel.seq_len=104076"],
                 dict(ulysses_overlap="on"), id="sm107-async-104k"),
    pytest.param(["hardware=sm107", "recipe=nvfp4", "parallel=u4", "parallel.seq_len=19000"],
                 dict(fp8_scales="dynamic", qk_norm_rope="fused_fp8", ulysses_overlap="off", a2a_fp8_codes="off"),
                 id="sm107-fp8codes-dynamic-19k"),
    # SM90 from the H200 anchors: FA4 is the fastest BF16 attention, cuDNN FP8 writes FP8, no 2-CTA, no NVFP4
    pytest.param(["hardware=sm90", "recipe=bf16", "parallel=u1"],
                 dict(gemm_quant="bf16", attention="fa4", fa4_2cta="off", fp8_scales="off", qk_norm_rope="fused",
                      modulation="exact",
                      gated_residual="on", swiglu="on", ulysses_padding="none", vae_tiles="default", vae_graphs="on",
                      vae_ops="fused"), id="sm90-bf16"),
    pytest.param(["hardware=sm90", "recipe=fp8", "parallel=u1"],
                 dict(gemm_quant="fp8", attention="cudnn_fp8", fp8_scales="dynamic", qk_norm_rope="fused_fp8",
                      nvfp4_producer_quant="off"), id="sm90-fp8"),
    pytest.param(["hardware=sm90", "recipe=nvfp4", "parallel=u1", "levers.gemm_quant=dequant_bf16"],
                 dict(gemm_quant="dequant_bf16", attention="cudnn_fp8", nvfp4_producer_quant="off",
                      nvfp4_out_quant="off"), id="sm90-nvfp4-dequant"),
    pytest.param(["hardware=sm90", "recipe=bf16", "parallel=u8"],
                 dict(attention="fa4", ulysses_padding="valid_only", ulysses_overlap="on", prefix_inplace="off"),
                 id="sm90-bf16-u8"),
    # SM100: FA4 2-CTA exists but regresses long sequences
    pytest.param(["hardware=sm100", "recipe=bf16", "parallel=u1"],
                 dict(attention="fa4", fa4_2cta="off", vae_ops="eager"), id="sm100-bf16"),
    # a lossless recipe never auto-picks a lossy lever, even on an NVFP4 checkpoint
    pytest.param(["hardware=sm107", "recipe=nvfp4", "recipe.policy=lossless"],
                 dict(gemm_quant="dequant_bf16", attention="fa4", fp8_scales="off", qk_norm_rope="fused",
                      vae_tiles="default"), id="lossless-nvfp4"),
]


@pytest.mark.parametrize("overrides,expected", ROWS)
def test_row(plan, overrides, expected):
    p = plan(*overrides)
    got = {lever: p.decision(lever).setting for lever in expected}
    assert got == expected


def test_every_lever_decided_in_registry_order(plan):
    from h3plan.levers import REGISTRY
    from h3plan.planning.schema import LEVER_SETTINGS

    assert list(REGISTRY) == list(LEVER_SETTINGS)
    p = plan("hardware=sm107", "recipe=nvfp4", "parallel=u8")
    assert [d.lever for d in p.decisions] == list(REGISTRY)
    assert all(d.setting in LEVER_SETTINGS[d.lever] and d.reasons for d in p.decisions)


def test_sm90_reasons_name_the_anchors(plan):
    att = plan("hardware=sm90").decision("attention")
    # every backend at the plan's own shape (37,820 x 56): fa4 inside the installed forward, sdpa and cudnn_bf16 by
    # action=tune on the H200 (docs/tuned/hardware/sm90_h200.yaml)
    assert "fa4 640.7 at 37,820 x 56" in att.reasons[-1] and "cudnn_bf16 568.8 at 37,820 x 56" in att.reasons[-1]
    assert "sdpa 567.7 at 37,820 x 56" in att.reasons[-1]
    at19k = plan("hardware=sm90", "parallel.seq_len=19000").decision("attention")
    assert "fa4 704" in at19k.reasons[-1] and "cudnn_bf16 564" in at19k.reasons[-1]
    assert att.hardware_verified and att.lossless
    assert "1-CTA only" in plan("hardware=sm90").decision("fa4_2cta").reasons[0]


def test_sm90_cudnn_fp8_needs_fp8_output_and_a_chosen_scale_o(plan):
    p = plan("hardware=sm90", "recipe=fp8")
    assert p.decision("attention").param("o_dtype") == "fp8"
    s = p.decision("fp8_scales")
    assert (s.param("o_dtype"), s.param("scale_o")) == ("fp8", "amax")
    assert any("scale_o" in r and "0.07-0.12" in r for r in s.reasons)
    assert plan("hardware=sm107", "recipe=fp8").decision("attention").param("o_dtype") == "bf16"


def test_static_row_records_table_and_margin(plan):
    p = plan("hardware=sm107", "recipe=nvfp4", "parallel=u8", "video=t2v_768x1344_14s",
             f"recipe.fp8_static_table={TABLE}")
    s = p.decision("fp8_scales")
    assert (s.param("scale_table"), s.param("scale_margin")) == (TABLE, 1.0)
    assert "static_scales_min" in s.reasons[0] and "interpolated" in s.reasons[0]
    assert p.decision("ulysses_overlap").param("chunk_heads") == [4, 3]
    notable = plan("hardware=sm107", "recipe=nvfp4", "parallel=u8", "video=t2v_768x1344_14s").decision("fp8_scales")
    assert "fp8_static_table is null" in notable.reasons[0]


def test_step_fusion_threshold_is_cited(plan):
    d = plan("hardware=sm107", "recipe=nvfp4", "parallel=u8", "parallel.seq_len=19000").decision("nvfp4_producer_quant")
    assert "2,375 rows per rank < 3,563" in d.reasons[0] and "step_fusions_min_rows_per_rank" in d.reasons[0]


def test_fallback_reason_names_the_missing_capability(plan):
    att = plan("hardware=sm107", "recipe=nvfp4", "hardware.cudnn.version=9.10.0").decision("attention")
    assert "cuDNN 9.10.0 is excluded" in att.reasons[0] and "BF16 attention instead, the fallback of" in att.reasons[0]


def test_vae_ops_per_capability_never_silent(plan):
    # sm90: fused with CUDA graphs, where the H200 measured it 2.16-2.56x (benchmarks/results/vae-h200.md);
    # without graphs it measured slower than eager there. 10.0 / 10.3 never measured: eager; 10.7 has no
    # op set. Every case says why.
    d = plan("hardware=sm90").decision("vae_ops")
    assert d.setting == "fused" and "with vae_graphs=on the fused decode measured 2.16-2.56x" in d.reasons[0]
    nograph = plan("hardware=sm90", "levers.vae_graphs=off").decision("vae_ops")
    assert nograph.setting == "eager" and "0.73-0.75x" in nograph.reasons[0]
    for hw in ("sm100", "sm103", "sm107"):
        d = plan(f"hardware={hw}").decision("vae_ops")
        assert d.setting == "eager" and d.reasons, hw
    assert "no registered VAE decoder op set" in plan("hardware=sm107").decision("vae_ops").reasons[0]
    assert "never measured on this GPU" in plan("hardware=sm103").decision("vae_ops").reasons[0]
    forced = plan("hardware=sm103", "levers.vae_ops=fused").decision("vae_ops")
    assert forced.setting == "fused" and forced.forced and forced.lossless


def test_vae_ops_auto_follows_a_measured_speedup(plan):
    d = plan("hardware=sm90", "levers.vae_graphs=off", "hardware.vae_ops.h3plan_speedup=[1.1,1.3]").decision("vae_ops")
    assert d.setting == "fused" and "1.10-1.30x" in d.reasons[0]
    slower = plan("hardware=sm90", "hardware.vae_ops.graphs_fused_speedup=[1.1,1.3]",
                  "hardware.vae_ops.graphs_speedup=[1.2,1.4]").decision("vae_ops")
    assert slower.setting == "eager" and "auto keeps diffusers' ops" in slower.reasons[0]
    g = plan("hardware=sm90").decision("vae_graphs")
    assert g.setting == "on" and "1.19-1.24x" in g.reasons[0]
    assert "never measured on this GPU" in plan("hardware=sm100").decision("vae_graphs").reasons[0]


def test_fp8_tiles_plan_line_says_fp8_gemms_lossy_budget_and_what_ran(plan):
    d = plan("hardware=sm90", "recipe=fp8").decision("vae_tiles")
    assert d.setting == "fp8_tiles" and d.param("dtype") == "fp8" and not d.lossless and d.hardware_verified
    line = " ".join(d.reasons)
    assert "FP8 GEMMs" in line and "lossy" in line and "PSNR >= 34.0 dB" in line and "never ran" not in line
    assert "measured on sm90: latent 1x24x62x48x84, 2.08x diffusers eager at the same tiles, PSNR 46.7 dB" in line
    d = plan("hardware=sm107", "recipe=fp8").decision("vae_tiles")  # no measurement there: said plainly
    assert "never ran on sm107 hardware" in " ".join(d.reasons) and "measured on" not in " ".join(d.reasons)
    assert plan("hardware=sm90", "recipe=bf16").decision("vae_tiles").setting == "default"


def test_fp8_tiles_geometry(plan):
    d = plan("hardware=sm107", "recipe=nvfp4").decision("vae_tiles")
    assert d.param("tile") == {"height": 288, "width": 272, "frames": None, "overlap": 32}
    assert not d.lossless
