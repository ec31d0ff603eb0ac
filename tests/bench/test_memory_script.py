"""benchmarks/memory.py's cap rows: the rows' markdown says which conditioner ran (its decoder layers sharing
--text-encoder-weight-sets layers' weights, for a host with less memory than the whole seeded pipeline), and the cap
row's child process accepts what its parent passes."""


import pytest
from scripts import load_script



@pytest.fixture(scope="module")
def memory():
    return load_script("benchmarks/memory.py")


def test_the_rows_say_which_conditioner_ran(memory):
    assert memory._conditioner_line({"text_encoder": "none"}) == []
    line = memory._conditioner_line({"text_encoder": "host", "workflow": "ref2va", "text_encoder_weight_sets": 16})[0]
    assert line.startswith("Workflow ref2va: pipe(prompt=...) through the seeded Qwen3-VL at memory.text_encoder=host")
    assert "its decoder layers sharing 16 layers' weights" in line
    assert "sharing" not in memory._conditioner_line({"text_encoder": "host", "workflow": "t2va"})[0]


@pytest.mark.parametrize("workflow,text_encoder", [("t2va", "none"), ("t2va", "host"), ("ref2va", "host")])
def test_the_cap_rows_child_accepts_the_arguments_its_parent_passes(memory, monkeypatch, tmp_path,
                                                                    workflow, text_encoder):
    """The parent runs with --cap-only; the child it starts gets no --cap-only, and must still run its one whole call
    (the first cap-ref2va run on the H200 failed here, in 21 s, before any GPU work)."""
    seen = {}
    monkeypatch.setattr(memory, "_cap_child", lambda args: seen.setdefault("args", args) and 7)
    monkeypatch.setattr(memory, "WORKFLOW", {"workflow": workflow, "text_encoder": text_encoder})
    parent = memory.argparse.Namespace(steps=3, video=(768, 1344, 124), text_tokens=110, cap_gb=80.0, layers=None,
                                       text_encoder_weight_sets=16)
    argv = memory._child_argv(parent, "bf16", tmp_path / "f.pt")
    assert memory.main(argv) == 7
    child = seen["args"]
    assert (child.cap_child, child.workflow, child.text_encoder, child.text_encoder_weight_sets) == \
        ("bf16", workflow, text_encoder, 16)
    assert (child.steps, child.video, child.cap_gb) == (3, (768, 1344, 124), 80.0)


@pytest.mark.slow  # ~7 s: the tiny ref2va pipeline with its conditioner
def test_the_cap_rows_pipeline_builds_with_a_conditioner_sharing_its_weights(memory, monkeypatch):
    """What the cap row's child builds (memory._build), on the tiny configs: diffusers' ref2va blocks with the text
    step, the conditioner's every decoder layer kept (diffusers reads hidden_states[50]: the second cap-ref2va run on
    the H200 failed on a conditioner cut to 16 layers) and sharing --text-encoder-weight-sets layers' weights, unplaced
    for install to place by the plan; a prompt string and one reference."""
    import argparse

    from h3plan.actions.bench import configured
    from h3plan.install.text_encoder import placed

    monkeypatch.setattr(memory, "WORKFLOW", {"workflow": "ref2va", "text_encoder": "host"})
    c = configured(["model=h3_tiny", "vae=h3_tiny_pipe"])[0]
    args = argparse.Namespace(layers=1, text_encoder_weight_sets=2, video=(32, 32, 124), text_tokens=9)
    pipe, prompt, media = memory._build(c, args, device="cpu")
    layers = pipe.text_encoder.model.language_model.layers
    n_layers = c["model"]["text_encoder_default"]["text_config"]["num_hidden_layers"]
    assert len(layers) == n_layers > pipe.text_encoder_layer
    assert layers[5].mlp.up_proj.weight is layers[1].mlp.up_proj.weight
    assert placed(pipe.text_encoder) is None
    assert "transformer_ref" in pipe.component_names and pipe.transformer_ref is not None
    assert prompt == {"prompt": "A red fox"} and len(media["references"]) == 1
