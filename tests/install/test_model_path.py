"""`model.path=DIR`: action=verify / action=bench on a local diffusers checkpoint folder, loaded with
from_pretrained (a tiny seeded checkpoint written with save_pretrained; the CPU, Triton's interpreter)."""

import json

import pytest
import torch
from install_helpers import tiny_model

from h3plan import cli
from h3plan.actions.inputs import load_model
from h3plan.errors import UsageError


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A pipeline-style folder (transformer/) holding the tiny model with seed-3 weights (seeded verify uses 0)."""
    folder = tmp_path_factory.mktemp("h3_tiny_ckpt")
    model = tiny_model(seed=3)
    model.save_pretrained(folder / "transformer")
    return folder, model


@pytest.mark.parametrize("loader", ["from_pretrained", "safetensors"])
def test_load_model_gives_the_saved_weights_in_their_dtypes(checkpoint, loader, monkeypatch):
    """Both branches: diffusers' from_pretrained (accelerate installed: the test extra has it) and h3plan's
    safetensors read into from_config's model (a machine without accelerate)."""
    import h3plan.actions.inputs as inputs

    if loader == "from_pretrained":
        assert inputs.has_accelerate(), ("the test extra installs accelerate: this case fails without it, it does "
                                         "not skip")
    else:
        monkeypatch.setattr(inputs, "has_accelerate", lambda: False)
    folder, saved = checkpoint
    for path in (folder, folder / "transformer"):
        model = load_model(path, blocks=1)
        assert len(model.transformer_blocks) == 1 and not model.training
        ref = saved.state_dict()
        for k, v in model.state_dict().items():  # the blocks kept, the fp32 heads kept fp32: rtol=0, atol=0
            assert v.dtype == ref[k].dtype and torch.equal(v, ref[k]), k
    assert (model.proj_out.weight.dtype == torch.float32
            and model.transformer_blocks[0].attn.to_q.weight.dtype == torch.bfloat16)


def test_load_model_refuses_a_folder_it_cannot_load(tmp_path):
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps({"_class_name": "MiniMaxH3Transformer3DModel",
                                                                      "num_attention_heads": 4}))
    with pytest.raises(UsageError, match=r"model.path=.*: cannot load a MiniMaxH3Transformer3DModel \("):
        load_model(tmp_path)


@pytest.mark.slow  # verify of a saved checkpoint in the interpreter (~8 s)
def test_verify_on_a_checkpoint_folder(checkpoint, capsys):
    folder, _ = checkpoint
    # model= stays the default (h3): the widths come from the folder
    rc = cli.run(["action=verify", f"model.path={folder}", "verify.device=cpu", "verify.blocks=1",
                  "levers.attention=sdpa"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert (out.startswith("verify: 1 blocks, hidden 96, 4x32 heads; S=48")
            and f"weights from {folder}; input seed 0" in out)
    assert "PASS  modulation=exact" in out and out.rstrip().splitlines()[-1].startswith("verify: PASS")


@pytest.mark.slow  # a whole CPU bench run
def test_bench_on_a_checkpoint_folder(checkpoint, tmp_path, capsys):
    folder, _ = checkpoint
    rc = cli.run(["action=bench", f"model.path={folder}", "vae=h3_tiny", "parallel.seq_len=48", "bench.seq_lens=[48]",
                  "bench.blocks=[1]", "bench.warmup=0", "bench.iters=1", "bench.best=off", "levers.attention=sdpa",
                  f"bench.out_dir={tmp_path}"])
    assert rc == 0, capsys.readouterr().out[-2000:]
    (r,) = json.loads((tmp_path / "block-cpu.json").read_text())["records"]
    assert r["error"] is None and r["bitwise_equal"] is True and r["attention_shape"] == [1, 48, 4, 32]
