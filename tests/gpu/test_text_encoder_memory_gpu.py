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
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        out = model.model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=torch.zeros_like(ids),
                          use_cache=False, output_hidden_states=True)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    est = TE.sizes(WIDE, tokens)["activation_bytes"]
    print(f"\nencode {tokens} rows: estimate {est / 2**20:.1f} MiB, measured {peak / 2**20:.1f} MiB, ratio {peak / est:.3f}")
    assert len(out.hidden_states) == WIDE["text_config"]["num_hidden_layers"] + 1
    del out
    assert 0.75 <= peak / est <= 1.25
