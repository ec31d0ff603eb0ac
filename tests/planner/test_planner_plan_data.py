"""Plan data: derived numbers (exact integer arithmetic; estimates to the formula), round trips,
determinism, the install protocol's option keys, and the sources of every capability fact."""

from pathlib import Path

import pytest

from h3plan.planner import Plan

TABLE = str(Path(__file__).parent / "data" / "scales-synthetic.json")  # synthetic, format only


def test_derived_shape_numbers(plan):
    d = plan("hardware=sm107", "recipe=nvfp4", "parallel=u8", "video=t2v_768x1344_14s").to_dict()["derived"]
    assert (d["heads_per_rank"], d["padded_len"], d["padding_rows"], d["local_rows"]) == (7, 104080, 4, 13010)
    # Q, K, V as e4m3 codes (a2a_fp8_codes on) + O in bf16: 13,010 rows x 56 x 128 x (3 + 2) bytes
    assert d["a2a_bytes_per_block_per_rank"] == 13010 * 56 * 128 * 5
    assert d["a2a_bytes_leaving_rank_per_block"] == 13010 * 56 * 128 * 5 * 7 // 8
    assert d["int64_boundary_tokens_per_rank"] == 299594  # ceil(2**31 / (56 * 128))
    assert all(k in d["basis"] for k in ("a2a_bytes_per_block_per_rank", "attention_ms_per_block_est",
                                         "gemm_ms_per_block_est"))


@pytest.mark.parametrize("seq_len,required", [(74898, False), (74899, True), (299594, True)])
def test_int64_boundary(plan, seq_len, required):
    # the FFN's (S, 2*14336) input crosses 2**31 elements first: ceil(2**31 / 28672) = 74,899 rows
    assert plan(f"parallel.seq_len={seq_len}").derived_value("int64_indexing_required") is required


def test_estimates_follow_the_anchors(plan):
    d = plan("hardware=sm90", "recipe=bf16", "parallel=u1", "parallel.seq_len=19000").to_dict()["derived"]
    # FA4 at 620.6 TFLOP/s inside the installed forward at 19,000 tokens, before the kernel alone there (704)
    assert d["attention_ms_per_block_est"] == round(4 * 19000**2 * 56 * 128 / 620.6e12 * 1e3, 3)
    params = 3 * 5376 * 7168 + 7168 * 5376 + 5376 * 2 * 14336 + 14336 * 5376
    assert d["block_linear_params"] == params
    # the block linears' bf16 rate measured at those rows (19,000: 1,038.031 ms over 50 blocks), not the plain 770
    bf16_block = 2 * 19000 * params * 50 / 1038.031e9
    assert d["gemm_ms_per_block_est"] == round(2 * 19000 * params / (bf16_block * 1e12) * 1e3, 3)
    # below the measured rows: the nearest measured rows' rate (19,000)
    low = plan("hardware=sm90", "recipe=bf16", "parallel=u1", "parallel.seq_len=12000")
    assert low.derived_value("gemm_ms_per_block_est") == round(2 * 12000 * params / (bf16_block * 1e12) * 1e3, 3)
    flat = plan("hardware=sm90", "recipe=bf16", "parallel=u1", "parallel.seq_len=19000",
                "hardware.measured.gemm_block=[]")
    # BF16 GEMM 770 TFLOP/s
    assert flat.derived_value("gemm_ms_per_block_est") == round(2 * 19000 * params / 770e12 * 1e3, 3)
    u8 = plan("hardware=sm90", "recipe=fp8", "parallel=u8", "video=t2v_768x1344_14s").to_dict()["derived"]
    assert u8["attention_tflops_used"] == 841.0  # cuDNN FP8 at 104,076 x 7
    assert plan("hardware=sm107", "recipe=nvfp4").derived_value("attention_ms_per_block_est") is None
    assert plan("hardware=sm100").derived_value("attention_tflops_used") == round(2250 * 0.71, 1)


@pytest.mark.parametrize("hw", ["sm100", "sm103"])
def test_an_assumed_rate_takes_the_ratio_of_its_own_precision(plan, hw):
    """Blackwell's FP8 attention and GEMMs at the H200's measured FP8 ratios (cuDNN FP8 842 / 1979, FP8 GEMM
    1333 / 1979 TFLOP/s), never the BF16 ones (FA4 704 / 989 = 0.71 would put FP8 attention at 3,195 TFLOP/s); the
    basis and the speed line name the ratio; NVFP4 GEMMs, measured nowhere, have no ratio and no estimate."""
    p = plan(f"hardware={hw}", "recipe=fp8")
    assert p.derived_value("attention_tflops_used") == round(4500 * 0.43, 1)
    assert p.derived_value("gemm_tflops_used") == round(4500 * 0.67, 1)
    assert "assumed 0.43 x vendor dense fp8 peak" in p.to_dict()["derived"]["basis"]["attention_ms_per_block_est"]
    assert "efficiency.attention_fp8" in p.to_dict()["derived"]["basis"]["attention_ms_per_block_est"]
    speed = " ".join(str(p).split())
    assert "attention 0.43 x its fp8 peak, block linears 0.67 x its fp8 peak" in speed
    nv = plan(f"hardware={hw}", "recipe=nvfp4")
    assert nv.derived_value("gemm_ms_per_block_est") is None and nv.derived_value("forward_s_est") is None
    assert "efficiency.gemm_nvfp4: none" in nv.to_dict()["derived"]["basis"]["gemm_ms_per_block_est"]
    assert "block linears at nvfp4" in " ".join(str(nv).split())


