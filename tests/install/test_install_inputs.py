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
