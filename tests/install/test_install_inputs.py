"""The packed layout verify and bench feed the model, against diffusers' H3 test conventions:
token_tags 0 video / 1 text / 2 audio, per-row timestep_indices into `timestep`, (t, h, w) position_ids,
index tensors that partition the sequence, and the mixed-precision cast of the released checkpoint."""

import pytest
import torch
from install_helpers import TINY, forward, tiny_model

from h3plan.actions.inputs import build_model, layout, packed_inputs, packed_layout


@pytest.mark.parametrize("S", [48, 19000, 37820])
def test_layout_conventions(S):
    lay = packed_layout(S)
    text, audio, video = lay["text_indices"], lay["audio_indices"], lay["video_indices"]
    assert torch.equal(torch.cat([text, audio, video]), torch.arange(S))  # text, audio, video: a partition
    assert (lay["token_tags"][text] == 1).all() and (lay["token_tags"][audio] == 2).all()
    assert (lay["token_tags"][video] == 0).all()
    assert lay["timestep"].tolist() == pytest.approx([0.7, 0.3])
    assert (lay["timestep_indices"][audio] == 1).all() and (lay["timestep_indices"][text] == 0).all()
    assert (lay["timestep_indices"][video] == 0).all()
    pos = lay["position_ids"]
    assert pos.shape == (S, 3) and pos.dtype == torch.float32
    gh, gw = (17, 30) if S >= 4096 else (2, 4)
    assert pos[video, 1].max() == gh - 1 and pos[video, 2].max() == gw - 1
    assert (pos[text, 1:] == 0).all() and (pos[audio, 1:] == 0).all()
    assert torch.equal(pos[video[: gh * gw], 0], torch.zeros(gh * gw)) and pos[video[gh * gw], 0] == 1
    assert len(text) + len(audio) + len(video) == S == sum(layout(S))


def test_real_size_counts():
    assert layout(19000) == (512, 475, 18013)
    with pytest.raises(ValueError, match="no video rows"):
        layout(8)


def test_inputs_run_the_model_and_cast_like_the_checkpoint():
    model = tiny_model()
    keep = [n for n, p in model.named_parameters() if p.dtype == torch.float32]
    assert keep and all(any(k in n for k in model._keep_in_fp32_modules) for n in keep)
    assert model.rope.inv_freq.dtype == torch.float32
    assert model.transformer_blocks[0].adaln_proj.linear.weight.dtype == torch.bfloat16
    inputs = packed_inputs(TINY, 48, batch=2)
    video, audio = forward(model, inputs)
    assert video.shape == (2, len(inputs["video_indices"]), 16) and audio.shape == (2, 6, TINY["audio_in_channels"])
    assert torch.equal(packed_inputs(TINY, 48)["hidden_states"], packed_inputs(TINY, 48)["hidden_states"])
    assert torch.equal(build_model(TINY, blocks=1).transformer_blocks[0].attn.to_q.weight,
                       model.transformer_blocks[0].attn.to_q.weight)  # seeded weights


def _tensors(model) -> dict:
    return {**dict(model.named_parameters()), **{"buffer:" + k: v for k, v in model.named_buffers()}}


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_narrow_build_holds_the_float32_builds_values(dtype):
    """The real-width model is 123 GiB in float32, over an 80 GB card: build_model then builds in `dtype` directly,
    and every tensor (the fp32-kept modules unrounded) and the generator afterwards are what the float32 build
    cast gives."""
    a = build_model(TINY, blocks=2, dtype=dtype, seed=5, narrow=False)
    after_a = torch.rand(4)
    b = build_model(TINY, blocks=2, dtype=dtype, seed=5, narrow=True)
    after_b = torch.rand(4)
    ta, tb = _tensors(a), _tensors(b)
    assert ta.keys() == tb.keys()
    assert {k for k, v in tb.items() if v.dtype == torch.float32} == {k for k, v in ta.items()
                                                                      if v.dtype == torch.float32} != set()
    assert all(ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]) for k in ta), \
        [k for k in ta if not torch.equal(ta[k], tb[k])]
    assert torch.equal(after_a, after_b)
    assert torch.get_default_dtype() == torch.float32


def test_a_narrow_build_differs_where_a_seed_does():
    """The equality above is of values, not of one constant: another seed gives other weights."""
    a = _tensors(build_model(TINY, blocks=1, seed=5, narrow=True))
    b = _tensors(build_model(TINY, blocks=1, seed=6, narrow=True))
    assert any(not torch.equal(a[k], b[k]) for k in a if a[k].is_floating_point() and a[k].numel() > 1)


def test_only_a_cuda_build_over_free_memory_goes_narrow(monkeypatch):
    from diffusers import MiniMaxH3Transformer3DModel

    from h3plan.actions import inputs

    cfg = {**TINY, "patch_size": tuple(TINY["patch_size"])} if "patch_size" in TINY else dict(TINY)
    assert not inputs._float32_over_free(MiniMaxH3Transformer3DModel, cfg, "cpu")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (1 << 20, 80 << 30))
    assert inputs._float32_over_free(MiniMaxH3Transformer3DModel, cfg, "cuda")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (140 << 30, 140 << 30))
    assert not inputs._float32_over_free(MiniMaxH3Transformer3DModel, cfg, "cuda")


def test_a_narrow_build_initialises_every_tensor_in_its_one_scratch(monkeypatch):
    """The float32 initialisations run in one scratch allocated before the model (so on a GPU no freed temporary sits
    between two of the model's tensors, where a plan's moves would leave holes): no tensor needed its own, the
    scratch is the model's largest tensor, and the build lets it go."""
    from h3plan.actions import inputs

    seen = []

    class Spy(inputs._Float32Init):
        def __init__(self, scratch=None):
            super().__init__(scratch)
            seen.append((self, scratch.numel()))

    monkeypatch.setattr(inputs, "_Float32Init", Spy)
    model = build_model(TINY, blocks=2, seed=5, narrow=True)
    (mode, numel), = seen
    assert mode.calls and mode.fresh == 0 and mode.scratch is None
    assert numel == max(t.numel() for t in (*model.parameters(), *model.buffers()))


def test_a_tensor_over_the_scratch_gets_its_own_and_the_same_draws():
    from h3plan.actions.inputs import _Float32Init

    torch.manual_seed(3)
    want = torch.empty(40).normal_().to(torch.bfloat16)
    mode = _Float32Init(torch.empty(8))
    torch.manual_seed(3)
    t = torch.empty(40, dtype=torch.bfloat16)
    with mode:
        torch.nn.init.normal_(t)
    assert mode.fresh == 1 and torch.equal(t, want)
    torch.manual_seed(3)
    small = torch.empty(5, 8, dtype=torch.bfloat16)  # under the scratch's size: a view of it, the same draws
    with _Float32Init(torch.empty(64)) as fits:
        torch.nn.init.normal_(small)
    assert fits.fresh == 0 and torch.equal(small.flatten(), want[:40])