@pytest.mark.slow  # nine plans and their round trips (~7 s)
def test_round_trips_and_determinism(plan):
    for ov in (["hardware=sm107", "recipe=nvfp4", "parallel=u8"], ["hardware=sm90"],
               ["hardware=sm90", "recipe=fp8", "parallel=u4"]):
        p = plan(*ov)
        assert Plan.from_yaml(p.to_yaml()) == p
        assert Plan.from_json(p.to_json()) == p
        assert Plan.from_dict(p.to_dict()) == p
        assert plan(*ov) == p and plan(*ov).to_yaml() == p.to_yaml()
    assert plan("hardware=sm107", "recipe=nvfp4").get("model")["diffusers_config"]["num_attention_heads"] == 56


def test_tiny_model_plans(plan):
    p = plan("model=h3_tiny", "parallel=u4", "parallel.seq_len=64")
    assert p.get("model")["diffusers_config"]["hidden_size"] == 96
    assert p.derived_value("heads_per_rank") == 1


class RecordingBuilder:
    """Records what each lever's install sets; checks every key against the levers' declared options."""

    def __init__(self):
        self.calls = []

    def set(self, lever, key, value):
        from h3plan.levers import OPTIONS

        owner, opt = OPTIONS[key]
        assert owner == lever and opt.check(value), (lever, key, value)
        self.calls.append((opt.scope, lever, key, value))

    def skip(self, lever, reason):
        assert reason
        self.calls.append(("skip", lever, None, reason))


@pytest.mark.parametrize("ov", [["hardware=sm90"], ["hardware=sm107", "recipe=nvfp4", "parallel=u8",
                                                    "recipe.fp8_static_table=" + TABLE],
                                ["hardware=sm90", "recipe=fp8", "parallel=u4"]])
def test_install_records_contract_options(plan, ov):
    from h3plan.levers import REGISTRY

    p = plan(*ov)
    b = RecordingBuilder()
    for d in p.decisions:
        REGISTRY[d.lever].install(b, d)
    by_lever = {}
    for kind, lever, key, value in b.calls:
        by_lever.setdefault(lever, []).append((kind, key, value))
    assert set(by_lever) == set(REGISTRY)  # every lever records something or says why it skips
    for d in p.decisions:
        kinds = {k for k, _, _ in by_lever[d.lever]}
        if (d.setting in ("off", "eager", "default", "bf16")
                and d.lever not in ("fa4_2cta", "fa4_tile", "ulysses_padding")):
            assert kinds == {"skip"}, d.lever
    assert ("attention", "backend", p.decision("attention").setting) in by_lever["attention"]


def test_installer_builder_accepts_every_plan(plan):
    """The installer's Builder (h3plan/install) validates keys and values: every lever's install passes."""
    builder_mod = pytest.importorskip("h3plan.install.builder")
    from h3plan.levers import REGISTRY

    for ov in (["hardware=sm90"], ["hardware=sm90", "recipe=fp8", "parallel=u8"],
               ["hardware=sm107", "recipe=nvfp4", "parallel=u8",
               "recipe.fp8_static_table=" + TABLE], ["hardware=sm107", "recipe=bf16", "parallel=u4",
                                                     "parallel.seq_len=104076"]):
        b = builder_mod.Builder()
        for d in plan(*ov).decisions:
            REGISTRY[d.lever].install(b, d)


def test_static_install_options(plan):
    from h3plan.levers import fp8_scales

    b = RecordingBuilder()
    fp8_scales.install(b, plan("hardware=sm107", "recipe=nvfp4", "parallel=u8", "video=t2v_768x1344_14s",
                               "recipe.fp8_static_table=" + TABLE).decision("fp8_scales"))
    assert [c[2:] for c in b.calls] == [("fp8_scales", "static"), ("scale_table", TABLE), ("scale_margin", 1.0)]


@pytest.mark.parametrize("hw", ["sm90", "sm100", "sm103", "sm107"])
def test_every_fact_section_cites_a_source(plan, hw):
    p = plan(f"hardware={hw}", "recipe=nvfp4" if hw != "sm90" else "recipe=fp8")
    h = p.get("hardware")
    missing = [f"hardware.{k}" for k, v in h.items() if isinstance(v, dict) and not v.get("source")]
    missing += [s for s in ("hardware", "recipe", "parallel", "model", "vae") if not p.get(s).get("source")]
    missing += [f"vae.{t}" for t in ("default_tile", "fp8_tile", "custom_tile") if not p.get("vae")[t].get("source")]
    missing += ["recipe.budget"] if not p.get("recipe")["budget"]["source"] else []
    assert missing == []
