"""H200: h3plan.planning.text_encoder's sizes against torch.cuda, a seeded Qwen3-VL conditioner at the width MiniMax-H3
reads (text hidden 5120 = the transformer's text_dim, 64 decoder layers; tests/planner/test_text_encoder.py WIDE: a test
input, not the released checkpoint's config), run the way diffusers' get_qwen3vl_prompt_embeds runs it
(`text_encoder.model(..., output_hidden_states=True, use_cache=False)`, no_grad, bf16). Each case prints one line: the
estimate, the measurement and their ratio.

    . /tmp/h3site/env.sh && python -m pytest tests/gpu/test_text_encoder_memory_gpu.py -m gpu -q -rA -s

Contracts: the weights on the device equal `weight_bytes` (rtol=0: the parameter count is exact on the CPU); the
encode's peak above the weights within 25% of `activation_bytes` (every hidden state kept + one layer's MLP; a first
measurement: never calibrated, the ratio it prints is what to tighten the estimate with).
"""

import gc
import os
import sys
import time

import pytest
import torch

from h3plan.planning import text_encoder as TE

pytestmark = pytest.mark.gpu
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "planner"))
from test_text_encoder import WIDE  # noqa: E402


@pytest.fixture(scope="module")
def conditioner():
    transformers = pytest.importorskip("transformers")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    cfg = transformers.Qwen3VLConfig(text_config=WIDE["text_config"], vision_config=WIDE["vision_config"],
                                     tie_word_embeddings=False)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 on meta: 33B float32 parameters would not fit the device
    try:
        with torch.device("meta"):
            model = transformers.Qwen3VLForConditionalGeneration(cfg)
    finally:
        torch.set_default_dtype(dtype)
    model = model.to_empty(device="cuda").eval()
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=g)
    yield model, torch.cuda.memory_allocated() - before
    del model
    gc.collect()
    torch.cuda.empty_cache()


def test_weights_on_the_device(conditioner):
    model, weights = conditioner
    want = TE.sizes(WIDE)["weight_bytes"]
    print(f"\ntext encoder weights: estimate {want / 2**30:.3f} GiB, measured {weights / 2**30:.3f} GiB")
    assert sum(p.numel() * p.element_size() for p in model.parameters()) == want
    assert abs(weights - want) <= 64 * 2**20  # the allocator's rounding per tensor (a few hundred tensors)


@pytest.mark.parametrize("tokens", (110, 2142, 4214))  # the t2va, fl2va and ref2va presets' text rows
def test_encode_peak(conditioner, tokens):
    model, _ = conditioner
    ids = torch.randint(0, 150000, (1, tokens), device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    with torch.no_grad():  # the process's cuBLAS workspace (32 MiB on sm90, through the caching allocator at the first
        model.model(input_ids=ids[:, :8], use_cache=False)  # GEMM) is not the encode's: the first run counted it
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        out = model.model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=torch.zeros_like(ids),
                          use_cache=False, output_hidden_states=True)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    est = TE.sizes(WIDE, tokens)["activation_bytes"]
    print(f"\nencode {tokens} rows: estimate {est / 2**20:.1f} MiB, measured {peak / 2**20:.1f} MiB, ratio "
          f"{peak / est:.3f}")
    assert len(out.hidden_states) == WIDE["text_config"]["num_hidden_layers"] + 1
    del out
    assert 0.75 <= peak / est <= 1.25


@pytest.mark.parametrize("setting", ["resident", "offload_after", "host"])
def test_placements_move_the_conditioner_where_the_plan_says(setting):
    """h3plan/install/text_encoder.py on the device (the CPU tests see one device): the tiny conditioner
    (model=h3_tiny's text_encoder_default) placed on cuda encodes exactly what the resident one does, and rests where
    the placement says between calls (resident: cuda; offload_after and host: the host, moved for the encode)."""
    import yaml

    from h3plan.actions.text_encoder_build import build_text_encoder
    from h3plan.install.text_encoder import place
    from h3plan.planning import CONF

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    cfg = yaml.safe_load(open(f"{CONF}/model/h3_tiny.yaml"))["text_encoder_default"]
    ids = torch.randint(0, 256, (1, 40), device="cuda", generator=torch.Generator(device="cuda").manual_seed(2))
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=torch.zeros_like(ids),
              use_cache=False,
              output_hidden_states=True)
    import copy

    model = build_text_encoder(cfg, device="cpu")
    ref_model = copy.deepcopy(model).to("cuda")  # the same weights and rotary tables, resident
    with torch.no_grad():
        want = ref_model.model(**kw).hidden_states[50]
    p = place(model, setting, "cuda")
    try:
        with torch.no_grad():
            got = model.model(**kw).hidden_states[50]
        rest = {t.device.type for t in model.model.language_model.layers.parameters()}
        assert rest == ({"cuda"} if setting == "resident" else {"cpu"})
        assert got.device.type == "cuda" and torch.equal(got, want)
    finally:
        p.restore()


def test_offload_after_moves_at_the_links_rate(conditioner):
    """The real-width conditioner placed offload_after (last in this file: it leaves the module on the host): pinned
    host masters; one call of the encode moves the 62 GiB up at no less than 60% of the plan's memory.host_link_gbps
    (50 GB/s; the copy alone ran 55 GB/s pinned on the H200, 1.7 GB/s through module.to("cpu"): ~50 s a call for the
    fl2va turbo row), and between calls none of it stays on the device."""
    from h3plan.install.text_encoder import place

    model, weights = conditioner
    p = place(model, "offload_after", "cuda")
    try:
        assert p.why_not_pinned is None, p.why_not_pinned
        torch.cuda.synchronize()
        resting = torch.cuda.memory_allocated()
        ids = torch.randint(0, 150000, (1, 110), device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))
        walls = []
        for _ in range(2):  # the first also makes the allocator's blocks
            start = time.perf_counter()
            with torch.no_grad():
                model.model(input_ids=ids, use_cache=False, output_hidden_states=True)
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - start)
            assert torch.cuda.memory_allocated() - resting <= 64 * 2**20
        gbps = weights / 1e9 / walls[-1]  # a lower bound of the move's rate: the encode is inside the wall
        print(f"\noffload_after: {weights / 2**30:.1f} GiB up + the 110-row encode in {walls[-1]:.2f} s (first "
              f"{walls[0]:.2f} s): >= {gbps:.1f} GB/s")
        assert gbps >= 0.6 * 50.0
    finally:
        p.restore()
